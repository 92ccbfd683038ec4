import { withCommunication } from '../communication.js';
import { type Action, type Schedule, buildSchedule, makeAction } from '../schedule.js';
import { stageOrder } from './advance-forward.js';
import { type ScheduleOptions, checkOptions } from './options.js';

/**
 * PipeOptim: asynchronous 1F1B as PipeDream, but each forward reads weights predicted `S-k-1`
 * updates ahead (a predict action before it) instead of a stash, and the backward reads the
 * current weights. Two versions per stage (`w`, `w_hat`); staleness `S-k-1` in steady state,
 * which the prediction compensates.
 *
 * @category Pipeline schedules
 */
export function pipeoptim(options: ScheduleOptions): Schedule {
  const { S, M } = checkOptions('pipeoptim', options);
  const actions: Action[][] = [];
  for (let k = 0; k < S; k++) {
    const row: Action[] = [];
    for (const step of stageOrder(S, M, 0, k)) {
      const m = step.microBatch;
      if (step.kind === 'forward') {
        row.push(makeAction('predictWeights', k, k, m, 0, -1, -1));
        row.push(makeAction('forward', k, k, m, 0, -1, -1));
      } else {
        row.push(makeAction('backward', k, k, m, 0, -1, -1));
        row.push(makeAction('optimizerStep', k, k, m, 0, -1, -1));
      }
    }
    actions.push(row);
  }
  return withCommunication(buildSchedule({ name: 'pipeoptim', stages: S, microBatches: M, actions, params: { S, M } }, false));
}
