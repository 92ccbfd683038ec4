import { withCommunication } from '../communication.js';
import { type Action, type Schedule, buildSchedule, makeAction } from '../schedule.js';
import { type ScheduleOptions, checkOptions } from './options.js';

/**
 * Pipelined Backpropagation (fine-grained, batch size 1): in slot t stage k forwards sample `t-k`
 * (reading linearly predicted weights) and then backwards sample `t-(2S-1-k)`, updating after
 * every backward; the delay is `D_k = 2(S-k)-1`.
 *
 * @category Pipeline schedules
 */
export function pipelinedBackprop(options: ScheduleOptions): Schedule {
  const { S, M } = checkOptions('pipelined-backprop', options);
  const actions: Action[][] = [];
  for (let k = 0; k < S; k++) {
    const row: Action[] = [];
    for (let t = 0; t < M + 2 * S - 1; t++) {
      const f = t - k;
      if (f >= 0 && f < M) {
        row.push(makeAction('predictWeights', k, k, f, 0, -1, -1));
        row.push(makeAction('forward', k, k, f, 0, -1, -1));
      }
      const b = t - (2 * S - 1 - k);
      if (b >= 0 && b < M) {
        row.push(makeAction('backward', k, k, b, 0, -1, -1));
        row.push(makeAction('optimizerStep', k, k, b, 0, -1, -1));
      }
    }
    actions.push(row);
  }
  return withCommunication(buildSchedule({ name: 'pipelined-backprop', stages: S, microBatches: M, actions, params: { S, M } }, false));
}
