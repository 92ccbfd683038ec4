/**
 * Plain TypeScript reference for Wavelet's data-parallel form (ALGORITHMS.md section 5),
 * independent of the library: S workers, each with a tick and a tock replica of the whole model,
 * M iterations per wave and round. Worker x's wave w (pipeline 2x + w) takes, for its iteration m,
 * the samples `((2x + w) M + m) b ... + b` of the round. Per iteration t of a round:
 * - tick: the gradient g_tick(t) at the tick weights; what each worker sends to the tick all-reduce
 *   is (g_tick(t) + g_tock(t-1)) / 2, the tock's latest gradient of the round on that worker
 *   (at t = 0 there is none: g_tick(0) alone); the tick step applies the mean over the S workers;
 * - tock: the gradient g_tock(t) at the tock weights (after its step t-1), averaged with the tick's
 *   latest, g_tick(t) (tock's all-reduce of t runs after tick's backward of t); the tock step
 *   applies the mean over the workers.
 * Every worker's replicas of a wave start equal and apply the same mean, so one model per wave
 * stands for all of them. Losses per worker: its tick's M micro-batches, then its tock's.
 */
import type { LayerSpec } from '../../dist/index.js';
import { ReferenceOptimizer, type RefConfig } from './optimizer.js';
import { type RefData, type RefPartWeights, flatten, meanGradientAndLoss, unflatten } from './pipeline.js';

export interface RefWaveletResult {
  tick: RefPartWeights;
  tock: RefPartWeights;
  /** Per round, the runtime's order: worker 0's tick then tock micro-batches, worker 1's, ... */
  losses: number[][];
}

export function referenceWaveletDataParallel(
  layers: readonly LayerSpec[],
  initial: RefPartWeights,
  config: RefConfig,
  data: RefData,
  rounds: readonly (readonly number[])[],
  S: number,
  M: number,
): RefWaveletResult {
  const tick = new ReferenceOptimizer(config, flatten(initial));
  const tock = new ReferenceOptimizer(config, flatten(initial));
  const b = data.batch;
  const losses: number[][] = [];
  for (const samples of rounds) {
    if (samples.length !== 2 * S * M * b) throw new Error(`a round holds 2 S M b = ${2 * S * M * b} samples, got ${samples.length}`);
    const share = (x: number, w: number, m: number): number[] => samples.slice(((2 * x + w) * M + m) * b, ((2 * x + w) * M + m + 1) * b);
    const roundLosses: number[][] = Array.from({ length: S }, () => new Array<number>(2 * M));
    let tockLatest: Float32Array[] | undefined; // per worker, the tock's latest gradient of the round
    for (let t = 0; t < M; t++) {
      const gTick = Array.from({ length: S }, (_, x) => {
        const r = meanGradientAndLoss(layers, unflatten(tick.w, initial), data, share(x, 0, t));
        roundLosses[x]![t] = r.loss;
        return r.grad;
      });
      const gTock = Array.from({ length: S }, (_, x) => {
        const r = meanGradientAndLoss(layers, unflatten(tock.w, initial), data, share(x, 1, t));
        roundLosses[x]![M + t] = r.loss;
        return r.grad;
      });
      // Each worker's contribution in fp32 (as the runtime's buffers), their sum over S applied as the mean.
      const meanOf = (own: Float32Array[], other: Float32Array[] | undefined): Float32Array => {
        const out = new Float32Array(own[0]!.length);
        for (let i = 0; i < out.length; i++) {
          let sum = 0;
          for (let x = 0; x < S; x++) sum += other ? Math.fround(Math.fround(0.5 * own[x]![i]!) + Math.fround(0.5 * other[x]![i]!)) : own[x]![i]!;
          out[i] = sum / S;
        }
        return out;
      };
      tick.step(meanOf(gTick, tockLatest));
      tock.step(meanOf(gTock, gTick));
      tockLatest = gTock;
    }
    losses.push(roundLosses.flat());
  }
  return { tick: unflatten(tick.w, initial), tock: unflatten(tock.w, initial), losses };
}
