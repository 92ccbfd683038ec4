import { type Action, type Schedule, buildSchedule, makeAction } from '../schedule.js';
import { type ScheduleOptions, checkOptions } from './options.js';

/**
 * The SAPipe data-parallel pipeline over S workers (one row each, the whole model as one part,
 * worker x as pipeline x) for M iterations: iteration t computes `g_t` at `w_hat_t` while the
 * all-reduce of `g_{t-1}` is in flight, then applies `A_{t-1}` (compensated) and writes
 * `w_hat_{t+1}`. The first iteration only starts its all-reduce, so every later gradient is one
 * update stale and the first is fresh; a last step applies `A_{M-1}`.
 *
 * @category Pipeline schedules
 */
export function sapipe(options: ScheduleOptions): Schedule {
  const { S, M } = checkOptions('sapipe', options);
  const actions: Action[][] = [];
  for (let x = 0; x < S; x++) {
    const row: Action[] = [];
    for (let t = 0; t < M; t++) {
      row.push(makeAction('forward', x, 0, t, x, -1, -1));
      row.push(makeAction('backward', x, 0, t, x, -1, -1));
      row.push(makeAction('allReduce', x, 0, t, 0, -1, -1));
      if (t > 0) {
        row.push(makeAction('optimizerStep', x, 0, t - 1, x, -1, -1));
        row.push(makeAction('predictWeights', x, 0, t, x, -1, -1));
      }
    }
    row.push(makeAction('optimizerStep', x, 0, M - 1, x, -1, -1));
    actions.push(row);
  }
  return buildSchedule({ name: 'sapipe', stages: S, parts: 1, pipelines: S, microBatches: M, actions, params: { S, M } }, false);
}
