/**
 * The addon's CUDA entries, typed: the plugin `sapipe_cuda.so` (CUDA 13) or `sapipe_cuda11.so`
 * (CUDA 11.8) beside the addon, whichever can run here (or SAPIPE_CUDA_PLUGIN), opened by the
 * addon on first use, and the libraries the plugin opens at run
 * time (NCCL: libnccl.so.2, SAPIPE_NCCL_PATH first; cuBLAS). Every device facility of lib/device
 * (and the nccl communicator in lib/comm) reaches the plugin through `cudaAddon()`; see
 * native/addon/device/cuda_buffer.h and native/addon/device/comm_nccl_binding.cpp for the other side.
 */
import { nativeAddon, type NativeBufferHandle, type NativeUpdateConfig, type NativeUpdateResult, type QueueHandle } from '../native.js';

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
  /**
   * Why this plugin file was taken: which of the candidates (`sapipe_cuda.so` for CUDA 13,
   * `sapipe_cuda11.so` for CUDA 11.8, or the files in `SAPIPE_CUDA_PLUGIN`) could run here, and
   * why the others were passed over.
   */
  pluginChoice?: string;
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
  /** enqueueOnly, or a current stream (CudaStream.run): enqueued on the device's current stream (else its default stream) and not waited for. */
  copyFromDevice(src: CudaBufferHandle, srcOffset: number, dstOffset: number, count: number, enqueueOnly?: boolean): void;
  dispose(): void;
}

/** Events on one CUDA device, recorded on its default stream (native/addon/device/cuda_events.h). @category Backends */
export interface CudaEventsHandle {
  readonly count: number;
  record(index: number): void;
  dispose(): void;
}

/** A stream of its own on one CUDA device (native/addon/device/cuda_stream.h). @category Backends */
export interface CudaStreamHandle {
  readonly device: number;
  /** fn() with this stream current on its device (restored after, also on a throw); fn's result. */
  run<T>(fn: () => T): T;
  synchronize(): void;
  /** Whether everything enqueued has run; never blocks. */
  query(): boolean;
  record(events: CudaEventsHandle, index: number): void;
  wait(events: CudaEventsHandle, index: number): void;
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
    /** One event per bucket, each recorded once that bucket's gradient was enqueued: each bucket's reduction waits for its event on the GPU (replicated only). */
    ready?: CudaEventsHandle | null,
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
  CudaEvents: new (device: number, count: number) => CudaEventsHandle;
  CudaStream: new (device: number) => CudaStreamHandle;
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
