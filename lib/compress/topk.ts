/**
 * Top-k sparsification with error feedback (MSTopK, docs/ALGORITHMS.md section 6): the selection
 * a compressed all-reduce sends, the exact top-k it is measured against, and the scatter-add that
 * sums what the ranks sent. The kernels are native/cpu/topk.cpp.
 */
import { AliasingError, InvalidArgumentError, SizeMismatchError } from '../errors.js';
import { callNative, nativeAddon } from '../native.js';
import { FlatBuffer } from '../tensor.js';
import { checkInteger, checkNumber, checkObject, checkOptions, describeValue, optionKeys } from '../validate.js';

/** Options of {@link mstopk}: `density` or `k`, not both. @category Compression */
export interface TopkOptions {
  /** Fraction of the elements to send, in (0, 1]: k = max(1, round(density * length)). */
  density?: number;
  /** Elements to send, exactly. */
  k?: number;
  /**
   * Error feedback: the residual of earlier selections, same length as the gradient. It becomes
   * x = grad + residual, and then x with the sent elements zeroed. Without it, x = grad and
   * nothing unsent is kept.
   */
  residual?: FlatBuffer;
  /** Most sampling passes after the first (each narrows the threshold bracket 8 times). Default 8. */
  rounds?: number;
}
const TOPK_OPTION_KEYS = optionKeys<TopkOptions>({ density: true, k: true, residual: true, rounds: true });

/** What {@link mstopk} selected. @category Compression */
export interface TopkSelection {
  /** Ascending element indices. */
  indices: Int32Array;
  /** x at those indices. */
  values: Float32Array;
  /** Reads of x after the one that formed it (sampling and selection). */
  passes: number;
  /** Elements between the final thresholds, from which the last ones were taken in index order. */
  band: number;
}

function checkBuffer(b: unknown, what: string): FlatBuffer {
  if (!(b instanceof FlatBuffer)) throw new InvalidArgumentError(`${what} must be a FlatBuffer, got ${describeValue(b)}`);
  if (b.disposed) throw new InvalidArgumentError(`${what} was disposed; allocate a new buffer`);
  return b;
}

/**
 * @internal The checks of {@link mstopk}'s arguments, for callers that must refuse bad input
 * before a collective starts (a rank that throws later leaves its peers waiting). `k` is at most
 * the gradient's length.
 */
export function checkTopkArguments(grad: unknown, options: Omit<TopkOptions, 'residual'> & { residual?: unknown }, what: string): { k: number; rounds: number; residual: FlatBuffer | null } {
  checkBuffer(grad, `${what}(grad)`);
  const g = grad as FlatBuffer;
  const { k, rounds } = checkTopkOptions(g.length, options, what);
  const residual = options.residual === undefined ? null : checkBuffer(options.residual, `${what}: residual`);
  if (residual && residual.length !== g.length) throw new SizeMismatchError(`${what}: residual has ${residual.length} elements, grad ${g.length}`);
  if (residual === g) throw new AliasingError(`${what}: grad and residual must be different buffers`);
  return { k, rounds, residual };
}

/**
 * Indices travel as 32-bit integers: a sparse all-reduce takes gradients of at most 2^31 - 1
 * elements, and sends at most 2^30 of them (one JavaScript view of the pack).
 */
const MAX_SPARSE_LENGTH = 2 ** 31 - 1;
const MAX_SPARSE_K = 2 ** 30;

/** @internal Refuses lengths and k the exchange cannot carry. */
export function checkSparseSize(length: number, k: number, what: string): void {
  if (length > MAX_SPARSE_LENGTH)
    throw new InvalidArgumentError(`${what}: the gradient has ${length} elements; a sparse all-reduce takes at most 2^31 - 1 (indices travel as 32-bit integers): split it into buckets`);
  if (k > MAX_SPARSE_K) throw new InvalidArgumentError(`${what}: k = ${k} elements to send; at most 2^30: lower the density`);
}

/** @internal k and rounds from {@link TopkOptions} for a gradient of `length` elements (the residual is the caller's to check). */
export function checkTopkOptions(length: number, options: { density?: number; k?: number; rounds?: number; residual?: unknown }, what: string): { k: number; rounds: number } {
  checkOptions(options, TOPK_OPTION_KEYS, `${what}(grad, options)`);
  if ((options.density === undefined) === (options.k === undefined)) throw new InvalidArgumentError(`${what}: give density or k, one of them`);
  const k =
    options.k !== undefined
      ? checkInteger(options.k, `${what}: k`, 0, length)
      : Math.min(length, Math.max(1, Math.round(checkNumber(options.density, `${what}: density`, 0, 1, { loOpen: true }) * length)));
  const rounds = checkInteger(options.rounds ?? 8, `${what}: rounds`, 0, 64);
  return { k, rounds };
}

/**
 * Selects exactly k elements of `grad` (+ `residual`) by magnitude with MSTopK's multiple
 * sampling, one native pass per sampling round and no sort; with `residual` the unsent part is
 * kept there for the next step (error feedback). A gradient holding NaN/Inf is refused before
 * anything is written.
 *
 * @category Compression
 */
export function mstopk(grad: FlatBuffer, options: TopkOptions): TopkSelection {
  const { k, rounds, residual } = checkTopkArguments(grad, options, 'mstopk');
  const r = callNative(() => nativeAddon().topkSelect(grad.handle, residual?.handle ?? null, k, rounds));
  return { indices: r.indices, values: r.values, passes: r.passes, band: r.band };
}

/** The exact top-k of `x` by magnitude (ties to the lower index), indices ascending: the reference MSTopK is measured against. @category Compression */
export function topkExact(x: FlatBuffer, k: number): { indices: Int32Array; values: Float32Array } {
  checkBuffer(x, 'topkExact(x)');
  checkInteger(k, 'topkExact: k', 0, x.length);
  return callNative(() => nativeAddon().topkExact(x.handle, k));
}

/** out[indices[i]] += scale * values[i]: sums sparse contributions into a dense buffer (all or nothing: every index is checked first). @category Compression */
export function scatterAdd(out: FlatBuffer, selection: { indices: Int32Array; values: Float32Array }, scale = 1): void {
  checkBuffer(out, 'scatterAdd(out)');
  checkObject(selection, 'scatterAdd(selection)');
  checkNumber(scale, 'scatterAdd: scale', -Number.MAX_VALUE, Number.MAX_VALUE);
  callNative(() => nativeAddon().scatterAdd(out.handle, selection.indices, selection.values, scale));
}
