import { type Action, type Schedule, action, createSchedule } from '../schedule.js';
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
    const at = { part: 0, pipeline: x };
    for (let t = 0; t < M; t++) {
      row.push(action('forward', x, { ...at, microBatch: t }));
      row.push(action('backward', x, { ...at, microBatch: t }));
      row.push(action('allReduce', x, { part: 0, pipeline: 0, microBatch: t }));
      if (t > 0) {
        row.push(action('optimizerStep', x, { ...at, microBatch: t - 1 }));
        row.push(action('predictWeights', x, { ...at, microBatch: t }));
      }
    }
    row.push(action('optimizerStep', x, { ...at, microBatch: M - 1 }));
    actions.push(row);
  }
  return createSchedule({ name: 'sapipe', stages: S, parts: 1, pipelines: S, microBatches: M, actions, params: { S, M } });
}
