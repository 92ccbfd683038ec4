/**
 * The sparse all-reduce of {@link sparseAllreduce} on device memory (the `nccl` backend, the same
 * plan as on the host): the CUDA MSTopK kernel selects each rank's k elements into a device pack of
 * 2k + 3 floats (the indices as their bit patterns, the values, the rank's NaN/Inf count, its k and
 * length as integers), NCCL
 * all-gathers the packs, and the scatter-add kernel adds them into the gradient rank by rank, scaled
 * by 1/size: the same sum in the same order on every rank. A rank whose gradient holds NaN/Inf
 * sends those elements instead (found on the host: that step is skipped anyway), and every rank
 * that selected puts its selection back into its residual, as on the host.
 */
import type { Communicator } from '../comm/communicator.js';
import { DeviceBuffer, deviceScatterAdd, deviceTopkSelect } from '../device/index.js';
import { AliasingError, InvalidArgumentError, SizeMismatchError } from '../errors.js';
import { describeValue } from '../validate.js';
import { checkSparseSize, checkTopkOptions } from './topk.js';

/** @internal {@link checkTopkArguments} for device buffers: the residual on the gradient's device. */
export function checkDeviceTopkArguments(
  grad: DeviceBuffer,
  options: { density?: number; k?: number; rounds?: number; residual?: unknown },
  what: string,
): { k: number; rounds: number; residual: DeviceBuffer | null } {
  grad.checkLive(`${what}(grad)`);
  if (grad.length > 2 ** 31 - 1) throw new SizeMismatchError(`${what}: the GPU selection indexes with int32; the gradient has ${grad.length} elements (at most 2^31 - 1)`);
  const { k, rounds } = checkTopkOptions(grad.length, options, what);
  const r = options.residual;
  if (r === undefined) return { k, rounds, residual: null };
  if (!(r instanceof DeviceBuffer)) throw new InvalidArgumentError(`${what}: the residual of a DeviceBuffer gradient must be a DeviceBuffer, got ${describeValue(r)}`);
  r.checkLive(`${what}: residual`);
  if (r.length !== grad.length) throw new SizeMismatchError(`${what}: residual has ${r.length} elements, grad ${grad.length}`);
  if (r.deviceIndex !== grad.deviceIndex) throw new InvalidArgumentError(`${what}: the residual is on ${r.device}, the gradient on ${grad.device}`);
  if (r === grad) throw new AliasingError(`${what}: grad and residual must be different buffers`);
  return { k, rounds, residual: r };
}

/**
 * @internal The exchange on device buffers, its arguments checked: `grad` becomes the average of
 * every rank's selection. When any rank held NaN/Inf, the selection is put back into the residual
 * before returning (nothing will be applied).
 */
export async function exchangeSparseDevice(
  comm: Communicator<DeviceBuffer>,
  grad: DeviceBuffer,
  k: number,
  rounds: number,
  residual: DeviceBuffer | null,
): Promise<{ nonFiniteCount: number; bytes: number }> {
  checkSparseSize(grad.length, k, 'sparseAllreduce');
  // After the k indices and k values: the NaN/Inf count, then k and the length as 32-bit integers,
  // so that ranks that disagree on either all fail before their gradient is written.
  const width = 2 * k + 3;
  const on = { device: grad.device };
  const bad = grad.countNonFinite();
  let pack: DeviceBuffer | undefined;
  let all: DeviceBuffer | undefined;
  let residualBefore: DeviceBuffer | undefined;
  try {
    pack = DeviceBuffer.allocate(width, on);
    all = DeviceBuffer.allocate(width * comm.size, on);
    const [p, a] = [pack, all];
    const tail = new Float32Array(3);
    if (bad === 0) {
      if (residual) {
        // The selection writes the residual before the exchange tells whether the ranks agree: a
        // device copy (cheap next to the selection) puts it back exactly if they do not.
        residualBefore = DeviceBuffer.allocate(residual.length, on);
        residualBefore.copyFrom(residual);
      }
      deviceTopkSelect(grad, residual, k, rounds, p);
    } else {
      // This rank's NaN/Inf elements where they are (up to k). The rest of the pack repeats the
      // first of them: a scatter-add's indices must be distinct, and a repeated non-finite pair
      // can only write a non-finite value where one belongs.
      const host = grad.copyToHost();
      const packed = new Float32Array(2 * k);
      const indices = new Int32Array(packed.buffer, 0, k);
      let j = 0;
      for (let i = 0; i < host.length && j < k; i++)
        if (!Number.isFinite(host[i]!)) {
          indices[j] = i;
          packed[k + j++] = host[i]!;
        }
      for (; j < k; j++) {
        indices[j] = indices[0]!;
        packed[k + j] = packed[k]!;
      }
      p.copyFromHost(packed);
    }
    tail[0] = bad;
    new Int32Array(tail.buffer).set([k, grad.length], 1); // the all-gather copies bits: integers arrive exact
    p.copyFromHost(tail, 2 * k);
    try {
      await comm.allgather(p, a);
    } catch (error) {
      // Ranks whose k differ fail in the exchange itself (its sizes differ).
      if (residual && residualBefore) residual.copyFrom(residualBefore);
      throw error;
    }
    let nonFinite = 0;
    const mismatched: string[] = [];
    for (let r = 0; r < comm.size; r++) {
      nonFinite += a.copyToHost(tail, r * width + 2 * k)[0]!;
      const [, theirK, length] = new Int32Array(tail.buffer);
      if (theirK !== k || length !== grad.length) mismatched.push(`rank ${r}: ${length} elements, k ${theirK}`);
    }
    if (mismatched.length > 0) {
      if (residual && residualBefore) residual.copyFrom(residualBefore);
      throw new SizeMismatchError(
        `sparseAllreduce: every rank must pass a gradient of the same length with the same density; this rank (${comm.rank}) has ${grad.length} elements, k ${k}; ${mismatched.join('; ')}. Nothing was written`,
      );
    }
    deviceScatterAdd(grad, a, width, k, comm.size, 1 / comm.size, true);
    // Nothing will be applied: the ranks that selected keep all of x for a later step.
    if (nonFinite > 0 && bad === 0 && residual) deviceScatterAdd(residual, p, width, k, 1, 1, false);
    return { nonFiniteCount: nonFinite, bytes: a.length * 4 };
  } finally {
    // Each on its own: a buffer a failed collective still holds (ERR_BUSY) must not hide the
    // error that ended the exchange, nor keep the other from being freed.
    for (const b of [pack, all, residualBefore])
      try {
        b?.dispose();
      } catch {
        // freed with its communicator
      }
  }
}
