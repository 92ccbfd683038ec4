import { withCommunication } from '../communication.js';
import { type Action, type Schedule, action, createSchedule } from '../schedule.js';
import { advanceForwardOrder } from './advance-forward.js';
import { type ScheduleOptions, checkOptions } from './options.js';

/**
 * SpecTrain: asynchronous 1F1B where both passes read predicted weights, `floor(k/2) + S-k-1`
 * updates ahead for the forward and `floor(k/2)` for the backward; a predict action precedes each.
 *
 * @category Pipeline schedules
 */
export function spectrain(options: ScheduleOptions): Schedule {
  const { S, M } = checkOptions('spectrain', options);
  const actions: Action[][] = [];
  for (let k = 0; k < S; k++) {
    const row: Action[] = [];
    for (const step of advanceForwardOrder(S, M, 0, k)) {
      const m = step.microBatch;
      row.push(action('predictWeights', k, { microBatch: m }));
      row.push(action(step.kind, k, { microBatch: m }));
      if (step.kind === 'backward') row.push(action('optimizerStep', k, { microBatch: m }));
    }
    actions.push(row);
  }
  return withCommunication(createSchedule({ name: 'spectrain', stages: S, microBatches: M, actions, params: { S, M } }));
}
