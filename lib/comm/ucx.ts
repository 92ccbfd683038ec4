/**
 * The `ucx` backend: ranks are processes, on one machine or many, and UCX moves the bytes over
 * whatever it finds (shared memory, TCP, RDMA; `UCX_TLS` narrows the choice). The transport is the
 * plugin sapipe_ucx.so, opened on first use; collectives are the chunked, pipelined ring
 * reduce-scatter + all-gather of native/comm/ring.cpp with the SIMD sum kernel, or, for buffers
 * from {@link QueuedCommunicator.allocate} on ranks of one machine, direct reads of the peers'
 * buffers in shared memory (native/comm/direct.cpp), as fast as the local backend.
 *
 * Start-up: each rank creates its UCP worker, publishes the worker's address in the rendezvous
 * store (rank 0 serves it, at MASTER_ADDR:MASTER_PORT), reads every other rank's, and connects.
 * What is read is untrusted: an address reaches UCX only once its envelope names the rank of its
 * key and this world size, its lengths hold, and its UCX header byte (which carries UCX's address
 * format version) is this worker's own; anything else is a RendezvousError naming the key (UCX
 * would abort the process on it).
 * Each pair of ranks also keeps a TCP connection open (./liveness.ts): a rank that dies, even by
 * SIGKILL, closes it, and every pending and later operation of its peers rejects with
 * PeerLostError instead of waiting for the timeout. (UCX watches peers on other machines too; on
 * one machine only the mesh does, so that UCX can use shared memory: see include/sapipe/comm.h.)
 *
 * Each rank calls `UcxCommunicator.create()` (rank and size from the environment `sapipe launch`,
 * torchrun, mpirun or Slurm set) or `UcxCommunicator.create({ store })` with an open rendezvous.
 */
import { hostname } from 'node:os';

import { BackendUnavailableError, InternalError, InvalidArgumentError, RendezvousError } from '../errors.js';
import { awaitNative, callNative } from '../native.js';
import { checkLength, FlatBuffer } from '../tensor.js';
import { DEFAULT_COMM_TIMEOUT_MS } from './communicator.js';
import { checkEmulation, type NetworkEmulation } from './emulation.js';
import { LivenessMesh } from './liveness.js';
import { CollectiveKind } from './native-handle.js';
import { QueuedCommunicator } from './queued.js';
import { fromEnv } from './rendezvous/env.js';
import { createRendezvous, Rendezvous } from './rendezvous/rendezvous.js';
import { EnvelopeKind, openEnvelope, sealEnvelope } from './rendezvous/validate.js';
import { ucxAddon, type UcxCommHandle } from './ucx-native.js';
import { checkOptions, describeValue, optionKeys } from '../validate.js';

/** Bytes per message of the ring's pipeline: large enough for UCX's zero-copy protocols, small enough to stay in cache while reduced. @category Communication */
export const DEFAULT_UCX_CHUNK_BYTES = 512 * 1024;

/** @category Communication */
export interface UcxCommunicatorOptions {
  /** This rank (default: from the environment, or the store's rank). */
  rank?: number;
  /** Ranks in the group (default: from the environment, or the store's world size). */
  size?: number;
  /**
   * An open rendezvous to swap addresses through (it stays open; close it after destroy()).
   * Default: one joined from the environment (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, ...),
   * owned by the communicator and closed by destroy().
   */
  store?: Rendezvous;
  /** Bound of every wait for peers, in ms (default 30 000). */
  timeoutMs?: number;
  /** Delay collectives as links of this speed would (EMULATED network; see emulation.ts). */
  emulate?: NetworkEmulation;
  /** Bytes per pipelined message of the ring (default SAPIPE_UCX_CHUNK_BYTES, else 512 KiB). */
  chunkBytes?: number;
  /**
   * `direct` (default): a collective whose buffers all come from allocate(), on ranks of one
   * machine, reads the peers' buffers in shared memory; other collectives run the ring. `ring`:
   * every collective runs the ring (to compare the two, or to test the ring on one machine).
   */
  algorithm?: 'direct' | 'ring';
}

