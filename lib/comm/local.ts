/**
 * The `local` backend: the ranks are worker_threads (or async tasks) of one process. Collectives
 * read and write the peers' buffers directly through shared memory, each rank reducing a disjoint
 * slice with the SIMD sum kernel (native/comm/local), so n ranks use n cores and no data is
 * staged. No system dependency: the embedded default.
 *
 * Each rank calls `LocalCommunicator.create({ group, rank, size })` with the same group name; the
 * promise resolves once every rank has joined.
 */
import { randomUUID } from 'node:crypto';
import { Worker, type WorkerOptions } from 'node:worker_threads';

import { awaitNative, callNative } from '../native.js';
import { InvalidArgumentError, RankFailedError, TimeoutError } from '../errors.js';
import type { FlatBuffer } from '../tensor.js';
import { DEFAULT_COMM_TIMEOUT_MS, type ReduceResult, type ShardedGuard, type ShardedStep, type ShardedStepResult } from './communicator.js';
import { checkEmulation, type NetworkEmulation } from './emulation.js';
import { commAddon, type LocalCommHandle } from './local-native.js';
import { CollectiveKind } from './native-handle.js';
import { QueuedCommunicator } from './queued.js';
import { checkInteger, checkObject, checkOptions, describeValue, optionKeys } from '../validate.js';
import { checkAvailable, formatBytes } from '../system-memory.js';

export { partition } from './partition.js';

/** @category Communication */
export interface LocalCommunicatorOptions {
  /** Name shared by the ranks of one group (any string; one group per name at a time). */
  group: string;
  rank: number;
  size: number;
  /** Bound of every wait for peers, in ms (default 30 000). A peer silent for longer breaks the group. */
  timeoutMs?: number;
  /** Delay collectives as links of this speed would (EMULATED network; see emulation.ts). */
  emulate?: NetworkEmulation;
  /**
   * `direct` (default): every rank reduces its slice of all peers' buffers in shared memory.
   * `ring`: the transport-independent ring all-reduce over the local point-to-point channels (the
   * algorithm network transports use; offered here to test and compare it).
   */
  algorithm?: 'direct' | 'ring';
}

const LOCAL_OPTION_KEYS = optionKeys<LocalCommunicatorOptions>({ group: true, rank: true, size: true, timeoutMs: true, emulate: true, algorithm: true });

/** Most ranks a local group holds (the native group's limit). */
const MAX_LOCAL_RANKS = 4096;
/** The least memory one local rank takes: a worker thread's heap and stacks, measured at 17.5 MB. */
const LOCAL_RANK_BYTES = 18 * 2 ** 20;

/**
 * The `local` backend: ranks are worker threads of one process (runLocalRanks or
 * spawnLocalRanks start them), and each rank reduces its slice of every peer's buffer in place in
 * shared memory. No system dependency.
 *
 * @category Communication
 */
export class LocalCommunicator extends QueuedCommunicator {
  readonly backend = 'local' as const;
  readonly group: string;
  protected readonly handle: LocalCommHandle;
  private readonly ring: boolean;

  private constructor(options: LocalCommunicatorOptions, handle: LocalCommHandle) {
    super(options.rank, options.size, checkEmulation(options.emulate));
    this.group = options.group;
    this.handle = handle;
    this.ring = options.algorithm === 'ring';
    if (options.timeoutMs !== undefined) this.operationTimeoutMs = options.timeoutMs;
  }

  /** Joins the group; resolves once all `size` ranks have joined (or rejects with TimeoutError). */
  static async create(options: LocalCommunicatorOptions): Promise<LocalCommunicator> {
    checkOptions(options, LOCAL_OPTION_KEYS, 'LocalCommunicator.create(options)');
    const { group, rank, size } = options;
    if (typeof group !== 'string' || group.length === 0) throw new InvalidArgumentError('LocalCommunicator: options.group must be a non-empty string');
    checkInteger(size, 'LocalCommunicator: options.size', 1, MAX_LOCAL_RANKS);
    if (!Number.isInteger(rank) || rank < 0 || rank >= size) throw new InvalidArgumentError(`LocalCommunicator: options.rank must be an integer in [0, ${size}), got ${describeValue(rank)}`);
    const timeoutMs = options.timeoutMs ?? DEFAULT_COMM_TIMEOUT_MS;
    if (!Number.isInteger(timeoutMs) || timeoutMs < 1) throw new InvalidArgumentError(`LocalCommunicator: options.timeoutMs must be a positive integer, got ${describeValue(timeoutMs)}`);
    if (options.algorithm !== undefined && options.algorithm !== 'direct' && options.algorithm !== 'ring')
      throw new InvalidArgumentError(`LocalCommunicator: options.algorithm must be 'direct' or 'ring'`);
    checkEmulation(options.emulate);
    const addon = commAddon();
    const handle = callNative(() => new addon.LocalComm(group, size, rank, timeoutMs));
    const comm = new LocalCommunicator(options, handle);
    try {
      await awaitNative(handle.ready(comm.collectives.handle));
    } catch (error) {
      comm.destroy();
      throw error;
    }
    return comm;
  }

