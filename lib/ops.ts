/**
 * Elementwise kernels on whole FlatBuffers: elastic averaging (AvgPipe) and the reductions that
 * communication and gradient clipping need. Each is one native call, split across the thread pool.
 */
import { AliasingError, InvalidArgumentError, SizeMismatchError } from './errors.js';
import { callNative, nativeAddon } from './native.js';
import { checkNumber } from './validate.js';
import { FlatBuffer } from './tensor.js';

function checkBuffer(b: unknown, what: string): FlatBuffer {
  if (!(b instanceof FlatBuffer)) throw new InvalidArgumentError(`${what} must be a FlatBuffer`);
  return b;
}

function checkSameLength(op: string, a: FlatBuffer, b: FlatBuffer): void {
  if (a.length !== b.length) throw new SizeMismatchError(`${op}: buffers have ${a.length} and ${b.length} elements; they must match`);
}

/**
 * Elastic averaging between a worker's weights and the center copy (ALGORITHMS.md section 5,
 * AvgPipe): d = alpha*(worker - center); worker -= d; center += d. alpha in [0, 1].
 *
 * @category Kernels
 */
export function elasticAverage(worker: FlatBuffer, center: FlatBuffer, alpha: number): void {
  checkBuffer(worker, 'elasticAverage(worker)');
  checkBuffer(center, 'elasticAverage(center)');
  checkSameLength('elasticAverage', worker, center);
  if (worker === center) throw new AliasingError('elasticAverage: worker and center must be different buffers');
  checkNumber(alpha, 'elasticAverage(alpha)', 0, 1);
  callNative(() => nativeAddon().elasticAverage(worker.handle, center.handle, alpha));
}

/** @category Kernels */
export interface SumOptions {
  /** Divide by the number of inputs (an average). Default false. */
  average?: boolean;
  /** Extra multiplier (e.g. a loss-scale unscale). Default 1. */
  scale?: number;
}

/**
 * out = scale * (inputs[0] + ... + inputs[k-1]) (divided by k when averaging). `out` may be
 * inputs[0]. Returns the count of non-finite results: the non-finite guard for free, so a step on
 * the result can pass `gradChecked`.
 *
 * @category Kernels
 */
export function sum(out: FlatBuffer, inputs: readonly FlatBuffer[], options: SumOptions = {}): { nonFiniteCount: number } {
  checkBuffer(out, 'sum(out)');
  if (!Array.isArray(inputs) || inputs.length === 0) throw new InvalidArgumentError('sum(inputs) must be a non-empty array of FlatBuffer');
  inputs.forEach((b, i) => {
    checkBuffer(b, `sum(inputs[${i}])`);
    checkSameLength('sum', out, b);
    if (i > 0 && b === out) throw new AliasingError('sum: only inputs[0] may be the output buffer');
  });
  const scale = checkNumber(options.scale ?? 1, 'sum(options.scale)', -Number.MAX_VALUE, Number.MAX_VALUE);
  const factor = options.average ? scale / inputs.length : scale;
  const nonFiniteCount = callNative(() => nativeAddon().sum(out.handle, inputs.map((b) => b.handle), factor));
  return { nonFiniteCount };
}

/** x *= s. @category Kernels */
export function scale(x: FlatBuffer, s: number): void {
  checkBuffer(x, 'scale(x)');
  checkNumber(s, 'scale(s)', -Number.MAX_VALUE, Number.MAX_VALUE);
  callNative(() => nativeAddon().scale(x.handle, s));
}

/** y += a*x. @category Kernels */
export function axpy(y: FlatBuffer, a: number, x: FlatBuffer): void {
  checkBuffer(y, 'axpy(y)');
  checkBuffer(x, 'axpy(x)');
  checkSameLength('axpy', y, x);
  checkNumber(a, 'axpy(a)', -Number.MAX_VALUE, Number.MAX_VALUE);
  callNative(() => nativeAddon().axpy(y.handle, x.handle, a));
}

/** Sum of squares, accumulated in double (for gradient-norm clipping). @category Kernels */
export function squaredNorm(x: FlatBuffer): number {
  checkBuffer(x, 'squaredNorm(x)');
  return callNative(() => nativeAddon().squaredNorm(x.handle));
}

/** Number of NaN/Inf elements. @category Kernels */
export function countNonFinite(x: FlatBuffer): number {
  checkBuffer(x, 'countNonFinite(x)');
  return callNative(() => nativeAddon().countNonFinite(x.handle));
}

/**
 * Scales x so that its L2 norm is at most maxNorm; returns the norm before clipping.
 *
 * @category Kernels
 */
export function clipByNorm(x: FlatBuffer, maxNorm: number): number {
  checkNumber(maxNorm, 'clipByNorm(maxNorm)', 0, Number.MAX_VALUE, { loOpen: true });
  const norm = Math.sqrt(squaredNorm(x));
  if (norm > maxNorm) scale(x, maxNorm / norm);
  return norm;
}
