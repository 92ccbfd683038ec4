import { withCommunication } from '../communication.js';
import { type Action, type Schedule, buildSchedule, makeAction } from '../schedule.js';
import { stageOrder } from './advance-forward.js';
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
    for (const step of stageOrder(S, M, 0, k)) {
      const m = step.microBatch;
      if (step.kind === 'forward') {
        read.set(m, version);
        row.push(makeAction('forward', k, k, m, 0, version, -1));
        row.push(makeAction('stashWeights', k, k, m, 0, -1, -1));
      } else {
        row.push(makeAction('restoreWeights', k, k, m, 0, -1, -1));
        row.push(makeAction('backward', k, k, m, 0, read.get(m)!, -1));
        row.push(makeAction('optimizerStep', k, k, m, 0, -1, -1));
        version++;
      }
    }
    actions.push(row);
  }
  return withCommunication(buildSchedule({ name: 'pipedream', stages: S, microBatches: M, actions, params: { S, M } }, false));
}
