/**
 * Single-precision matrix multiply on native buffers: C = alpha * op(A) * op(B) + beta * C, all
 * dense row-major. Operands are views at element offsets into FlatBuffers (a ParamSet's weights, an
 * activation buffer), so a layer costs one native call and no copy; or into DeviceBuffers of one
 * device, where the product runs through cuBLAS on the device's current stream (the model
 * operations' table, ops.ts).
 */
import { AliasingError, DisposedError, InvalidArgumentError, SizeMismatchError } from '../errors.js';
import { callNative, nativeAddon } from '../native.js';
import { DeviceBuffer } from '../device/index.js';
import { FlatBuffer } from '../tensor.js';
import type { Tensor } from './ops.js';
import { describeValue } from '../validate.js';

/** @category Models */
export interface GemmOptions {
  /** op(A) = A^T: A is stored k x m. */
  transA?: boolean;
  /** op(B) = B^T: B is stored n x k. */
  transB?: boolean;
  /** Rows of op(A) and C. */
  m: number;
  /** Columns of op(B) and C. */
  n: number;
  /** Columns of op(A), rows of op(B). */
  k: number;
  alpha?: number;
  /** 0 (the default) overwrites C without reading it. */
  beta?: number;
  a: Tensor;
  aOffset?: number;
  b: Tensor;
  bOffset?: number;
  c: Tensor;
  cOffset?: number;
}

const MAX_DIM = 2 ** 31;

function checkDim(value: unknown, name: string): number {
  if (typeof value !== 'number' || !Number.isInteger(value) || value < 0 || value > MAX_DIM)
    throw new InvalidArgumentError(`sgemm: ${name} must be an integer in [0, 2^31], got ${describeValue(value)}`);
  return value;
}

function checkView(buffer: unknown, offset: unknown, elements: number, name: string): number {
  if (!(buffer instanceof FlatBuffer) && !(buffer instanceof DeviceBuffer))
    throw new InvalidArgumentError(`sgemm: ${name} must be a FlatBuffer or a DeviceBuffer`);
  if (buffer.disposed) throw new DisposedError(`sgemm: ${name} was disposed; allocate a new buffer`);
  const at = offset ?? 0;
  if (typeof at !== 'number' || !Number.isInteger(at) || at < 0)
    throw new InvalidArgumentError(`sgemm: ${name}Offset must be a non-negative integer, got ${describeValue(offset)}`);
  if (at + elements > buffer.length)
    throw new SizeMismatchError(
      `sgemm: ${name} needs ${elements} elements from offset ${at}, but its buffer has ${buffer.length}; check m, n, k and the offsets`,
    );
  return at;
}

/** C = alpha * op(A) * op(B) + beta * C: the native blocked kernel over the thread pool on host buffers, cuBLAS on device buffers. @category Models */
export function sgemm(options: GemmOptions): void {
  if (typeof options !== 'object' || options === null) throw new InvalidArgumentError('sgemm: pass an options object { m, n, k, a, b, c, ... }');
  const m = checkDim(options.m, 'm');
  const n = checkDim(options.n, 'n');
  const k = checkDim(options.k, 'k');
  const alpha = options.alpha ?? 1;
  const beta = options.beta ?? 0;
  if (typeof alpha !== 'number' || !Number.isFinite(alpha)) throw new InvalidArgumentError(`sgemm: alpha must be a finite number, got ${describeValue(alpha)}`);
  if (typeof beta !== 'number' || !Number.isFinite(beta)) throw new InvalidArgumentError(`sgemm: beta must be a finite number, got ${describeValue(beta)}`);
  for (const flag of ['transA', 'transB'] as const)
    if (options[flag] !== undefined && typeof options[flag] !== 'boolean') throw new InvalidArgumentError(`sgemm: ${flag} must be a boolean`);
  const aOffset = checkView(options.a, options.aOffset, m * k, 'a');
  const bOffset = checkView(options.b, options.bOffset, k * n, 'b');
  const cOffset = checkView(options.c, options.cOffset, m * n, 'c');
  const overlaps = (buffer: Tensor, offset: number, length: number): boolean =>
    buffer === options.c && length > 0 && m * n > 0 && offset < cOffset + m * n && cOffset < offset + length;
  if (overlaps(options.a, aOffset, m * k) || overlaps(options.b, bOffset, k * n))
    throw new AliasingError('sgemm: C overlaps A or B; write the product into a separate buffer or range');
  const addon = nativeAddon();
  callNative(() =>
    addon.sgemm({
      transA: options.transA ?? false,
      transB: options.transB ?? false,
      m,
      n,
      k,
      alpha,
      beta,
      a: options.a.handle,
      aOffset,
      b: options.b.handle,
      bOffset,
      c: options.c.handle,
      cOffset,
    }),
  );
}