// Communicators created on one store, in this process: the ranks create theirs in the same order,
// so the count names a fresh key space for each.
const generations = new WeakMap<Rendezvous, number>();

function positiveInteger(value: unknown, what: string, min = 1): number {
  if (typeof value !== 'number' || !Number.isInteger(value) || value < min)
    throw new InvalidArgumentError(`UcxCommunicator: ${what} must be an integer of at least ${min}, got ${describeValue(value)}`);
  return value;
}

/**
 * What ranks compare to tell which peers share this machine (and so shared memory): the host name,
 * or SAPIPE_UCX_HOST where that is wrong, e.g. containers of one host with their own host names but
 * one IPC namespace (set the same value in each), or ranks that must not share memory (different
 * values: they then talk as if on different machines).
 */
function machineIdentity(): string {
  const override = process.env.SAPIPE_UCX_HOST;
  return override !== undefined && override !== '' ? override : hostname();
}

/**
 * Bounds of a packed UCP worker address, this rank's and its peers' alike: a header byte and an
 * 8-byte worker id come first, then a few dozen bytes per transport and device; tens of devices
 * stay far below the upper bound.
 */
const MIN_UCX_ADDRESS_BYTES = 9;
const MAX_UCX_ADDRESS_BYTES = 64 * 1024;
/** Longest machine identity (a host name, or SAPIPE_UCX_HOST) in an address record. */
const MAX_HOST_BYTES = 1024;

/** What a rank publishes under `<prefix>/address/<rank>`, inside its envelope: host length (u16), host, UCX address. */
function encodeAddress(host: Buffer, address: Buffer): Buffer {
  const head = Buffer.allocUnsafe(2);
  head.writeUInt16BE(host.length, 0);
  return Buffer.concat([head, host, address]);
}

/**
 * The machine identity and UCX address `peer` published under `key`, once they can safely reach
 * ucp_ep_create: UCX asserts (SIGABRT) on an address it cannot unpack, so a value that is not
 * what a rank of this job published must stop here, as a RendezvousError naming the key.
 */
function decodeAddress(key: string, value: Buffer, peer: number, size: number, own: Buffer): { host: Buffer; address: Buffer } {
  const payload = openEnvelope(key, value, {
    kind: EnvelopeKind.UcxAddress,
    rank: peer,
    worldSize: size,
    minPayloadBytes: 2 + MIN_UCX_ADDRESS_BYTES,
    maxPayloadBytes: 2 + MAX_HOST_BYTES + MAX_UCX_ADDRESS_BYTES,
  });
  const bad = (why: string): RendezvousError =>
    new RendezvousError(`the value of '${key}' in the rendezvous store is not a UCX worker address of rank ${peer}: ${why}`, { reason: 'malformed' });
  const hostBytes = payload.readUInt16BE(0);
  if (hostBytes > MAX_HOST_BYTES) throw bad(`a machine name of ${hostBytes} bytes (at most ${MAX_HOST_BYTES})`);
  const address = payload.subarray(2 + hostBytes);
  if (2 + hostBytes > payload.length || address.length < MIN_UCX_ADDRESS_BYTES || address.length > MAX_UCX_ADDRESS_BYTES)
    throw bad(`a UCX address of ${Math.max(payload.length - 2 - hostBytes, 0)} bytes, outside [${MIN_UCX_ADDRESS_BYTES}, ${MAX_UCX_ADDRESS_BYTES}]`);
  // Every rank of a job runs the same UCX, so every packed address starts with the same header
  // byte (UCX's address format version and flags); UCX asserts on a version it does not expect.
  if (address[0] !== own[0])
    throw bad(
      `its UCX address header is 0x${address[0]!.toString(16).padStart(2, '0')}, this rank's UCX writes 0x${own[0]!.toString(16).padStart(2, '0')} ` +
        '(do all ranks run the same UCX, with the same UCX_* settings?)',
    );
  return { host: payload.subarray(2, 2 + hostBytes), address };
}

