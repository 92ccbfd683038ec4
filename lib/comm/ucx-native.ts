/** The addon's UcxComm class and ucxStatus(), typed (see native/addon/comm_ucx_binding.cpp). */
import { nativeAddon, type NativeBufferHandle, type QueueHandle } from '../native.js';

export interface UcxCommHandle {
  /** This rank's UCP worker address, to publish through the rendezvous store. */
  address(): Buffer;
  /** Connects to every rank (addresses in rank order, this rank's included). */
  connect(queue: QueueHandle, addresses: Buffer[]): Promise<void>;
  collective(
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
  ): Promise<number>;
  send(queue: QueueHandle, buffer: NativeBufferHandle, offset: number, count: number, peer: number): Promise<void>;
  recv(queue: QueueHandle, buffer: NativeBufferHandle, offset: number, count: number, peer: number): Promise<void>;
  /** The liveness signal: peer's operations fail with ERR_PEER_LOST (after a short grace period). */
  peerLost(peer: number, reason: string): void;
  destroy(): void;
}

export interface UcxPluginStatus {
  available: boolean;
  reason?: string;
  pluginPath?: string;
  /** e.g. `UCX 1.13.1`. */
  library?: string;
}

export interface UcxAddon {
  UcxComm: new (rank: number, size: number, timeoutMs: number, chunkElements: number) => UcxCommHandle;
  ucxStatus(): UcxPluginStatus;
}

export function ucxAddon(): UcxAddon {
  return nativeAddon() as unknown as UcxAddon;
}
