/**
 * Every communication backend, described once: how a rank creates its communicator (in process, as
 * a rank thread; from a launched job's environment; from a group of an open rendezvous store),
 * where the buffers it moves live, what it can do, its probe and what to install for it. The
 * backend list (`backendStatuses`), the selection (`selectCommBackend`, `installHint`),
 * `createCommunicator`, `createHostGroups` and the pipeline's stage processes read the entries
 * instead of naming a class or comparing names.
 *
 * Adding a communication backend: its class (and its native typing and probe, as ./ucx-native.ts
 * holds ucx's), its name in ./backend-names.ts, one entry in COMM_BACKEND_ENTRIES (with the
 * options its creation takes in CreateCommunicatorOptions) and its export in ./index.ts.
 * docs/DESIGN.md lists the files.
 */
import type { BackendStatus } from '../backends/status.js';
import { probeNccl, type CudaDevice, type DeviceBuffer } from '../device/index.js';
import { InvalidArgumentError } from '../errors.js';
import type { FlatBuffer } from '../tensor.js';
import { describeValue } from '../validate.js';
import { COMM_BACKENDS, type CommBackendName } from './backend-names.js';
import type { Communicator } from './communicator.js';
import { LocalCommunicator, type LocalCommunicatorOptions, type LocalRankData } from './local.js';
import { probeLocal } from './local-native.js';
import { NcclCommunicator, type NcclCommunicatorOptions } from './nccl.js';
import { fromEnv } from './rendezvous/env.js';
import type { Rendezvous } from './rendezvous/rendezvous.js';
import { UcxCommunicator, type UcxCommunicatorOptions } from './ucx.js';
import { probeUcx } from './ucx-native.js';

/**
 * Options passed on to the backend's create() by createCommunicator; the rank and world come from
 * where this rank runs. Each backend takes its own (an entry's creation picks them).
 *
 * @category Communication
 */
export type CreateCommunicatorOptions = Omit<LocalCommunicatorOptions, 'group' | 'rank' | 'size'> &
  Omit<UcxCommunicatorOptions, 'rank' | 'size'> &
  Partial<Omit<NcclCommunicatorOptions, 'rank' | 'size'>>;

/** @internal Where a rank thread started by spawnLocalRanks or runLocalRanks runs: its group, rank and size. */
export type LocalRankPlace = LocalRankData['sapipeLocal'];

/** @internal Options of a communicator joined on a group of an open rendezvous. */
export interface JoinStoreOptions {
  /** Every wait's limit (the backend's default when absent). */
  timeoutMs?: number;
  /** This rank's device, for backends whose buffers live on one (`cuda:N`). */
  device?: CudaDevice;
}

/** @internal What a communication backend can do, beside the collectives every backend runs. */
export interface CommCapabilities {
  /** Point-to-point send and recv (the pipeline's transfers between stages). */
  readonly sendRecv: boolean;
  /** The sparse all-reduce (sparseAllreduce, compressed gradient exchange). */
  readonly sparseCollectives: boolean;
  /** Ranks are processes, on one machine or many (else threads of one process). */
  readonly multiProcess: boolean;
  /**
   * Each send waits for its receiver on its own (a queue per peer and direction), holding up none
   * of the rank's other operations, so a send may be posted ahead of receives that come before it
   * in a pipeline row. False where operations run in one order (NCCL's stream).
   */
  readonly independentSends: boolean;
}

/** @internal A communicator of any backend: host buffers or device buffers. */
export type AnyCommunicator = Communicator<FlatBuffer> | Communicator<DeviceBuffer>;

/** @internal What the rest of sapipe asks about a communication backend; `C` is its communicator. */
export interface CommBackendEntry<C extends AnyCommunicator = AnyCommunicator> {
  /** The class, for messages (`UcxCommunicator`). */
  readonly className: string;
  /**
   * Where the buffers it moves live: `host` (FlatBuffer) or `device` (DeviceBuffer on the rank's
   * GPU). `auto` picks among host backends only, since the caller's buffers are host memory.
   */
  readonly memory: 'host' | 'device';
  readonly capabilities: CommCapabilities;
  /**
   * Compiled into the addon itself: a list of statuses that has none of its own (one described by
   * hand) counts it as available exactly when the cpu backend is.
   */
  readonly builtIn: boolean;
  /** Its place in `auto`'s order, lowest first; undefined: chosen only by name. */
  readonly autoRank: number | undefined;
  /** What a user installs to make it available, one sentence. */
  readonly installHint: string;
  /** Whether it can run here, and why not; never throws. */
  probe(): BackendStatus;
  /** Threads of one process (capabilities.multiProcess false): joins the group of this rank thread. */
  inProcess?(place: LocalRankPlace, options: CreateCommunicatorOptions): Promise<C>;
  /** Processes: joins the job the launcher's environment (RANK, WORLD_SIZE, MASTER_ADDR, ...) describes. */
  launched?(options: CreateCommunicatorOptions): Promise<C>;
  /** Processes: joins a group of an open rendezvous (`store.group(name, rank, size)`); the store stays open. */
  joinStore?(store: Rendezvous, options: JoinStoreOptions): Promise<C>;
}

