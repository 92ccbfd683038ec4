import { withCommunication } from '../communication.js';
import { type Action, type Schedule, buildSchedule, makeAction } from '../schedule.js';
import { stageOrder } from './advance-forward.js';
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
    for (const step of stageOrder(S, M, 0, k)) {
      const m = step.microBatch;
      row.push(makeAction('predictWeights', k, k, m, 0, -1, -1));
      row.push(makeAction(step.kind, k, k, m, 0, -1, -1));
      if (step.kind === 'backward') row.push(makeAction('optimizerStep', k, k, m, 0, -1, -1));
    }
    actions.push(row);
  }
  return withCommunication(buildSchedule({ name: 'spectrain', stages: S, microBatches: M, actions, params: { S, M } }, false));
}
