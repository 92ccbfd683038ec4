/**
 * The expected outcome of the fused-step fixtures (test/fixtures/comm/rank.ts, ucx-rank.ts): a
 * ParamSet { a: [37, 5], b: [1000], c: [3] } with weights sin(i), SGD with momentum 0.9, lr 0.01,
 * elementwise compensation and sapipe prediction, two steps on the average over n ranks of
 * cos(i (r + 1) + step) (zero on every 16th element), then a step with a NaN that is skipped.
 */
import { ReferenceOptimizer } from '../reference/optimizer.js';

const spec = { a: 185, b: 1000, c: 3 };
const offsets = { a: 0, b: 192, c: 1200 };
export const FUSED_LENGTH = 1216;

/** Elements of the ParamSet's alignment padding, which no tensor owns. */
export function isPadding(i: number): boolean {
  return !Object.entries(spec).some(([k, s]) => i >= offsets[k as keyof typeof offsets] && i < offsets[k as keyof typeof offsets] + s);
}

/** The reference optimizer after the two applied steps on n ranks. */
export function fusedReference(n: number): ReferenceOptimizer {
  const ref = new ReferenceOptimizer(
    { optimizer: 'sgd', lr: 0.01, weightDecay: 0, momentum: 0.9, dampening: 0, nesterov: false, beta1: 0.9, beta2: 0.999, eps: 1e-8, gradScale: 1, compensation: { kind: 'elementwise', lambda: 0.2, eps: 1e-7 }, prediction: { kind: 'shadow', estimate: 'prev-sync', compensate: false, n: 1, localScale: 1 } },
    new Float32Array(FUSED_LENGTH).map((_, i) => Math.sin(i)),
  );
  for (let step = 0; step < 2; step++) {
    const avg = new Float32Array(FUSED_LENGTH);
    for (let i = 0; i < FUSED_LENGTH; i++) {
      let s = 0;
      for (let r = 0; r < n; r++) s = Math.fround(s + Math.fround(Math.cos(i * (r + 1) + step) * (i % 16 < 15 ? 1 : 0)));
      avg[i] = Math.fround(s * Math.fround(1 / n));
    }
    ref.step(avg);
  }
  return ref;
}

/** The worst |got - want| / (1e-6 + 1e-5 |want|) over the tensors' elements: at most 1 passes. */
export function worstRatio(got: ArrayLike<number>, want: ArrayLike<number>): number {
  let worst = 0;
  for (let i = 0; i < FUSED_LENGTH; i++) if (!isPadding(i)) worst = Math.max(worst, Math.abs(got[i]! - want[i]!) / (1e-6 + 1e-5 * Math.abs(want[i]!)));
  return worst;
}
