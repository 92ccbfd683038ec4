/**
 * The sparse all-reduce of {@link sparseAllreduce} on device memory (the `nccl` backend, the same
 * plan as on the host): the CUDA MSTopK kernel selects each rank's k elements into a device pack of
 * 2k + 1 floats (the indices as their bit patterns, the values, the rank's NaN/Inf count), NCCL
 * all-gathers the packs, and the scatter-add kernel adds them into the gradient rank by rank, scaled
 * by 1/size: the same sum in the same order on every rank. A rank whose gradient holds NaN/Inf
 * sends those elements instead (found on the host: that step is skipped anyway), and every rank
 * that selected puts its selection back into its residual, as on the host.
 */
import { cudaAddon } from '../backends/cuda.js';
import type { Communicator } from '../comm/communicator.js';
import { DeviceBuffer } from '../device.js';
import { AliasingError, InvalidArgumentError, SizeMismatchError } from '../errors.js';
import { callNative } from '../native.js';
import { describeValue } from '../validate.js';
import { checkTopkOptions } from './topk.js';

/** @internal {@link checkTopkArguments} for device buffers: the residual on the gradient's device. */
export function checkDeviceTopkArguments(
  grad: DeviceBuffer,
  options: { density?: number; k?: number; rounds?: number; residual?: unknown },
  what: string,
): { k: number; rounds: number; residual: DeviceBuffer | null } {
  grad.checkLive(`${what}(grad)`);
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
  const width = 2 * k + 1;
  const on = { device: grad.device };
  const bad = grad.countNonFinite();
  const pack = DeviceBuffer.allocate(width, on);
  const all = DeviceBuffer.allocate(width * comm.size, on);
  try {
    const tail = new Float32Array(1);
    if (bad === 0) {
      callNative(() => cudaAddon().cudaTopkSelect(grad.handle, residual?.handle ?? null, k, rounds, pack.handle));
    } else {
      // This rank's NaN/Inf elements where they are (up to k), the rest (0, 0).
      const host = grad.copyToHost();
      const packed = new Float32Array(2 * k);
      const indices = new Int32Array(packed.buffer, 0, k);
      for (let i = 0, j = 0; i < host.length && j < k; i++)
        if (!Number.isFinite(host[i]!)) {
          indices[j] = i;
          packed[k + j++] = host[i]!;
        }
      pack.copyFromHost(packed);
    }
    tail[0] = bad;
    pack.copyFromHost(tail, 2 * k);
    await comm.allgather(pack, all);
    let nonFinite = 0;
    for (let r = 0; r < comm.size; r++) nonFinite += all.copyToHost(tail, r * width + 2 * k)[0]!;
    callNative(() => cudaAddon().cudaScatterAdd(grad.handle, all.handle, width, k, comm.size, 1 / comm.size, true));
    // Nothing will be applied: the ranks that selected keep all of x for a later step.
    if (nonFinite > 0 && bad === 0 && residual) callNative(() => cudaAddon().cudaScatterAdd(residual.handle, pack.handle, width, k, 1, 1, false));
    return { nonFiniteCount: nonFinite, bytes: all.length * 4 };
  } finally {
    pack.dispose();
    all.dispose();
  }
}
