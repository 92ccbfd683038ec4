/**
 * The shape of the native communicator handles (LocalComm, UcxComm) that QueuedCommunicator drives:
 * point-to-point calls, the collective call, and the collective kinds, numbered as
 * native/comm/local/local_group.h numbers them. A leaf module, so that the backends' typed
 * bindings and the communicator base import it without importing each other.
 */
import type { NativeBufferHandle, QueueHandle } from '../native.js';

/** Collective kinds, numbered as native/comm/local/local_group.h numbers them. @category Communication */
export const CollectiveKind = {
  barrier: 0,
  allreduce: 1,
  reduceScatter: 2,
  allgather: 3,
  broadcast: 4,
  reduceScatterInPlace: 5,
  allgatherInPlace: 6,
} as const;

/** collective(queue, kind, input, inOffset, inCount, output, outOffset, outCount, scale, root) of a native handle. @category Communication */
export type CollectiveCall = [
  queue: QueueHandle,
  kind: number,
  input: NativeBufferHandle | null,
  inOffset: number,
  inCount: number,
  output: NativeBufferHandle | null,
  outOffset: number,
  outCount: number,
  scale: number,
  root: number,
];

/** The native side of a queued backend (LocalComm, UcxComm). @category Communication */
export interface QueuedCommHandle {
  send(queue: QueueHandle, buffer: NativeBufferHandle, offset: number, count: number, peer: number): Promise<void>;
  recv(queue: QueueHandle, buffer: NativeBufferHandle, offset: number, count: number, peer: number): Promise<void>;
  destroy(): void;
}

