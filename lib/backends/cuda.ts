/**
 * The CUDA backend: the plugin `sapipe_cuda.so` beside the addon (or SAPIPE_CUDA_PLUGIN), opened
 * by the addon on first use, and NCCL (libnccl.so.2, SAPIPE_NCCL_PATH first) opened by the plugin.
 * Probes never throw; `requireCudaDevice` turns an unavailable device into BackendUnavailableError
 * with the reason (no plugin built / no driver libcuda.so.1 / no device).
 */
import { BackendUnavailableError, InvalidArgumentError } from '../errors.js';
import { callNative, nativeAddon, nativeUnavailableReason, type NativeUpdateConfig } from '../native.js';
import type { BackendStatus } from './status.js';

export interface CudaDeviceInfo {
  name?: string;
  computeCapability?: string;
  multiprocessors?: number;
  totalMemory?: number;
  kernelsAvailable?: boolean;
  error?: string;
}

export interface CudaStatus {
  available: boolean;
  reason?: string;
  pluginPath?: string;
  /** What the plugin was compiled for, e.g. `sm_75 sm_80 ... compute_120`. */
  architectures?: string;
  runtimeVersion?: number;
  devices?: CudaDeviceInfo[];
}

export interface NcclStatus {
  available: boolean;
  reason?: string;
  version?: number;
  path?: string;
}

/** What the native side of the CUDA backend needs from the addon. */
export interface CudaAddon {
  cudaStatus(): CudaStatus;
  ncclStatus(): NcclStatus;
  cudaBenchUpdate(device: number, config: NativeUpdateConfig, elements: number, reps: number, warmup: number): CudaBenchTiming;
}

export interface CudaBenchTiming {
  updateMs: number;
  guardedMs: number;
  copyMs: number;
  bytesPerElement: number;
}

function cudaAddon(): CudaAddon {
  return nativeAddon() as unknown as CudaAddon;
}

/** The CUDA plugin's state; never throws. */
export function cudaStatus(): CudaStatus {
  const reason = nativeUnavailableReason();
  if (reason !== undefined) return { available: false, reason };
  try {
    return cudaAddon().cudaStatus();
  } catch (error) {
    return { available: false, reason: `probing CUDA failed: ${(error as Error).message}` };
  }
}

export function probeCuda(): BackendStatus {
  const s = cudaStatus();
  const details: Record<string, string | number | boolean> = {};
  if (s.pluginPath) details.plugin = s.pluginPath;
  if (s.architectures) details.architectures = s.architectures;
  if (s.runtimeVersion) details.runtime = s.runtimeVersion;
  s.devices?.forEach((d, i) => {
    details[`cuda:${i}`] = d.error ?? `${d.name ?? '?'} (sm ${d.computeCapability ?? '?'}${d.kernelsAvailable ? '' : ', no code for it'})`;
  });
  return {
    name: 'cuda',
    kind: 'compute',
    available: s.available,
    ...(s.available ? {} : { reason: s.reason ?? 'unknown' }),
    ...(Object.keys(details).length ? { details } : {}),
  };
}

export function probeNccl(): BackendStatus {
  const reason = nativeUnavailableReason();
  let s: NcclStatus;
  if (reason !== undefined) s = { available: false, reason };
  else {
    try {
      s = cudaAddon().ncclStatus();
    } catch (error) {
      s = { available: false, reason: `probing NCCL failed: ${(error as Error).message}` };
    }
  }
  return {
    name: 'nccl',
    kind: 'comm',
    available: s.available,
    ...(s.available ? { details: { version: s.version ?? 0, library: s.path ?? '' } } : { reason: s.reason ?? 'unknown' }),
  };
}

/** Parses `cpu` or `cuda:N` (`cuda` alone is `cuda:0`). */
export function parseDevice(spec: string): { kind: 'cpu' } | { kind: 'cuda'; index: number } {
  if (spec === 'cpu') return { kind: 'cpu' };
  const m = /^cuda(?::(\d{1,4}))?$/.exec(spec);
  if (!m) throw new InvalidArgumentError(`device must be "cpu" or "cuda:N", not ${JSON.stringify(spec)}`);
  return { kind: 'cuda', index: m[1] === undefined ? 0 : Number(m[1]) };
}

/** Checks that cuda:index can run the kernels; throws BackendUnavailableError saying why not. */
export function requireCudaDevice(index: number): void {
  if (!Number.isInteger(index) || index < 0) throw new InvalidArgumentError(`CUDA device index must be a non-negative integer, not ${index}`);
  const s = cudaStatus();
  if (!s.available) throw new BackendUnavailableError(`cuda:${index} is unavailable: ${s.reason ?? 'unknown reason'}`);
  const device = s.devices?.[index];
  if (!device) throw new BackendUnavailableError(`cuda:${index} does not exist: ${s.devices?.length ?? 0} CUDA device(s) visible`);
  if (!device.kernelsAvailable)
    throw new BackendUnavailableError(`cuda:${index} (${device.name ?? '?'}, sm ${device.computeCapability ?? '?'}) cannot run this build's kernels (built for ${s.architectures ?? '?'})`);
}

/** Times one update variant on cuda:index against a device-to-device copy (see native/cuda/bench_update.cu). */
export function cudaBenchUpdate(index: number, config: NativeUpdateConfig, elements: number, reps: number, warmup: number): CudaBenchTiming {
  requireCudaDevice(index);
  return callNative(() => cudaAddon().cudaBenchUpdate(index, config, elements, reps, warmup));
}