  protected override async runAllreduce(buffer: FlatBuffer, offset: number, count: number, scale: number): Promise<ReduceResult> {
    const bad = await this.collective(CollectiveKind.allreduce, buffer, offset, count, null, scale, 0, this.ring);
    return { nonFiniteCount: bad };
  }
  protected runDestroy(): void {
    this.handle.destroy();
  }

  /**
   * In-place shard collectives for the sharded update (@internal): `reduceScatterInPlace` leaves the
   * reduced part `rank` of [offset, offset+count) in this rank's buffer; `allgatherInPlace` copies
   * every rank's part to all ranks. Parts are split as native/comm/partition.h splits them.
   */
  async shardCollective(kind: 'reduceScatterInPlace' | 'allgatherInPlace', buffer: FlatBuffer, offset: number, count: number, scale = 1): Promise<number> {
    this.checkLive(kind);
    return this.collective(CollectiveKind[kind], buffer, offset, count, null, scale);
  }

  /** One native pass: ReduceUpdateJob in native/comm/local/local_group.h. */
  // Blocks are updated as they are reduced (unlike the ring path this class inherits): the caller's
  // prescan makes the step all-or-nothing.
  override get shardedGuard(): ShardedGuard {
    return 'prescan';
  }
  protected override async runShardedUpdate(step: ShardedStep, scale: number): Promise<ShardedStepResult> {
    const nonFinite = await awaitNative(callNative(() => this.handle.reduceUpdate(this.collectives.handle, step.config, step.buffers, scale)));
    return { applied: true, nonFiniteCount: nonFinite };
  }

  /**
   * ReduceUpdateJob in native/comm/collective.h. Not under network emulation, whose per-bucket
   * timing it would bypass, nor with the ring algorithm, whose all-reduce sums in another order.
   */
  override get fusesReplicatedUpdate(): boolean {
    return !this.emulation && !this.ring;
  }
  /** @internal Ranks are threads of one process: memory speed unless a network is emulated. */
  override get memorySpeedLinks(): boolean {
    return !this.emulation;
  }
  protected override runReplicatedReduce(grads: FlatBuffer, scale: number): Promise<number> {
    return this.collective(CollectiveKind.reduceScatterInPlace, grads, 0, grads.length, null, scale);
  }
  protected override async runReplicatedApply(step: ShardedStep): Promise<void> {
    await awaitNative(callNative(() => this.handle.updateFromParts(this.collectives.handle, step.config, step.buffers)));
  }

  protected collective(
    kind: number,
    input: FlatBuffer | null,
    offset: number,
    count: number,
    output: FlatBuffer | null,
    scale = 1,
    root = 0,
    ring = false,
  ): Promise<number> {
    const out = output ?? null;
    return awaitNative(
      callNative(() =>
        this.handle.collective(this.collectives.handle, kind, input?.handle ?? null, offset, count, out?.handle ?? null, 0, out?.length ?? 0, scale, root, ring),
      ),
    );
  }
}


/** @category Communication */
export interface LocalRankData {
  sapipeLocal: { group: string; rank: number; size: number };
  [key: string]: unknown;
}

/**
 * Starts `nproc` worker threads running `file`, each with `workerData.sapipeLocal = { group, rank,
 * size }` (pass it to LocalCommunicator.create) plus the given extra data.
 *
 * @category Communication
 */
