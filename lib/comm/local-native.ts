/**
 * The addon's LocalComm class and single-thread copy, typed (see native/addon/comm_local_binding.cpp),
 * and the local backend's probe.
 */
import type { BackendStatus } from '../backends/status.js';
import { nativeAddon, nativeUnavailableReason, type NativeBufferHandle, type NativeUpdateBuffers, type NativeUpdateConfig, type QueueHandle } from '../native.js';
import type { CollectiveCall, QueuedCommHandle } from './native-handle.js';

/** @category Communication */
export interface LocalCommHandle extends QueuedCommHandle {
  ready(queue: QueueHandle): Promise<void>;
  /** The collective, run by the ring algorithm over the local channels when `ring` is set. */
  collective(...call: [...CollectiveCall, ring: boolean]): Promise<number>;
  /** The sharded fused step (kReduceUpdate in native/comm/collective.h); resolves with non-finite sums seen. */
  reduceUpdate(queue: QueueHandle, config: NativeUpdateConfig, buffers: NativeUpdateBuffers, scale: number): Promise<number>;
  /** The replicated fused step's second pass (kUpdateFromParts in native/comm/collective.h). */
  updateFromParts(queue: QueueHandle, config: NativeUpdateConfig, buffers: NativeUpdateBuffers): Promise<number>;
}

/** @category Communication */
export interface CommAddon {
  LocalComm: new (group: string, size: number, rank: number, timeoutMs: number) => LocalCommHandle;
  copySingleThread(dst: NativeBufferHandle, src: NativeBufferHandle): void;
}

/** @category Communication */
export function commAddon(): CommAddon {
  return nativeAddon() as unknown as CommAddon;
}

/** The local communication backend (ranks as worker threads) is compiled into the addon itself. @category Backends */
export function probeLocal(): BackendStatus {
  const reason = nativeUnavailableReason();
  if (reason !== undefined) return { name: 'local', kind: 'comm', available: false, reason };
  return { name: 'local', kind: 'comm', available: true, details: { ranks: 'worker_threads of one process', algorithms: 'direct, ring' } };
}
