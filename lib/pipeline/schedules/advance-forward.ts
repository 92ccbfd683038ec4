/**
 * The per-stage order of advance forward propagation (AFP), of which 1F1B is the case A = 0.
 */
import { checkInteger } from '../schedule.js';
import { limits } from './options.js';

/** One step of a per-stage order: a forward or backward of a micro-batch. @category Pipeline schedules */
export interface Step {
  readonly kind: 'forward' | 'backward';
  readonly microBatch: number;
}

function checkShape(what: string, S: unknown, M: unknown, A: unknown, k: unknown): void {
  checkInteger(`${what}: S (stages)`, S, 1, limits.stages);
  checkInteger(`${what}: M (micro-batches)`, M, 1, limits.microBatches);
  checkInteger(`${what}: A (advance)`, A, 0, Number.MAX_SAFE_INTEGER);
  checkInteger(`${what}: k (stage)`, k, 0, (S as number) - 1);
}

/** Forwards stage k issues before its first backward: `min(M, (S-k) + max(0, A-k))`. @category Pipeline schedules */
export function forwardsBeforeBackward(S: number, M: number, A: number, k: number): number {
  checkShape('forwardsBeforeBackward', S, M, A, k);
  return Math.min(M, S - k + Math.max(0, A - k));
}

/** Stage k's order: F_k forwards, then alternately one backward and one forward, then the remaining backwards. @category Pipeline schedules */
export function advanceForwardOrder(S: number, M: number, A: number, k: number): Step[] {
  const warm = forwardsBeforeBackward(S, M, A, k);
  const steps: Step[] = [];
  let f = 0;
  let b = 0;
  while (f < warm) steps.push({ kind: 'forward', microBatch: f++ });
  while (b < M) {
    steps.push({ kind: 'backward', microBatch: b++ });
    if (f < M) steps.push({ kind: 'forward', microBatch: f++ });
  }
  return steps;
}