function chunkBytesOf(option: unknown): number {
  if (option !== undefined) return positiveInteger(option, 'options.chunkBytes', 64);
  const env = process.env.SAPIPE_UCX_CHUNK_BYTES;
  if (env === undefined || env === '') return DEFAULT_UCX_CHUNK_BYTES;
  if (!/^\d+$/.test(env) || Number(env) < 64) throw new InvalidArgumentError(`SAPIPE_UCX_CHUNK_BYTES must be a byte count of at least 64, got '${env}'`);
  return Number(env);
}

const UCX_OPTION_KEYS = optionKeys<UcxCommunicatorOptions>({ rank: true, size: true, store: true, timeoutMs: true, emulate: true, chunkBytes: true, algorithm: true });

/**
 * The `ucx` backend: ranks are processes, on one machine or many (`sapipe launch`, torchrun,
 * mpirun, Slurm), over UCX; buffers from `allocate()` lie in shared memory that ranks of one
 * machine read directly. Needs UCX and the UCX plugin (`npm run build:native`).
 *
 * @category Communication
 */
export class UcxCommunicator extends QueuedCommunicator {
  readonly backend = 'ucx' as const;
  private mesh: LivenessMesh | undefined;
  /** Every peer runs on this machine (set once connected). */
  private oneMachine = false;

  private constructor(
    rank: number,
    size: number,
    emulation: NetworkEmulation | undefined,
    protected readonly handle: UcxCommHandle,
    private readonly ownedStore: Rendezvous | undefined,
    timeoutMs: number,
  ) {
    super(rank, size, emulation);
    this.operationTimeoutMs = timeoutMs;
  }

