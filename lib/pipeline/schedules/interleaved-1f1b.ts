import { InvalidArgumentError } from '../../errors.js';
import { withCommunication } from '../communication.js';
import { type Action, type Schedule, buildSchedule, makeAction } from '../schedule.js';
import { type ScheduleOptions, checkOptions, checkUnits, limits } from './options.js';
import { checkInteger } from '../../validate.js';

/**
 * Interleaved 1F1B (Megatron-LM): each stage holds V model chunks; chunk c of stage d is model
 * part `c*S + d`. Micro-batches go through the chunks in groups of S, which is why M must be a
 * multiple of S. Stage d warms up with `(S-d-1)*2 + (V-1)*S` forwards, then alternates, then drains.
 *
 * @category Pipeline schedules
 */
export function interleaved1F1B(options: ScheduleOptions): Schedule {
  const { S, M } = checkOptions('interleaved-1f1b', options);
  const V = checkInteger(options.virtualStages ?? 2, 'interleaved-1f1b: virtualStages', 1, limits.virtualStages);
  checkUnits('interleaved-1f1b', S, M, { virtualStages: V });
  if (M % S !== 0) {
    throw new InvalidArgumentError(`interleaved-1f1b: microBatches (${M}) must be a multiple of stages (${S}); try ${Math.ceil(M / S) * S}`);
  }
  const total = M * V;
  const unitAt = (i: number, backward: boolean): { part: number; microBatch: number } => {
    const group = Math.floor(i / S);
    const chunk = backward ? V - 1 - (group % V) : group % V;
    return { part: chunk, microBatch: Math.floor(i / (S * V)) * S + (i % S) };
  };
  const actions: Action[][] = [];
  for (let d = 0; d < S; d++) {
    const warm = Math.min(total, V === 1 ? S - d - 1 : (S - d - 1) * 2 + (V - 1) * S);
    const row: Action[] = [];
    const fwd = (i: number): void => {
      const u = unitAt(i, false);
      row.push(makeAction('forward', d, u.part * S + d, u.microBatch, 0, -1, -1));
    };
    const bwd = (i: number): void => {
      const u = unitAt(i, true);
      row.push(makeAction('backward', d, u.part * S + d, u.microBatch, 0, -1, -1));
    };
    for (let i = 0; i < warm; i++) fwd(i);
    for (let r = 0; r < total - warm; r++) {
      fwd(warm + r);
      bwd(r);
    }
    for (let r = total - warm; r < total; r++) bwd(r);
    for (let c = 0; c < V; c++) row.push(makeAction('optimizerStep', d, c * S + d, -1, 0, -1, -1));
    actions.push(row);
  }
  return withCommunication(
    buildSchedule({ name: 'interleaved-1f1b', stages: S, parts: S * V, microBatches: M, actions, params: { S, M, V } }, false),
  );
}
