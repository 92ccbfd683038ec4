/**
 * The per-stage order of advance forward propagation (AFP), of which 1F1B is the case A = 0.
 */
import { limits } from './options.js';
import { checkInteger } from '../../validate.js';

/** One step of a per-stage order: a forward or backward of a micro-batch. @category Pipeline schedules */
export interface Step {
  readonly kind: 'forward' | 'backward';
  readonly microBatch: number;
}

function checkShape(what: string, S: unknown, M: unknown, A: unknown, k: unknown): void {
  checkInteger(S, `${what}: S (stages)`, 1, limits.stages);
  checkInteger(M, `${what}: M (micro-batches)`, 1, limits.microBatches);
  checkInteger(A, `${what}: A (advance)`, 0, Number.MAX_SAFE_INTEGER);
  checkInteger(k, `${what}: k (stage)`, 0, (S as number) - 1);
}

/** Forwards stage k issues before its first backward: `min(M, (S-k) + max(0, A-k))`. @category Pipeline schedules */
export function forwardsBeforeBackward(S: number, M: number, A: number, k: number): number {
  checkShape('forwardsBeforeBackward', S, M, A, k);
  return warmupForwards(S, M, A, k);
}

/** Stage k's order: F_k forwards, then alternately one backward and one forward, then the remaining backwards. @category Pipeline schedules */
export function advanceForwardOrder(S: number, M: number, A: number, k: number): Step[] {
  checkShape('advanceForwardOrder', S, M, A, k);
  return stageOrder(S, M, A, k);
}

/** @internal {@link forwardsBeforeBackward} of values the caller has checked (a generator's, the tuner's). */
export function warmupForwards(S: number, M: number, A: number, k: number): number {
  return Math.min(M, S - k + Math.max(0, A - k));
}

/** @internal {@link advanceForwardOrder} of values the caller has checked (a generator's). */
export function stageOrder(S: number, M: number, A: number, k: number): Step[] {
  const warm = warmupForwards(S, M, A, k);
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
