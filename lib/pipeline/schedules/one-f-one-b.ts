import { withCommunication } from '../communication.js';
import { type Action, type Schedule, buildSchedule, makeAction } from '../schedule.js';
import { stageOrder } from './advance-forward.js';
import { type ScheduleOptions, checkOptions } from './options.js';

/**
 * 1F1B with flush (PipeDream-Flush): stage k runs `min(M, S-k)` forwards, then alternates one
 * backward and one forward, drains the backwards, and takes one synchronous optimizer step.
 * Peak stored activations at stage k: `min(M, S-k)`.
 *
 * @category Pipeline schedules
 */
export function oneFOneB(options: ScheduleOptions): Schedule {
  const { S, M } = checkOptions('1f1b', options);
  const actions: Action[][] = [];
  for (let k = 0; k < S; k++) {
    const row = stageOrder(S, M, 0, k).map((step) => makeAction(step.kind, k, k, step.microBatch, 0, -1, -1));
    row.push(makeAction('optimizerStep', k, k, -1, 0, -1, -1));
    actions.push(row);
  }
  return withCommunication(buildSchedule({ name: '1f1b', stages: S, microBatches: M, actions, params: { S, M } }, false));
}
