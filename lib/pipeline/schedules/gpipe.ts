import { withCommunication } from '../communication.js';
import { type Action, type Schedule, action, createSchedule } from '../schedule.js';
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
    for (let m = 0; m < M; m++) row.push(action('forward', k, { microBatch: m }));
    for (let m = M - 1; m >= 0; m--) row.push(action('backward', k, { microBatch: m }));
    row.push(action('optimizerStep', k));
    actions.push(row);
  }
  return withCommunication(createSchedule({ name: 'gpipe', stages: S, microBatches: M, actions, params: { S, M } }));
}