  /** Joins the group; resolves once every rank is connected (or rejects: TimeoutError, PeerLostError, BackendUnavailableError). */
  static async create(options: UcxCommunicatorOptions = {}): Promise<UcxCommunicator> {
    checkOptions(options, UCX_OPTION_KEYS, 'UcxCommunicator.create(options)');
    const timeoutMs = positiveInteger(options.timeoutMs ?? DEFAULT_COMM_TIMEOUT_MS, 'options.timeoutMs');
    const emulation = checkEmulation(options.emulate);
    const chunkBytes = chunkBytesOf(options.chunkBytes);
    if (options.algorithm !== undefined && options.algorithm !== 'direct' && options.algorithm !== 'ring')
      throw new InvalidArgumentError(`UcxCommunicator: options.algorithm must be 'direct' or 'ring', got ${describeValue(options.algorithm)}`);
    if (options.store !== undefined && !(options.store instanceof Rendezvous))
      throw new InvalidArgumentError('UcxCommunicator: options.store must be a Rendezvous (from createRendezvous)');
    const env = options.store === undefined ? fromEnv() : undefined;
    const rank = options.rank ?? options.store?.rank ?? env!.rank;
    const size = options.size ?? options.store?.worldSize ?? env!.worldSize;
    positiveInteger(size, 'options.size');
    if (size > 4096) throw new InvalidArgumentError(`UcxCommunicator: options.size must be at most 4096, got ${size}`);
    positiveInteger(rank, 'options.rank', 0);
    if (rank >= size) throw new InvalidArgumentError(`UcxCommunicator: options.rank must be in [0, ${size}), got ${rank}`);
    const source = options.store ?? env!;
    if (source.rank !== rank || source.worldSize !== size)
      throw new InvalidArgumentError(`UcxCommunicator: rank ${rank} of ${size} disagrees with the rendezvous (rank ${source.rank} of ${source.worldSize})`);

    // Loading the plugin first: a machine without UCX fails here, before touching the store.
    const addon = ucxAddon();
    const status = callNative(() => addon.ucxStatus());
    if (!status.available) throw new BackendUnavailableError(`the ucx backend is unavailable: ${status.reason ?? 'unknown reason'}`);

    // The store before the UCP worker: the worker listens on ephemeral TCP ports, and one of them
    // could be the master port that rank 0 is about to bind (the launcher only picked a free one).
    // Every rank joins the store once rank 0 serves it, so no worker exists before the port is taken.
    let store = options.store;
    let owned: Rendezvous | undefined;
    if (store === undefined) {
      owned = await createRendezvous({ ...env!, timeoutMs });
      store = owned;
    }
    let handle: UcxCommHandle;
    try {
      handle = callNative(() => new addon.UcxComm(rank, size, timeoutMs, Math.floor(chunkBytes / 4), options.algorithm !== 'ring'));
    } catch (error) {
      void owned?.close().catch(() => {});
      throw error;
    }
    const comm = new UcxCommunicator(rank, size, emulation, handle, owned, timeoutMs);
    try {
      const generation = generations.get(store) ?? 0;
      generations.set(store, generation + 1);
      const prefix = `sapipe/ucx/${generation}`;
      const masterAddr = env?.addr ?? process.env.MASTER_ADDR;
      if (size > 1)
        comm.mesh = await LivenessMesh.join(store, prefix, rank, size, masterAddr, timeoutMs, (peer, reason) => handle.peerLost(peer, reason));
      // The address, after the machine's name: peers on this machine are watched by the liveness
      // mesh alone, so that UCX may use shared memory between them (see include/sapipe/comm.h).
      const host = Buffer.from(machineIdentity());
      const own = handle.address();
      if (host.length > MAX_HOST_BYTES)
        throw new InvalidArgumentError(`UcxCommunicator: the machine identity (SAPIPE_UCX_HOST or the host name) is ${host.length} bytes, at most ${MAX_HOST_BYTES}`);
      if (own.length < MIN_UCX_ADDRESS_BYTES || own.length > MAX_UCX_ADDRESS_BYTES)
        throw new InternalError(`UcxCommunicator: this worker's UCX address is ${own.length} bytes, outside the [${MIN_UCX_ADDRESS_BYTES}, ${MAX_UCX_ADDRESS_BYTES}] its peers accept`);
      // Once: a value some other client set first under this rank's key fails here, and nothing
      // can replace this one afterwards.
      await store.setOnce(`${prefix}/address/${rank}`, sealEnvelope(EnvelopeKind.UcxAddress, rank, size, encodeAddress(host, own)), { timeoutMs });
      const addresses: Buffer[] = [];
      const remote: boolean[] = [];
      for (let peer = 0; peer < size; peer++) {
        const key = `${prefix}/address/${peer}`;
        const entry = peer === rank ? { host, address: own } : decodeAddress(key, await store.get(key, { timeoutMs }), peer, size, own);
        remote.push(!entry.host.equals(host));
        addresses.push(entry.address);
      }
      // Every rank has published its address, so every rank is connected to the store: an owned
      // store takes no one else, and lets go of the port for the next job or communicator on it.
      owned?.server?.stopListening();
      await awaitNative(handle.connect(comm.collectives.handle, addresses, remote));
      comm.oneMachine = !remote.includes(true);
    } catch (error) {
      comm.destroy();
      throw error;
    }
    return comm;
  }

  /**
   * Collectives so far that read the peers' buffers in shared memory instead of moving the bytes
   * in messages: a way to check that a model allocated with `{ memory: comm }` gets the fast path.
   */
  get sharedMemoryCollectives(): number {
    return this.handle.directRuns();
  }

  /** @internal Every peer on this machine and no emulation: UCX moves the bytes through memory. */
  override get memorySpeedLinks(): boolean {
    return this.oneMachine && !this.emulation;
  }

  protected override allocateBuffer(length: number): FlatBuffer {
    checkLength(length, 'UcxCommunicator.allocate(length)');
    return FlatBuffer.wrap(callNative(() => this.handle.allocate(length)));
  }

  protected runDestroy(): void {
    this.handle.destroy();
    this.mesh?.close();
    // The owned store: rank 0 serves it, and waits (bounded) for the others to disconnect first.
    void this.ownedStore?.close().catch(() => {});
  }

  protected collective(kind: number, input: FlatBuffer | null, offset: number, count: number, output: FlatBuffer | null, scale = 1, root = 0): Promise<number> {
    return awaitNative(
      callNative(() => this.handle.collective(this.collectives.handle, kind, input?.handle ?? null, offset, count, output?.handle ?? null, 0, output?.length ?? 0, scale, root)),
    );
  }
}
