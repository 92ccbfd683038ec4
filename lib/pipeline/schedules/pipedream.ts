import { withCommunication } from '../communication.js';
import { type Action, type Schedule, action, createSchedule } from '../schedule.js';
import { advanceForwardOrder } from './advance-forward.js';
import { type ScheduleOptions, checkOptions } from './options.js';

/**
 * PipeDream: asynchronous 1F1B without flush. Stage k takes an optimizer step after every
 * backward; each forward stashes the version it read and its backward restores it, so stage k
 * keeps `S-k` versions and a gradient is `S-k-1` updates stale in steady state.
 *
 * @category Pipeline schedules
 */
export function pipedream(options: ScheduleOptions): Schedule {
  const { S, M } = checkOptions('pipedream', options);
  const actions: Action[][] = [];
  for (let k = 0; k < S; k++) {
    const row: Action[] = [];
    let version = 0;
    const read = new Map<number, number>();
    for (const step of advanceForwardOrder(S, M, 0, k)) {
      const m = step.microBatch;
      if (step.kind === 'forward') {
        read.set(m, version);
        row.push(action('forward', k, { microBatch: m, version }));
        row.push(action('stashWeights', k, { microBatch: m }));
      } else {
        row.push(action('restoreWeights', k, { microBatch: m }));
        row.push(action('backward', k, { microBatch: m, version: read.get(m)! }));
        row.push(action('optimizerStep', k, { microBatch: m }));
        version++;
      }
    }
    actions.push(row);
  }
  return withCommunication(createSchedule({ name: 'pipedream', stages: S, microBatches: M, actions, params: { S, M } }));
}
