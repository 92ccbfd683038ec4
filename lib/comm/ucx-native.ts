/** The addon's UcxComm class and ucxStatus(), typed (see native/addon/comm_ucx_binding.cpp). */
import { nativeAddon, type QueueHandle } from '../native.js';
import type { CollectiveCall, QueuedCommHandle } from './queued.js';

export interface UcxCommHandle extends QueuedCommHandle {
  /** This rank's UCP worker address, to publish through the rendezvous store. */
  address(): Buffer;
  /** Connects to every rank (addresses in rank order, this rank's included); `remote[r]`: rank r is on another machine. */
  connect(queue: QueueHandle, addresses: Buffer[], remote: boolean[]): Promise<void>;
  collective(...call: CollectiveCall): Promise<number>;
  /** The liveness signal: peer's operations fail with ERR_PEER_LOST (after a short grace period). */
  peerLost(peer: number, reason: string): void;
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
  // UCX reads its log level when the plugin loads it. Its warnings as a group ends after a peer
  // died (unmatched messages and requests of the dead peer, one line each) say nothing the
  // PeerLostError does not, so only errors are shown unless the user chose a level.
  process.env.UCX_LOG_LEVEL ??= 'error';
  return nativeAddon() as unknown as UcxAddon;
}
