/**
 * The CUDA backend: the plugin `sapipe_cuda.so` beside the addon (or SAPIPE_CUDA_PLUGIN), opened
 * by the addon on first use, and NCCL (libnccl.so.2, SAPIPE_NCCL_PATH first) opened by the plugin.
 * Probes never throw; `requireCudaDevice` turns an unavailable device into BackendUnavailableError
 * with the reason (no plugin built / no driver libcuda.so.1 / no device).
 */
import { BackendUnavailableError, InvalidArgumentError } from '../errors.js';
import { callNative, nativeAddon, nativeUnavailableReason, type NativeBufferHandle, type NativeUpdateConfig, type NativeUpdateResult, type QueueHandle } from '../native.js';
import type { BackendStatus } from './status.js';
import { describeValue } from '../validate.js';

/** @category Backends */
export interface CudaDeviceInfo {
  name?: string;
  computeCapability?: string;
  multiprocessors?: number;
  totalMemory?: number;
  kernelsAvailable?: boolean;
  error?: string;
}

/** @category Backends */
export interface CudaStatus {
  available: boolean;
  reason?: string;
  pluginPath?: string;
  /** What the plugin was compiled for, e.g. `sm_75 sm_80 ... compute_120`. */
  architectures?: string;
  runtimeVersion?: number;
  devices?: CudaDeviceInfo[];
}

/** @category Backends */
export interface NcclStatus {
  available: boolean;
  reason?: string;
  version?: number;
  path?: string;
}

/** fp32 memory on one CUDA device (native/addon/device/cuda_buffer.h). Copies are synchronous. @category Backends */
export interface CudaBufferHandle {
  readonly length: number;
  readonly device: number;
  readonly disposed: boolean;
  copyFromHost(src: Float32Array, offset: number): void;
  copyToHost(dst: Float32Array, offset: number): void;
  copyFromDevice(src: CudaBufferHandle, srcOffset: number, dstOffset: number, count: number): void;
  dispose(): void;
}

/** NativeUpdateBuffers with device buffers. @category Backends */
export interface CudaUpdateBuffers {
  weights: CudaBufferHandle;
  grad: CudaBufferHandle;
  momentum?: CudaBufferHandle | undefined;
  secondMoment?: CudaBufferHandle | undefined;
  backup?: CudaBufferHandle | undefined;
  predicted?: CudaBufferHandle | undefined;
  localGrad?: CudaBufferHandle | undefined;
  prevLocalGrad?: CudaBufferHandle | undefined;
}

/** What a fused NCCL step did (sapipe_nccl_step_result). @category Backends */
export interface NcclStepResult extends NativeUpdateResult {
  /** Skipped only because a sum of the inputs could overflow: the recheck finishes the step. */
  overflowRisk: boolean;
}

/** Collective kinds, numbered as native/comm/nccl/nccl_ops.h numbers them. @category Backends */
export const NcclCollective = { allreduce: 0, reduceScatter: 1, allgather: 2, broadcast: 3, send: 4, recv: 5 } as const;

/** One rank's NCCL communicator (native/addon/device/comm_nccl_binding.cpp). @category Backends */
export interface NcclCommHandle {
  init(queue: QueueHandle, id: Uint8Array): Promise<void>;
  /**
   * arg: 0 sum / 1 avg for reductions, the root for broadcast, the peer for send and recv.
   * Resolves with the non-finite count of a reduction's result (0 for the other kinds).
   */
  collective(
    queue: QueueHandle,
    kind: number,
    a: CudaBufferHandle,
    aOffset: number,
    count: number,
    b: CudaBufferHandle | null,
    bOffset: number,
    arg: number,
  ): Promise<number>;
  fusedUpdate(
    queue: QueueHandle,
    config: NativeUpdateConfig,
    buffers: CudaUpdateBuffers,
    bucketCounts: number[],
    sharded: boolean,
    recheck: boolean,
  ): Promise<NcclStepResult>;
  /** Copies the first `count` floats of host to device (toDevice) or of device to host, in order with the queue's operations. */
  stage(queue: QueueHandle, toDevice: boolean, device: CudaBufferHandle, host: NativeBufferHandle, count: number): Promise<void>;
  destroy(): void;
}

/** What the native side of the CUDA backend needs from the addon. @category Backends */
export interface CudaAddon {
  cudaStatus(): CudaStatus;
  ncclStatus(): NcclStatus;
  /** cuBLAS as the plugin's model operations open it; the same shape as NCCL's status. */
  cublasStatus(): NcclStatus;
  cudaBenchUpdate(device: number, config: NativeUpdateConfig, elements: number, reps: number, warmup: number): CudaBenchTiming;
  CudaBuffer: new (device: number, length: number) => CudaBufferHandle;
  /** The fused update on device buffers, run to completion. */
  cudaUpdate(config: NativeUpdateConfig, buffers: CudaUpdateBuffers): NativeUpdateResult;
  /** Non-finite elements of [offset, offset + count). */
  cudaCountNonFinite(buffer: CudaBufferHandle, offset: number, count: number): number;
  /** MSTopK of grad (+ residual) into pack: k int32 indices (as float bits), then k values; run to completion. */
  cudaTopkSelect(grad: CudaBufferHandle, residual: CudaBufferHandle | null, k: number, rounds: number, pack: CudaBufferHandle): { passes: number; lower: number; upper: number; band: number };
  /** out = (zeroFirst ? 0 : out) + scale * the pairs of each of `ranks` packs of `width` floats in `all`, in rank order. */
  cudaScatterAdd(out: CudaBufferHandle, all: CudaBufferHandle, width: number, k: number, ranks: number, scale: number, zeroFirst: boolean): void;
  NcclComm: new (device: number, size: number, rank: number, timeoutMs: number) => NcclCommHandle;
  ncclUniqueId(): Uint8Array;
}

