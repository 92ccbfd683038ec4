/**
 * The compressed all-reduce of a gradient: every rank selects its top-k elements with MSTopK
 * (with error feedback through its residual), one all-gather exchanges the k (index, value) pairs
 * of every rank, and every rank scatter-adds them all, in rank order, into its gradient buffer,
 * scaled by 1/size: the same average of sparse contributions on every rank. k is the same on every
 * rank (the same density of the same length), so the exchange has a fixed size: 2k + 1 floats per
 * rank (the indices travel as their bit patterns; the last float is the rank's count of NaN/Inf).
 *
 * All or nothing: a rank whose gradient holds NaN/Inf sends those elements (up to k) instead of a
 * selection, so the average holds them where a dense all-reduce's sum would (and every other
 * element finite, padding included), and every rank's count of them is the same: every rank's
 * non-finite guard skips the step. The rank that holds them selects nothing (its residual stays as
 * it was); the others put what they selected back into their residuals, which then hold their
 * gradient plus the previous residual, to be sent later.
 */
import { Communicator } from '../comm/communicator.js';
import { InvalidArgumentError } from '../errors.js';
import { countNonFinite } from '../ops.js';
import { FlatBuffer } from '../tensor.js';
import { checkOptions, describeValue, optionKeys } from '../validate.js';
import { DeviceBuffer } from '../device.js';
import { checkDeviceTopkArguments, exchangeSparseDevice } from './device-sparse.js';
import { checkTopkArguments, mstopk, scatterAdd } from './topk.js';

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
  const onDevice = comm.backend === 'nccl';
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

/**
 * @internal The exchange of {@link sparseAllreduce}, its arguments checked: `grad` becomes the
 * average over `comm` of every rank's selection of k elements (or, from a rank holding NaN/Inf,
 * those elements). `restore()` puts this rank's selection back into its residual, for when the
 * step will not be applied.
 */
export async function exchangeSparse(
  comm: Communicator,
  grad: FlatBuffer,
  k: number,
  rounds: number,
  residual: FlatBuffer | null,
): Promise<{ nonFiniteCount: number; bytes: number; restore(): void }> {
  const width = 2 * k + 1;
  const bad = countNonFinite(grad);
  const pack = FlatBuffer.allocate(width);
  const all = FlatBuffer.allocate(width * comm.size);
  try {
    pack.array.fill(0);
    let selection: { indices: Int32Array; values: Float32Array } | undefined;
    const indices = new Int32Array(pack.array.buffer, pack.array.byteOffset, k);
    if (bad === 0) {
      selection = mstopk(grad, { k, rounds, ...(residual ? { residual } : {}) });
      indices.set(selection.indices);
      pack.array.set(selection.values, k);
    } else {
      // This rank sends (up to k of) its NaN/Inf elements where they are, so that the average
      // holds them at the same places a dense all-reduce's sum would, and no other element; the
      // rest of the pack is (0, 0), which adds nothing.
      const g = grad.array;
      for (let i = 0, j = 0; i < g.length && j < k; i++)
        if (!Number.isFinite(g[i]!)) {
          indices[j] = i;
          pack.array[k + j++] = g[i]!;
        }
    }
    pack.array[2 * k] = bad;
    await comm.allgather(pack, all);
    let nonFinite = 0;
    for (let r = 0; r < comm.size; r++) nonFinite += all.array[r * width + 2 * k]!;
    grad.array.fill(0);
    const base = all.array.byteOffset;
    for (let r = 0; r < comm.size; r++) {
      const at = base + r * width * 4;
      scatterAdd(grad, { indices: new Int32Array(all.array.buffer, at, k), values: new Float32Array(all.array.buffer, at + k * 4, k) }, 1 / comm.size);
    }
    const kept = selection && residual ? { indices: selection.indices, values: selection.values } : undefined;
    return { nonFiniteCount: nonFinite, bytes: all.length * 4, restore: () => kept && scatterAdd(residual!, kept, 1) };
  } finally {
    pack.dispose();
    all.dispose();
  }
}