export function spawnLocalRanks(file: string | URL, nproc: number, options: { workerData?: Record<string, unknown>; group?: string; worker?: WorkerOptions } = {}): Worker[] {
  if (typeof file !== 'string' && !(file instanceof URL))
    throw new InvalidArgumentError(`spawnLocalRanks(file, nproc): file must be a path or a URL, got ${describeValue(file)}`);
  checkInteger(nproc, 'spawnLocalRanks(file, nproc): nproc', 1, MAX_LOCAL_RANKS);
  checkOptions(options, ['workerData', 'group', 'worker'], 'spawnLocalRanks(file, nproc, options)');
  if (options.workerData !== undefined) checkObject(options.workerData, 'spawnLocalRanks: options.workerData');
  if (options.worker !== undefined) checkObject(options.worker, 'spawnLocalRanks: options.worker');
  // Each rank is a worker thread with its own JavaScript heap (about 18 MB at the least): a
  // count the machine cannot hold would end in the OOM killer, not in an error.
  checkAvailable(nproc * LOCAL_RANK_BYTES, `spawnLocalRanks: ${nproc} ranks (worker threads of about ${formatBytes(LOCAL_RANK_BYTES)} each)`, 'Start fewer ranks.');
  const group = options.group ?? `sapipe-${randomUUID()}`;
  if (typeof group !== 'string' || group === '')
    throw new InvalidArgumentError(`spawnLocalRanks: options.group must be a non-empty string, got ${describeValue(group)}`);
  const workers: Worker[] = [];
  try {
    for (let rank = 0; rank < nproc; rank++)
      workers.push(new Worker(file, { ...options.worker, workerData: { ...options.workerData, sapipeLocal: { group, rank, size: nproc } } }));
  } catch (error) {
    // Options that Node refuses (a bad resourceLimits, a file URL that is no file): none of the
    // ranks may be left running, waiting for the ones that never started.
    for (const worker of workers) void worker.terminate();
    throw new InvalidArgumentError(`spawnLocalRanks: cannot start worker ${workers.length}: ${(error as Error).message}`, { cause: error });
  }
  return workers;
}

/** Options of {@link runLocalRanks}. @category Communication */
export interface RunLocalRanksOptions {
  /** Extra data for every rank, beside `sapipeLocal`. */
  workerData?: Record<string, unknown>;
  /** The group's name (default: a fresh one). */
  group?: string;
  /** Options for each Worker (resource limits, argv, ...). */
  worker?: WorkerOptions;
  /** Fail (and stop every rank) if the job has not ended after this many ms. Default: no bound (each rank's own collectives are bounded). */
  timeoutMs?: number;
}
const RUN_OPTION_KEYS = optionKeys<RunLocalRanksOptions>({ workerData: true, group: true, worker: true, timeoutMs: true });

/**
 * Runs `nproc` ranks of `file` as worker threads (like spawnLocalRanks) and resolves when every
 * rank has ended well, like torch.multiprocessing.spawn: the first rank that throws or exits with a
 * non-zero code rejects the whole run with a RankFailedError naming the rank (its error is the
 * `cause`), and every other rank is terminated.
 *
 * @category Communication
 */
export async function runLocalRanks(file: string | URL, nproc: number, options: RunLocalRanksOptions = {}): Promise<void> {
  checkOptions(options, RUN_OPTION_KEYS, 'runLocalRanks(file, nproc, options)');
  const timeoutMs = options.timeoutMs;
  if (timeoutMs !== undefined) checkInteger(timeoutMs, 'runLocalRanks: options.timeoutMs', 1, 2 ** 31 - 1);
  const { timeoutMs: _, ...spawnOptions } = options;
  const workers = spawnLocalRanks(file, nproc, spawnOptions);
  let timer: NodeJS.Timeout | undefined;
  try {
    await new Promise<void>((resolve, reject) => {
      let running = workers.length;
      let failed = false;
      const fail = (error: RankFailedError): void => {
        if (failed) return;
        failed = true;
        for (const worker of workers) void worker.terminate();
        reject(error);
      };
      workers.forEach((worker, rank) => {
        worker.once('error', (error) =>
          fail(new RankFailedError(`runLocalRanks: rank ${rank} of ${nproc} threw: ${(error as Error)?.message ?? describeValue(error)}`, { cause: error, rank })),
        );
        worker.once('exit', (code) => {
          if (code !== 0) fail(new RankFailedError(`runLocalRanks: rank ${rank} of ${nproc} exited with code ${code}`, { rank }));
          else if (--running === 0 && !failed) resolve();
        });
      });
      if (timeoutMs !== undefined)
        timer = setTimeout(() => fail(new RankFailedError(`runLocalRanks: the ${nproc} ranks had not ended after ${timeoutMs} ms; every rank was stopped`, { cause: new TimeoutError('runLocalRanks timed out') })), timeoutMs);
    });
  } finally {
    if (timer) clearTimeout(timer);
  }
}
