import { withCommunication } from '../communication.js';
import { type Action, type Schedule, buildSchedule, makeAction } from '../schedule.js';
import { type ScheduleOptions, checkOptions } from './options.js';

/**
 * GPipe: every stage runs all M forwards, then all backwards in reverse order, then one
 * synchronous optimizer step (the flush). Bubble fraction `(S-1)/(M+S-1)`; every stage stores
 * all M activations.
 *
 * @category Pipeline schedules
 */
export function gpipe(options: ScheduleOptions): Schedule {
  const { S, M } = checkOptions('gpipe', options);
  const actions: Action[][] = [];
  for (let k = 0; k < S; k++) {
    const row: Action[] = [];
    for (let m = 0; m < M; m++) row.push(makeAction('forward', k, k, m, 0, -1, -1));
    for (let m = M - 1; m >= 0; m--) row.push(makeAction('backward', k, k, m, 0, -1, -1));
    row.push(makeAction('optimizerStep', k, k, -1, 0, -1, -1));
    actions.push(row);
  }
  return withCommunication(buildSchedule({ name: 'gpipe', stages: S, microBatches: M, actions, params: { S, M } }, false));
}
