/**
 * The compressed all-reduce of a gradient: every rank selects its top-k elements with MSTopK
 * (with error feedback through its residual), one all-gather exchanges the k (index, value) pairs
 * of every rank, and every rank scatter-adds them all, in rank order, into its gradient buffer,
 * scaled by 1/size: the same average of sparse contributions on every rank. k is the same on every
 * rank (the same density of the same length), so the exchange has a fixed size: 2k + 3 floats per
 * rank (the indices travel as their bit patterns; then the rank's count of NaN/Inf, and its k and
 * length as integers, which every rank checks before writing anything).
 *
 * All or nothing: a rank whose gradient holds NaN/Inf sends those elements (up to k) instead of a
 * selection, so the average holds them where a dense all-reduce's sum would (and every other
 * element finite, padding included), and every rank's count of them is the same: every rank's
 * non-finite guard skips the step. The rank that holds them selects nothing (its residual stays as
 * it was); the others put what they selected back into their residuals, which then hold their
 * gradient plus the previous residual, to be sent later.
 */
import { Communicator } from '../comm/communicator.js';
import { commBackendEntry } from '../comm/registry.js';
import { BackendUnavailableError, InvalidArgumentError, SizeMismatchError } from '../errors.js';
import { axpy, countNonFinite } from '../ops.js';
import { FlatBuffer, MAX_VIEW_LENGTH } from '../tensor.js';
import { checkOptions, describeValue, optionKeys } from '../validate.js';
import { DeviceBuffer } from '../device/index.js';
import { checkDeviceTopkArguments, exchangeSparseDevice } from './device-sparse.js';
import { checkSparseSize, checkTopkArguments, mstopk, scatterAdd } from './topk.js';

/** Options of {@link sparseAllreduce}. @category Compression */
export interface SparseAllreduceOptions {
  /** Fraction of the elements each rank sends, in (0, 1]. */
  density: number;
  /** Error feedback: this rank's residual (same length and kind as the gradient, zero at the start). */
  residual?: FlatBuffer | DeviceBuffer;
  /** MSTopK's most sampling passes (default 8). */
  rounds?: number;
}
/** @internal The keys of {@link SparseAllreduceOptions}, for every sparse all-reduce. */
export const SPARSE_OPTION_KEYS = optionKeys<SparseAllreduceOptions>({ density: true, residual: true, rounds: true });

/** What {@link sparseAllreduce} did. @category Compression */
export interface SparseAllreduceResult {
  /** NaN/Inf elements over every rank's gradient (the step is to be skipped when not 0). */
  nonFiniteCount: number;
  /** Elements each rank sent. */
  k: number;
  /** Bytes this rank received (every rank's pairs). */
  bytes: number;
}

/**
 * Replaces `grad` on every rank with the average over the ranks of their top-k selections (see
 * the file comment). Every rank calls it with the same density and gradient length. On the
 * `nccl` backend the gradient (and residual) are DeviceBuffers: the selection and the scatter-add
 * run on the GPU (lib/compress/device-sparse.ts), the exchange is NCCL's all-gather.
 *
 * @category Compression
 */
export async function sparseAllreduce(comm: Communicator | Communicator<DeviceBuffer>, grad: FlatBuffer | DeviceBuffer, options: SparseAllreduceOptions): Promise<SparseAllreduceResult> {
  if (!(comm instanceof Communicator)) throw new InvalidArgumentError(`sparseAllreduce(comm) must be a Communicator, got ${describeValue(comm)}`);
  checkOptions(options, SPARSE_OPTION_KEYS, 'sparseAllreduce(comm, grad, options)');
  // Everything is checked before the exchange: a rank that threw after it started would leave its
  // peers waiting for it until their timeout.
  const backend = commBackendEntry(comm.backend, 'sparseAllreduce(comm)');
  if (!backend.capabilities.sparseCollectives) throw new BackendUnavailableError(`sparseAllreduce: the ${comm.backend} backend has no sparse all-reduce`);
  const onDevice = backend.memory === 'device';
  if (onDevice !== grad instanceof DeviceBuffer)
    throw new InvalidArgumentError(`sparseAllreduce: the ${comm.backend} backend exchanges ${onDevice ? 'DeviceBuffers' : 'FlatBuffers'}, got ${describeValue(grad)}`);
  if (grad instanceof DeviceBuffer) {
    const d = checkDeviceTopkArguments(grad, options, 'sparseAllreduce');
    const device = (comm as Communicator<DeviceBuffer> & { device?: string }).device;
    if (grad.device !== device) throw new InvalidArgumentError(`sparseAllreduce: the gradient is on ${grad.device}, the communicator on ${String(device)}`);
    comm.checkLive('sparseAllreduce');
    const r = await exchangeSparseDevice(comm as Communicator<DeviceBuffer>, grad, d.k, d.rounds, d.residual);
    return { nonFiniteCount: r.nonFiniteCount, k: d.k, bytes: r.bytes };
  }
  const { k, rounds, residual } = checkTopkArguments(grad, options, 'sparseAllreduce');
  comm.checkLive('sparseAllreduce');
  const r = await exchangeSparse(comm as Communicator, grad, k, rounds, residual);
  // Nothing will be applied: the ranks that selected keep all of x for a later step.
  if (r.nonFiniteCount > 0) r.restore();
  return { nonFiniteCount: r.nonFiniteCount, k, bytes: r.bytes };
}