const local: CommBackendEntry<LocalCommunicator> = {
  className: 'LocalCommunicator',
  memory: 'host',
  capabilities: { sendRecv: true, sparseCollectives: true, multiProcess: false, independentSends: true },
  builtIn: true,
  autoRank: 2,
  installHint: 'the in-process transport is part of the addon: make the addon load (see the cpu backend)',
  probe: probeLocal,
  inProcess: (place, options) => LocalCommunicator.create({ ...(options as Omit<LocalCommunicatorOptions, 'group' | 'rank' | 'size'>), ...place }),
};

const ucx: CommBackendEntry<UcxCommunicator> = {
  className: 'UcxCommunicator',
  memory: 'host',
  capabilities: { sendRecv: true, sparseCollectives: true, multiProcess: true, independentSends: true },
  builtIn: false,
  autoRank: 1,
  installHint:
    'install UCX (libucp.so.0: `apt-get install libucx-dev` on Debian/Ubuntu, or UCX from your distribution) and build the UCX plugin with `npm run build:native`; ranks are processes started by `sapipe launch` (or torchrun, mpirun, Slurm)',
  probe: probeUcx,
  launched: (options) => UcxCommunicator.create(options as UcxCommunicatorOptions),
  joinStore: (store, options) => UcxCommunicator.create({ store, ...(options.timeoutMs === undefined ? {} : { timeoutMs: options.timeoutMs }) }),
};

const nccl: CommBackendEntry<NcclCommunicator> = {
  className: 'NcclCommunicator',
  memory: 'device',
  capabilities: { sendRecv: true, sparseCollectives: true, multiProcess: true, independentSends: false },
  builtIn: false,
  autoRank: undefined,
  installHint:
    'it needs the cuda backend (an NVIDIA GPU, its driver and the CUDA plugin) and NCCL 2.10 or newer (libnccl.so.2: the libnccl2 package or the nvidia-nccl-cu12 wheel; SAPIPE_NCCL_PATH names its folder); it moves DeviceBuffers, so `auto` never picks it for host buffers',
  probe: probeNccl,
  launched: (options) => {
    const env = fromEnv(process.env);
    const { device, ...rest } = options as Partial<NcclCommunicatorOptions>;
    return NcclCommunicator.create({ ...rest, rank: env.rank, size: env.worldSize, device: device ?? `cuda:${env.localRank}`, env: rest.env ?? true });
  },
  joinStore: (store, options) =>
    NcclCommunicator.create({
      rank: store.rank,
      size: store.worldSize,
      device: options.device as CudaDevice,
      store,
      ...(options.timeoutMs === undefined ? {} : { timeoutMs: options.timeoutMs }),
    }),
};

/** @internal Every communication backend and its entry, in the order of COMM_BACKENDS. */
export const COMM_BACKEND_ENTRIES = { local, ucx, nccl } as const satisfies Record<CommBackendName, CommBackendEntry>;

/** @internal The communicator class of backend `N`. */
export type CommunicatorOf<N extends CommBackendName> = (typeof COMM_BACKEND_ENTRIES)[N] extends CommBackendEntry<infer C> ? C : never;

/** @internal The communicators `auto` may create: those of host memory. */
export type HostCommunicatorOf<N extends CommBackendName> = Extract<CommunicatorOf<N>, Communicator<FlatBuffer>>;

/** @internal The entry of `name`, or an InvalidArgumentError naming the backends there are. */
export function commBackendEntry(name: unknown, what: string): CommBackendEntry {
  if (typeof name !== 'string' || !Object.hasOwn(COMM_BACKEND_ENTRIES, name))
    throw new InvalidArgumentError(`${what}: the communication backend must be one of ${COMM_BACKENDS.map((n) => `'${n}'`).join(', ')}, got ${describeValue(name)}`);
  return COMM_BACKEND_ENTRIES[name as CommBackendName] as CommBackendEntry;
}

/** @internal Every entry with its name, in the order of COMM_BACKENDS. */
export function commBackendEntries(): { name: CommBackendName; entry: CommBackendEntry }[] {
  return COMM_BACKENDS.map((name) => ({ name, entry: COMM_BACKEND_ENTRIES[name] as CommBackendEntry }));
}

/** @internal The backends `auto` chooses among, in its order of preference. */
export function autoCommBackends(): CommBackendName[] {
  return commBackendEntries()
    .filter(({ entry }) => entry.autoRank !== undefined)
    .sort((a, b) => a.entry.autoRank! - b.entry.autoRank!)
    .map(({ name }) => name);
}

/**
 * @internal The backend that joins host-memory groups of a launched job's processes over its
 * rendezvous (createHostGroups, parallel pipeline stages): the first in `auto`'s order that runs
 * ranks as processes (ucx).
 */
export function processGroupBackend(): { name: CommBackendName; joinStore: (store: Rendezvous, options: JoinStoreOptions) => Promise<Communicator<FlatBuffer>> } {
  for (const name of autoCommBackends()) {
    const entry = COMM_BACKEND_ENTRIES[name] as CommBackendEntry;
    if (entry.memory === 'host' && entry.capabilities.multiProcess && entry.joinStore) {
      const join = entry.joinStore;
      return { name, joinStore: (store, options) => join(store, options) as unknown as Promise<Communicator<FlatBuffer>> };
    }
  }
  throw new InvalidArgumentError('no communication backend joins host-memory groups of processes in this build');
}
