/**
 * Runs one kernel variant natively and through the reference implementation side by side and
 * reports the worst error, as a ratio to the tolerance (<= 1 passes).
 *
 * Tolerance: |native - reference| <= 1e-6 + 2e-5*|reference| per element of every buffer. The two
 * differ by fp32 rounding only (the reference computes in double, the kernels in fp32 with fused
 * multiply-adds), and that difference stays within this bound over 100 steps.
 */
import { nativeAddon, type NativeBufferHandle, type NativeUpdateBuffers, type NativeUpdateConfig } from '../../dist/native.js';
import { allocateBuffers } from '../../dist/apps/bench/kernel-variants.js';
import { ReferenceOptimizer } from '../reference/optimizer.js';
import { fillNormal, fillUniform, rng, worstError } from '../helpers/random.js';
import { referenceConfig } from './variant-reference.js';

const ATOL = 1e-6;
const RTOL = 2e-5;
const addon = nativeAddon();

export interface Run {
  worst: number;
  where: string;
}

export function runVariant(config: NativeUpdateConfig, size: number, steps: number, seed: number): Run {
  const next = rng(seed);
  const handles: NativeBufferHandle[] = [];
  const buffers: NativeUpdateBuffers = allocateBuffers(config, () => {
    const b = new addon.NativeBuffer(size);
    handles.push(b);
    return b;
  });
  const full = { ...config, gradScale: 0.5, localGradScale: 0.5 };
  fillUniform(buffers.weights.array, next);
  const ref = new ReferenceOptimizer(referenceConfig(full), buffers.weights.array);
  buffers.backup?.array.set(buffers.weights.array);
  let worst = 0;
  let where = '';
  for (let step = 1; step <= steps; step++) {
    fillNormal(buffers.grad.array, next);
    if (buffers.localGrad) fillNormal(buffers.localGrad.array, next);
    const result = addon.update({ ...full, step, momentumIsEmpty: step === 1, havePrevLocal: step > 1 }, buffers);
    if (!result.applied) throw new Error('step unexpectedly skipped');
    ref.step(buffers.grad.array, buffers.localGrad?.array);
    const pairs: [string, NativeBufferHandle | undefined, Float32Array][] = [
      ['weights', buffers.weights, ref.w],
      ['momentum', buffers.momentum, ref.m],
      ['secondMoment', buffers.secondMoment, ref.v],
      ['backup', buffers.backup, ref.backup],
      ['predicted', buffers.predicted, ref.predicted],
      ['prevLocalGrad', buffers.prevLocalGrad, ref.prevLocal],
    ];
    for (const [name, handle, expected] of pairs) {
      if (!handle) continue;
      const e = worstError(handle.array, expected, ATOL, RTOL);
      if (e.ratio > worst) {
        worst = e.ratio;
        where = `${name}[${e.index}] at step ${step}: ${handle.array[e.index]} vs ${expected[e.index]}`;
      }
    }
  }
  for (const h of handles) h.dispose();
  return { worst, where };
}