/** @category Backends */
export interface CudaBenchTiming {
  updateMs: number;
  guardedMs: number;
  copyMs: number;
  bytesPerElement: number;
}

/** @internal The addon's CUDA entries, typed. @category Backends */
export function cudaAddon(): CudaAddon {
  return nativeAddon() as unknown as CudaAddon;
}

/** The CUDA plugin's state; never throws. @category Backends */
export function cudaStatus(): CudaStatus {
  const reason = nativeUnavailableReason();
  if (reason !== undefined) return { available: false, reason };
  try {
    return cudaAddon().cudaStatus();
  } catch (error) {
    return { available: false, reason: `probing CUDA failed: ${(error as Error).message}` };
  }
}

/** @category Backends */
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

/**
 * The status of a library the CUDA plugin opens at run time (`status` asks the addon), as backend
 * `name`: available only where a CUDA device is usable too, since the library serves device buffers.
 */
function probeDeviceLibrary(name: string, kind: BackendStatus['kind'], library: string, status: () => NcclStatus): BackendStatus {
  const reason = nativeUnavailableReason();
  let s: NcclStatus;
  if (reason !== undefined) s = { available: false, reason };
  else {
    try {
      s = status();
    } catch (error) {
      s = { available: false, reason: `probing ${library} failed: ${(error as Error).message}` };
    }
  }
  if (!s.available) return { name, kind, available: false, reason: s.reason ?? 'unknown' };
  const details = { version: s.version ?? 0, library: s.path ?? '' };
  const cuda = cudaStatus();
  if (!cuda.available)
    return { name, kind, available: false, reason: `${library} ${details.version} loaded (${details.library}), but it needs a CUDA device: ${cuda.reason ?? 'unknown'}`, details };
  return { name, kind, available: true, details };
}

/** NCCL: the nccl backend moves device buffers, so NCCL alone, without a usable GPU, is not enough. @category Backends */
export function probeNccl(): BackendStatus {
  return probeDeviceLibrary('nccl', 'comm', 'NCCL', () => cudaAddon().ncclStatus());
}

/**
 * cuBLAS, which the CUDA plugin's model operations open at run time for their matrix products:
 * where it is missing the models cannot run on a GPU (the fused updates and NCCL still can).
 * @category Backends
 */
export function probeCublas(): BackendStatus {
  return probeDeviceLibrary('cublas', 'compute', 'cuBLAS', () => cudaAddon().cublasStatus());
}

/** Parses `cpu` or `cuda:N` (`cuda` alone is `cuda:0`). @category Backends */
export function parseDevice(spec: string): { kind: 'cpu' } | { kind: 'cuda'; index: number } {
  if (spec === 'cpu') return { kind: 'cpu' };
  const m = /^cuda(?::(\d{1,4}))?$/.exec(spec);
  if (!m) throw new InvalidArgumentError(`device must be "cpu" or "cuda:N", not ${describeValue(spec)}`);
  return { kind: 'cuda', index: m[1] === undefined ? 0 : Number(m[1]) };
}

/** Checks that cuda:index can run the kernels; throws BackendUnavailableError saying why not. @category Backends */
export function requireCudaDevice(index: number): void {
  if (!Number.isInteger(index) || index < 0) throw new InvalidArgumentError(`CUDA device index must be a non-negative integer, not ${index}`);
  const s = cudaStatus();
  if (!s.available) throw new BackendUnavailableError(`cuda:${index} is unavailable: ${s.reason ?? 'unknown reason'}`);
  const device = s.devices?.[index];
  if (!device) throw new BackendUnavailableError(`cuda:${index} does not exist: ${s.devices?.length ?? 0} CUDA device(s) visible`);
  if (!device.kernelsAvailable)
    throw new BackendUnavailableError(`cuda:${index} (${device.name ?? '?'}, sm ${device.computeCapability ?? '?'}) cannot run this build's kernels (built for ${s.architectures ?? '?'})`);
}

/** Times one update variant on cuda:index against a device-to-device copy (see native/cuda/bench_update.cu). @category Backends */
export function cudaBenchUpdate(index: number, config: NativeUpdateConfig, elements: number, reps: number, warmup: number): CudaBenchTiming {
  requireCudaDevice(index);
  return callNative(() => cudaAddon().cudaBenchUpdate(index, config, elements, reps, warmup));
}