/** Floats after the k indices and k values of a rank's pack: its NaN/Inf count, then its k and its length as 32-bit integers. */
const HEADER = 3;

/**
 * @internal The exchange of {@link sparseAllreduce}, its arguments checked: `grad` becomes the
 * average over `comm` of every rank's selection of k elements (or, from a rank holding NaN/Inf,
 * those elements). `restore()` puts this rank's selection back into its residual, for when the
 * step will not be applied.
 *
 * Every rank's pack carries its k and gradient length: ranks that disagree (a gradient of 1000
 * elements on one, 1001 on another, the same k) all throw SizeMismatchError after the exchange and
 * before the gradient is written. Each rank's residual then gets its gradient taken out again
 * (it holds what it held, up to the rounding of one add and one subtract).
 */
export async function exchangeSparse(
  comm: Communicator,
  grad: FlatBuffer,
  k: number,
  rounds: number,
  residual: FlatBuffer | null,
): Promise<{ nonFiniteCount: number; bytes: number; restore(): void }> {
  checkSparseSize(grad.length, k, 'sparseAllreduce');
  const width = 2 * k + HEADER;
  const bad = countNonFinite(grad);
  const pack = FlatBuffer.allocate(width);
  const all = FlatBuffer.allocate(width * comm.size);
  try {
    const packIndices = asInt32(pack.view(0, k));
    const packValues = pack.view(k, k);
    let selection: { indices: Int32Array; values: Float32Array } | undefined;
    if (bad === 0) {
      selection = mstopk(grad, { k, rounds, ...(residual ? { residual } : {}) });
      packIndices.set(selection.indices);
      packValues.set(selection.values);
    } else {
      // This rank sends (up to k of) its NaN/Inf elements where they are, so that the average
      // holds them at the same places a dense all-reduce's sum would, and no other element; the
      // rest of the pack is (0, 0), which adds nothing.
      let j = 0;
      forEachView(grad, (g, at) => {
        for (let i = 0; i < g.length && j < k; i++)
          if (!Number.isFinite(g[i]!)) {
            packIndices[j] = at + i;
            packValues[j++] = g[i]!;
          }
        return j < k;
      });
    }
    const header = pack.view(2 * k, HEADER);
    header[0] = bad;
    asInt32(header).set([k, grad.length], 1); // the all-gather copies bits: integers arrive exact
    // Ranks whose k differ fail in the exchange itself (its sizes differ), with the residual written.
    const undo = (): void => {
      if (selection && residual) {
        scatterAdd(residual, selection, 1);
        axpy(residual, -1, grad);
      }
    };
    try {
      await comm.allgather(pack, all);
    } catch (error) {
      undo();
      if (error instanceof SizeMismatchError)
        throw new SizeMismatchError(`sparseAllreduce: the ranks send different numbers of elements (k ${k} here): every rank must pass a gradient of the same length with the same density. Nothing was written`, { cause: error });
      throw error;
    }
    let nonFinite = 0;
    const mismatched: string[] = [];
    for (let r = 0; r < comm.size; r++) {
      const h = all.view(r * width + 2 * k, HEADER);
      nonFinite += h[0]!;
      const [, theirK, length] = asInt32(h);
      if (theirK !== k || length !== grad.length) mismatched.push(`rank ${r}: ${length} elements, k ${theirK}`);
    }
    if (mismatched.length > 0) {
      undo();
      throw new SizeMismatchError(
        `sparseAllreduce: every rank must pass a gradient of the same length with the same density; this rank (${comm.rank}) has ${grad.length} elements, k ${k}; ${mismatched.join('; ')}. Nothing was written`,
      );
    }
    grad.fill(0);
    for (let r = 0; r < comm.size; r++) {
      const at = r * width;
      scatterAdd(grad, { indices: asInt32(all.view(at, k)), values: all.view(at + k, k) }, 1 / comm.size);
    }
    const kept = selection && residual ? { indices: selection.indices, values: selection.values } : undefined;
    return { nonFiniteCount: nonFinite, bytes: all.length * 4, restore: () => kept && scatterAdd(residual!, kept, 1) };
  } finally {
    pack.dispose();
    all.dispose();
  }
}

/** The same memory as 32-bit integers: indices travel as their bit patterns. */
function asInt32(view: Float32Array): Int32Array {
  return new Int32Array(view.buffer, view.byteOffset, view.length);
}

/** Calls `visit` on consecutive views of `buffer` (each at most one JavaScript view long) while it returns true. */
function forEachView(buffer: FlatBuffer, visit: (view: Float32Array, offset: number) => boolean): void {
  for (let at = 0; at < buffer.length; at += MAX_VIEW_LENGTH) {
    if (!visit(buffer.view(at, Math.min(MAX_VIEW_LENGTH, buffer.length - at)), at)) return;
  }
}
