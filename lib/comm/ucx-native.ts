/** The addon's UcxComm class and ucxStatus(), typed (see native/addon/comm_ucx_binding.cpp), and the ucx backend's probe. */
import type { BackendStatus } from '../backends/status.js';
import { nativeAddon, nativeUnavailableReason, type NativeBufferHandle, type QueueHandle } from '../native.js';
import type { CollectiveCall, QueuedCommHandle } from './native-handle.js';

/** @category Communication */
export interface UcxCommHandle extends QueuedCommHandle {
  /** This rank's UCP worker address, to publish through the rendezvous store. */
  address(): Buffer;
  /** Connects to every rank (addresses in rank order, this rank's included); `remote[r]`: rank r is on another machine. */
  connect(queue: QueueHandle, addresses: Buffer[], remote: boolean[]): Promise<void>;
  collective(...call: CollectiveCall): Promise<number>;
  /** A buffer in a shared region that peers on this machine map (native/addon/shared_regions.h). */
  allocate(length: number): NativeBufferHandle;
  /** Collectives so far that read the peers' buffers in shared memory. */
  directRuns(): number;
  /** The liveness signal: peer's operations fail with ERR_PEER_LOST (after a short grace period). */
  peerLost(peer: number, reason: string): void;
}

/** @category Communication */
export interface UcxPluginStatus {
  available: boolean;
  reason?: string;
  pluginPath?: string;
  /** e.g. `UCX 1.13.1`. */
  library?: string;
}

/** @category Communication */
export interface UcxAddon {
  /** `direct`: read peers' shared buffers directly where every rank's buffer is one (else always the ring). */
  UcxComm: new (rank: number, size: number, timeoutMs: number, chunkElements: number, direct: boolean) => UcxCommHandle;
  ucxStatus(): UcxPluginStatus;
}

/**
 * UCX settings for a Node.js process, applied before the plugin (and so UCX) is loaded, where the
 * user has not chosen otherwise:
 * - UCX installs its own SIGSEGV/SIGBUS handlers by default, which take over V8's (WebAssembly
 *   bounds checks raise SIGSEGV on purpose): leave signals to Node.
 * - UCX patches malloc and mmap in the running process to track memory for its registration
 *   cache; other threads of Node call them while the code is being patched. Without the hooks
 *   UCX registers memory per transfer (RDMA) or needs no registration at all (shared memory, TCP).
 * - Its warnings as a group ends after a peer died (unmatched messages and requests of the dead
 *   peer, one line each) say nothing the PeerLostError does not: only errors are shown.
 */
const UCX_DEFAULTS: Record<string, string> = {
  UCX_ERROR_SIGNALS: '',
  UCX_MEM_MALLOC_HOOKS: 'no',
  UCX_MEM_MMAP_HOOK_MODE: 'none',
  UCX_MEM_EVENTS: 'no',
  UCX_LOG_LEVEL: 'error',
};

/** @category Communication */
export function ucxAddon(): UcxAddon {
  for (const [name, value] of Object.entries(UCX_DEFAULTS)) if (process.env[name] === undefined) process.env[name] = value;
  return nativeAddon() as unknown as UcxAddon;
}

/** The UCX plugin's state; never throws. @category Backends */
export function ucxStatus(): UcxPluginStatus {
  const reason = nativeUnavailableReason();
  if (reason !== undefined) return { available: false, reason };
  try {
    const status = ucxAddon().ucxStatus();
    // A checkout whose install found no UCX development files has no plugin: say how to get one.
    if (!status.available && /plugin was not found/.test(status.reason ?? ''))
      return { ...status, reason: `${status.reason}; build it with \`npm run build:native\` once UCX's development files are installed (\`apt-get install libucx-dev\`)` };
    return status;
  } catch (error) {
    return { available: false, reason: `probing UCX failed: ${(error as Error).message}` };
  }
}

/**
 * The ucx communication backend: the plugin sapipe_ucx.so beside the addon (or SAPIPE_UCX_PLUGIN)
 * and the UCX library it links (libucp.so.0). Unavailable with the reason and the fix when either
 * is missing.
 *
 * @category Backends
 */
export function probeUcx(): BackendStatus {
  const s = ucxStatus();
  const details: Record<string, string> = {};
  if (s.pluginPath) details.plugin = s.pluginPath;
  if (s.library) details.library = s.library;
  if (s.available) return { name: 'ucx', kind: 'comm', available: true, details: { ...details, ranks: 'processes (sapipe launch, torchrun, mpirun, Slurm)', algorithms: 'direct (comm.allocate buffers, ranks of one machine), ring' } };
  let reason = s.reason ?? 'unknown';
  if (/libuc[pts]\.so/.test(reason)) reason += ' (the UCX library is not installed: `apt-get install libucx0`, or UCX from your distribution)';
  return { name: 'ucx', kind: 'comm', available: false, reason, ...(Object.keys(details).length ? { details } : {}) };
}
