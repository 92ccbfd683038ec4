import { withCommunication } from '../communication.js';
import { type Action, type Schedule, buildSchedule, makeAction } from '../schedule.js';
import { type ScheduleOptions, checkOptions, checkUnits, limits } from './options.js';
import { checkInteger } from '../../validate.js';

/**
 * PipeDream-2BW: 1F1B without flush across batches of M micro-batches; gradients accumulate over
 * a batch and each stage steps once per batch. Batch b's micro-batches all read version `b-1`
 * (double buffering: the new version and the shadow), so every gradient is exactly one update
 * stale after the first batch. Micro-batches are numbered globally: batch b holds
 * `b*M ... b*M+M-1`; the schedule has `M * iterations` of them.
 *
 * @category Pipeline schedules
 */
export function pipedream2BW(options: ScheduleOptions): Schedule {
  const { S, M } = checkOptions('pipedream-2bw', options);
  const I = checkInteger(options.iterations ?? 3, 'pipedream-2bw: iterations', 1, limits.iterations);
  checkUnits('pipedream-2bw', S, M, { iterations: I });
  const T = M * I;
  const batchOf = (g: number): number => Math.floor(g / M);
  const actions: Action[][] = [];
  for (let k = 0; k < S; k++) {
    const row: Action[] = [];
    const inFlight = S - k;
    let f = 0;
    let b = 0;
    let updates = 0;
    // a forward may only read a version this stage already has: version b-1 needs b-1 updates
    const canForward = (): boolean => f < T && f - b < inFlight && updates >= batchOf(f) - 1;
    const forward = (): void => {
      row.push(makeAction('forward', k, k, f, 0, Math.max(0, batchOf(f) - 1), -1));
      f++;
    };
    while (canForward()) forward();
    while (b < T) {
      row.push(makeAction('backward', k, k, b, 0, Math.max(0, batchOf(b) - 1), -1));
      b++;
      if (b % M === 0) {
        row.push(makeAction('optimizerStep', k, k, b - 1, 0, -1, -1));
        updates++;
      }
      if (canForward()) forward();
    }
    actions.push(row);
  }
  return withCommunication(
    buildSchedule({ name: 'pipedream-2bw', stages: S, microBatches: T, actions, params: { S, M, iterations: I } }, false),
  );
}
