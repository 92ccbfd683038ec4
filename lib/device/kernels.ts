/**
 * Device kernels that stand on their own, outside DeviceBuffer's and DeviceParamSet's methods:
 * the MSTopK selection and the scatter-add the sparse all-reduce runs on device memory
 * (lib/compress/device-sparse.ts), and the update benchmark. Each runs to completion; arguments
 * are the caller's to check (the addon checks them again).
 */
import { callNative, type NativeUpdateConfig } from '../native.js';
import type { DeviceBuffer } from './buffer.js';
import { cudaAddon, type CudaBenchTiming } from './cuda-native.js';
import { requireCudaDevice } from './probe.js';

/**
 * @internal MSTopK of `grad` (plus `residual`, which keeps what was not selected) into `pack`: k
 * int32 indices (as float bits), then k values.
 */
export function deviceTopkSelect(grad: DeviceBuffer, residual: DeviceBuffer | null, k: number, rounds: number, pack: DeviceBuffer): void {
  callNative(() => cudaAddon().cudaTopkSelect(grad.handle, residual?.handle ?? null, k, rounds, pack.handle));
}

/**
 * @internal out = (zeroFirst ? 0 : out) + scale * the (index, value) pairs of each of `ranks` packs
 * of `width` floats in `all`, in rank order.
 */
export function deviceScatterAdd(out: DeviceBuffer, all: DeviceBuffer, width: number, k: number, ranks: number, scale: number, zeroFirst: boolean): void {
  callNative(() => cudaAddon().cudaScatterAdd(out.handle, all.handle, width, k, ranks, scale, zeroFirst));
}

/** Times one update variant on cuda:index against a device-to-device copy (see native/cuda/bench_update.cu). @category Backends */
export function cudaBenchUpdate(index: number, config: NativeUpdateConfig, elements: number, reps: number, warmup: number): CudaBenchTiming {
  requireCudaDevice(index);
  return callNative(() => cudaAddon().cudaBenchUpdate(index, config, elements, reps, warmup));
}
