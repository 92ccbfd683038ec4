/**
 * The `nccl` backend: collectives on GPU memory (DeviceBuffers) with NCCL, one rank per process
 * and device, through the CUDA plugin (NCCL is opened at run time: libnccl.so.2, SAPIPE_NCCL_PATH
 * first). `NcclCommunicator.create({ rank, size, device, store })`: rank 0 makes NCCL's unique id
 * and publishes it in the rendezvous store, the others wait for it, all meet at a store barrier
 * (so every rank is alive) and then join the NCCL clique.
 *
 * Operations run on the communicator's execution queue, in order. Each waits for its GPU work by
 * polling with a deadline (`timeoutMs`), checking NCCL's asynchronous error meanwhile: a dead peer
 * makes NCCL hang, so the communicator is aborted instead, and the operation rejects with
 * PeerLostError (NCCL reported an error) or TimeoutError (no progress in time); every later
 * operation rejects with PeerLostError. Every rank must then create a new communicator.
 *
 * `allreduceAndStep(deviceParams)` is the fused all-reduce + optimizer step on the device:
 * bucketed all-reduces on a communication stream, each bucket's fused update on the compute
 * stream as soon as that bucket is reduced (replicated), or reduce-scatter, update of the own
 * part, all-gather of the weights and predicted weights (sharded, ZeRO-1). All or nothing under
 * the non-finite guard on every rank (see native/cuda/bucket_update.h).
 */
import { cudaAddon, cudaDeviceIndex, DeviceBuffer, DeviceEvents, DeviceParamSet, NcclCollective, type CudaDevice, type CudaEventsHandle, type NcclCommHandle, type NcclStepResult } from '../device/index.js';
import { DisposedError, InvalidArgumentError, SizeMismatchError } from '../errors.js';
import { awaitNative, callNative, type NativeUpdateConfig } from '../native.js';
import type { StepResult } from '../optim/optimizer.js';
import { ExecutionQueue } from '../queue.js';
import type { FlatBuffer } from '../tensor.js';
import { Communicator, DEFAULT_COMM_TIMEOUT_MS, type ReduceResult } from './communicator.js';
import { bucketRanges } from './buckets.js';
import { firstRejection } from './settle.js';
import { fromEnv } from './rendezvous/env.js';
import { createRendezvous, type Rendezvous } from './rendezvous/rendezvous.js';
import { EnvelopeKind, openEnvelope, sealEnvelope } from './rendezvous/validate.js';
import { checkInteger, checkOptions, describeValue, optionKeys } from '../validate.js';

/** @category Communication */
export interface NcclCommunicatorOptions {
  rank: number;
  size: number;
  /** This rank's GPU, `cuda:N` (usually `cuda:${localRank}`). */
  device: CudaDevice;
  /**
   * The rendezvous store the unique id goes through. Without it, `env` must be set: a store is
   * then created from the launcher's environment (see fromEnv) and closed once the clique is up.
   */
  store?: Rendezvous;
  /** Create the store from this environment (`true`: process.env). Ignored when `store` is given. */
  env?: true | NodeJS.ProcessEnv;
  /** Store keys start with this (default `sapipe/nccl`); communicators created in turn get numbered keys under it. */
  key?: string;
  /** Bound of every operation and of the rendezvous, in ms (default 30 000). */
  timeoutMs?: number;
}

/** @category Communication */
export interface NcclStepOptions {
  /** Bytes per bucket (default 25 MB), replicated only. */
  bucketBytes?: number;
  /** Bytes of the first bucket (default 1 MB), replicated only. */
  firstBucketBytes?: number;
  /** `replicated` (default) or `sharded` (the DeviceParamSet must be created with { shards: size }). */
  update?: 'replicated' | 'sharded';
  /** This rank's own gradient, for the `local` estimates (replicated only). */
  localGrad?: DeviceBuffer;
}

/** @category Communication */
export interface NcclStepResultInfo extends StepResult {
  buckets: number;
  update: 'replicated' | 'sharded';
  /** Whether the step needed the recheck (its inputs could have overflowed a sum). */
  rechecked: boolean;
}

/**
 * @internal What the staleness-1 step over nccl (NcclCommunicator.startOverlappedStep) reads from
 * and writes to: for gradients computed on the host, the host buffers staged in and out; for
 * gradients a backward pass wrote on the device, none (the set's device gradient is averaged and
 * the new weights stay on the device).
 */
export interface NcclOverlappedTargets {
  /**
   * The host gradient to average and apply (the caller's, taken out of the ParamSet); copied to the
   * set's device gradient first. Undefined: the set's device gradient already holds it.
   */
  hostGrads?: FlatBuffer | undefined;
  /**
   * Receive the new weights (and predicted weights) from the device, for the host's next forward
   * passes. Undefined (both): nothing is copied back.
   */
  hostWeights?: FlatBuffer | undefined;
  hostPredicted?: FlatBuffer | undefined;
  /**
   * The weights the step reads, instead of the set's: a copy of them, so that the set's weights
   * are not held by the queued step and device operations (a forward pass) can read them meanwhile.
   */
  deviceWeightsIn?: DeviceBuffer | undefined;
  /** Where the step writes the new device weights (and predicted weights); the set's own are only read. */
  deviceWeights: DeviceBuffer;
  devicePredicted: DeviceBuffer | undefined;
  /** Multiplies the optimizer's gradScale for this step (loss scale and accumulation). */
  gradScaleFactor: number;
  bucketBytes?: number | undefined;
  firstBucketBytes?: number | undefined;
  /**
   * The set's device gradient is still being written by a backward pass on the device's default
   * stream: one event per bucket, each recorded once its bucket was enqueued (see readyEvents).
   */
  ready?: DeviceEvents | undefined;
}

const SUM = 0;
const AVG = 1;
// Communicators created through one store, in order: every rank creates them in the same order,
// so the n-th one of each rank meets the others' n-th under the same key.
const created = new WeakMap<Rendezvous, Map<string, number>>();


/** ncclUniqueId's size: NCCL_UNIQUE_ID_BYTES in nccl.h. */
const NCCL_UNIQUE_ID_BYTES = 128;

/**
 * @internal The unique id rank 0 published under `key`, for a clique of `size`: what every rank
 * hands to ncclCommInitRank must be rank 0's, of NCCL's length, in the envelope rank 0 sealed it
 * in; anything else is a RendezvousError naming the key. (The id's content is NCCL's own: its
 * bootstrap address is not checked here.)
 */
export function decodeNcclId(key: string, value: Buffer, size: number): Uint8Array {
  const payload = openEnvelope(key, value, { kind: EnvelopeKind.NcclId, rank: 0, worldSize: size, minPayloadBytes: NCCL_UNIQUE_ID_BYTES, maxPayloadBytes: NCCL_UNIQUE_ID_BYTES });
  return new Uint8Array(payload);
}

const NCCL_OPTION_KEYS = optionKeys<NcclCommunicatorOptions>({ rank: true, size: true, device: true, store: true, env: true, key: true, timeoutMs: true });
const NCCL_STEP_OPTION_KEYS = optionKeys<NcclStepOptions>({ bucketBytes: true, firstBucketBytes: true, update: true, localGrad: true });

/**
 * The `nccl` backend: collectives on GPU buffers (DeviceBuffer, DeviceParamSet) through NCCL,
 * and the fused all-reduce and update on the device. Needs the CUDA plugin, a GPU and NCCL.
 *
 * @category Communication
 */
export class NcclCommunicator extends Communicator<DeviceBuffer> {
  readonly backend = 'nccl' as const;
  /** This rank's device, `cuda:N`. */
  readonly device: CudaDevice;
  private readonly handle: NcclCommHandle;
  private readonly queue: ExecutionQueue;
  private readonly barrierWord: DeviceBuffer;

  private constructor(rank: number, size: number, device: CudaDevice, handle: NcclCommHandle, queue: ExecutionQueue, barrierWord: DeviceBuffer) {
    super(rank, size, undefined);
    this.device = device;
    this.handle = handle;
    this.queue = queue;
    this.barrierWord = barrierWord;
  }

  /**
   * Joins the clique. Checks the options, then NCCL and the device (BackendUnavailableError with
   * the reason: no plugin, no NCCL and where it was looked for, no driver, no device) before any
   * store traffic; then exchanges the unique id and initialises.
   */
  static async create(options: NcclCommunicatorOptions): Promise<NcclCommunicator> {
    checkOptions(options, NCCL_OPTION_KEYS, 'NcclCommunicator.create(options)');
    const size = checkInteger(options.size, 'NcclCommunicator: options.size', 1, 65536);
    const rank = checkInteger(options.rank, 'NcclCommunicator: options.rank', 0, size - 1);
    const index = cudaDeviceIndex(options.device, 'NcclCommunicator: options.device');
    const timeoutMs = checkInteger(options.timeoutMs ?? DEFAULT_COMM_TIMEOUT_MS, 'NcclCommunicator: options.timeoutMs', 1, 2 ** 31 - 1);
    const key = options.key ?? 'sapipe/nccl';
    if (typeof key !== 'string' || key.length === 0) throw new InvalidArgumentError('NcclCommunicator: options.key must be a non-empty string');
    if (options.store === undefined && options.env === undefined)
      throw new InvalidArgumentError('NcclCommunicator: give options.store (a Rendezvous) or options.env (true for process.env) to exchange the unique id');
    if (options.store !== undefined && (options.store === null || typeof options.store !== 'object' || typeof options.store.barrier !== 'function'))
      throw new InvalidArgumentError('NcclCommunicator: options.store must be a Rendezvous (createRendezvous)');
    if (options.store === undefined && options.env !== true && (options.env === null || typeof options.env !== 'object'))
      throw new InvalidArgumentError('NcclCommunicator: options.env must be true or an environment object');

    const addon = cudaAddon();
    const handle = callNative(() => new addon.NcclComm(index, size, rank, timeoutMs));
    const device: CudaDevice = `cuda:${index}`;
    let store: Rendezvous | undefined;
    let ownStore = false;
    let barrierWord: DeviceBuffer | undefined;
    try {
      barrierWord = DeviceBuffer.allocate(16, { device });
      if (options.store) store = options.store;
      else {
        const fromLauncher = fromEnv(options.env === true ? process.env : options.env);
        if (fromLauncher.rank !== rank || fromLauncher.worldSize !== size)
          throw new InvalidArgumentError(`NcclCommunicator: the environment says rank ${fromLauncher.rank} of ${fromLauncher.worldSize}, the options rank ${rank} of ${size}`);
        store = await createRendezvous({ ...fromLauncher, timeoutMs });
        ownStore = true;
      }
      const seen = created.get(store) ?? new Map<string, number>();
      created.set(store, seen);
      const generation = seen.get(key) ?? 0;
      seen.set(key, generation + 1);
      const prefix = `${key}/${generation}`;
      let id: Uint8Array;
      if (rank === 0) {
        id = callNative(() => addon.ncclUniqueId());
        await store.setOnce(`${prefix}/id`, sealEnvelope(EnvelopeKind.NcclId, 0, size, id), { timeoutMs });
      } else {
        id = decodeNcclId(`${prefix}/id`, await store.get(`${prefix}/id`, { timeoutMs }), size);
      }
      // NCCL's blocking init cannot be given a deadline: start it only once every rank is alive.
      await store.barrier(`${prefix}/init`, size, { timeoutMs });
      const queue = new ExecutionQueue();
      try {
        await awaitNative(handle.init(queue.handle, id));
      } catch (error) {
        await queue.close();
        throw error;
      }
      return new NcclCommunicator(rank, size, device, handle, queue, barrierWord);
    } catch (error) {
      handle.destroy();
      barrierWord?.dispose();
      throw error;
    } finally {
      if (ownStore) await store?.close();
    }
  }

  protected override isBuffer(b: unknown): b is DeviceBuffer {
    return b instanceof DeviceBuffer;
  }
  protected override get bufferKind(): string {
    return `a DeviceBuffer on ${this.device}`;
  }

  protected async runAllreduce(buffer: DeviceBuffer, offset: number, count: number, scale: number): Promise<ReduceResult> {
    this.checkDevice(buffer, 'allreduce(buffer)');
    // NCCL does not count while reducing: the native op reads the result once more on the device.
    return { nonFiniteCount: await this.collective(NcclCollective.allreduce, buffer, offset, count, null, 0, scale === 1 ? SUM : AVG) };
  }
  protected async runReduceScatter(input: DeviceBuffer, output: DeviceBuffer, scale: number): Promise<ReduceResult> {
    this.checkDevice(input, 'reduceScatter(input)');
    this.checkDevice(output, 'reduceScatter(output)');
    // The count is of this rank's part, as the host backends count it.
    return { nonFiniteCount: await this.collective(NcclCollective.reduceScatter, input, 0, output.length, output, 0, scale === 1 ? SUM : AVG) };
  }
  protected async runAllgather(input: DeviceBuffer, output: DeviceBuffer): Promise<void> {
    this.checkDevice(input, 'allgather(input)');
    this.checkDevice(output, 'allgather(output)');
    await this.collective(NcclCollective.allgather, input, 0, input.length, output, 0, 0);
  }
  protected async runBroadcast(buffer: DeviceBuffer, root: number): Promise<void> {
    this.checkDevice(buffer, 'broadcast(buffer)');
    await this.collective(NcclCollective.broadcast, buffer, 0, buffer.length, null, 0, root);
  }
  protected async runBarrier(): Promise<void> {
    // NCCL has no barrier: an all-reduce of one float completes only once every rank issued it.
    await this.collective(NcclCollective.allreduce, this.barrierWord, 0, 1, null, 0, SUM);
  }
  /** NCCL pairs sends and receives in issue order and blocks a send until its receive is posted: one side must receive while the other sends. */
  protected async runSend(buffer: DeviceBuffer, peer: number): Promise<void> {
    this.checkDevice(buffer, 'send(buffer)');
    await this.collective(NcclCollective.send, buffer, 0, buffer.length, null, 0, peer);
  }
  protected async runRecv(buffer: DeviceBuffer, peer: number): Promise<void> {
    this.checkDevice(buffer, 'recv(buffer)');
    await this.collective(NcclCollective.recv, buffer, 0, buffer.length, null, 0, peer);
  }
  protected override async releaseThreads(): Promise<void> {
    await this.queue.close();
  }
  protected runDestroy(): void {
    this.handle.destroy();
    try {
      this.barrierWord.dispose();
    } catch {
      // still used by an operation being aborted: freed when that operation lets go of it
    }
  }

  /**
   * Averages the device set's gradients over the ranks and applies one step of its optimizer,
   * on the GPU (see the file comment). Every rank must call it with the same options.
   */
  async allreduceAndStep(params: DeviceParamSet, options: NcclStepOptions = {}): Promise<NcclStepResultInfo> {
    return this.allreduceAndStepAfter(params, options, undefined);
  }

  /**
   * @internal allreduceAndStep over a device gradient that a backward pass on the device's default
   * stream may still be writing: `ready` holds one event per bucket, each recorded once its bucket
   * was enqueued, and each bucket's reduction waits for its event on the GPU (buckets reduced from
   * the last to the first, as a backward pass writes them; the update follows the last reduction).
   * Undefined: the gradient is complete (the caller waited for the backward).
   */
  async allreduceAndStepAfter(params: DeviceParamSet, options: NcclStepOptions, ready: DeviceEvents | undefined): Promise<NcclStepResultInfo> {
    this.checkLive('allreduceAndStep');
    if (!(params instanceof DeviceParamSet)) throw new InvalidArgumentError('NcclCommunicator.allreduceAndStep(params) must be a DeviceParamSet');
    checkOptions(options, NCCL_STEP_OPTION_KEYS, 'NcclCommunicator.allreduceAndStep(params, options)');
    params.checkLive('allreduceAndStep');
    if (params.weights.deviceIndex !== cudaDeviceIndex(this.device))
      throw new InvalidArgumentError(`allreduceAndStep: the DeviceParamSet is on ${params.device}, the communicator on ${this.device}`);
    const update = options.update ?? 'replicated';
    if (update !== 'replicated' && update !== 'sharded')
      throw new InvalidArgumentError(`allreduceAndStep: update must be 'replicated' or 'sharded', got ${describeValue(update)}`);
    const sharded = update === 'sharded';
    const optimizer = params.requireOptimizer('allreduceAndStep');
    if (sharded && optimizer.readsLocalGrad)
      throw new InvalidArgumentError(
        "allreduceAndStep: the 'local' estimates need each rank's own gradient over the whole model, so they cannot be sharded; use the 'prev-sync' estimate or update: 'replicated'",
      );
    if (sharded && params.length % (16 * this.size) !== 0)
      throw new SizeMismatchError(`allreduceAndStep: a sharded step splits the set evenly; create the DeviceParamSet with { shards: ${this.size} }`);
    const buffers = params.updateBuffers('allreduceAndStep', options.localGrad);
    const counts = sharded ? [] : bucketRanges(params.length, options.bucketBytes, options.firstBucketBytes).map(([, count]) => count);
    if (ready !== undefined && sharded) throw new InvalidArgumentError("allreduceAndStep: a backward pass's events are for update 'replicated'");
    const events = ready === undefined ? undefined : this.readyEvents(ready, counts.length, 'allreduceAndStep');
    const step = optimizer.beginStep('allreduceAndStep', { external: true });
    try {
      if (step.firstStep) params.prepareFirstStep();
      const config: NativeUpdateConfig = { ...step.config, gradScale: (step.config.gradScale ?? 1) / this.size };
      const first = this.fused(config, buffers, counts, sharded, false, events);
      ready?.markWaited();
      let result: NcclStepResult = await first;
      const rechecked = !result.applied && result.overflowRisk;
      if (rechecked) result = await this.fused(config, buffers, counts, sharded, true);
      return { ...step.finish(result.applied, result.nonFiniteCount), buckets: sharded ? 1 : counts.length, update, rechecked };
    } catch (error) {
      step.finish(false, 0);
      throw error;
    }
  }

  /**
   * @internal The staleness-1 trainer's step over nccl. Queued at once, in order on this
   * communicator's queue, so it runs without a turn of the JavaScript thread (busy computing the
   * next gradient): the host gradient, when given, is copied to the set's device gradient; the
   * bucketed fused step averages the set's device gradient, each bucket's update (compensation and
   * prediction included) starting behind that bucket's reduction, reading the set's weights and
   * writing `deviceWeights` and `devicePredicted`; then, when `hostWeights` is given, those are
   * copied to `hostWeights` and `hostPredicted`. The set's weights and the host buffers the forward
   * pass reads are not written. The gradient buffer is the one the set holds at this call: the
   * caller may put another in place (DeviceParamSet.exchangeGrads) at once, for the next backward
   * pass. A gradient written by device operations must be complete before this call (the model's
   * operations run on the device's default stream, which the communicator's streams do not wait for). All or nothing under the device guard (see allreduceAndStep); a step skipped for the
   * overflow risk alone is rechecked once the JavaScript thread gets a turn, and copied out again.
   *
   * The set's optimizer counts as stepping until the promise settles. On success the caller puts
   * the outputs in place (DeviceParamSet.exchangeWeights / exchangeStateBuffer on the device, the
   * host buffers likewise). A skipped step writes neither the device outputs nor the state (the
   * copies out still overwrite the host outputs, with what the device spares held): nothing is
   * to be swapped in.
   */
  startOverlappedStep(params: DeviceParamSet, targets: NcclOverlappedTargets): Promise<StepResult> {
    this.checkLive('step');
    params.checkLive('step');
    const optimizer = params.requireOptimizer('step');
    if (optimizer.readsLocalGrad)
      throw new InvalidArgumentError("NcclCommunicator.startOverlappedStep: the 'local' estimates read the gradient the caller computes next; use the 'prev-sync' estimate");
    const hostLength = params.params.length;
    for (const [role, buffer] of [['hostGrads', targets.hostGrads], ['hostWeights', targets.hostWeights], ['hostPredicted', targets.hostPredicted]] as const) {
      if (buffer === undefined) continue;
      if (buffer.disposed) throw new DisposedError(`startOverlappedStep: the ${role} buffer was disposed`);
      if (buffer.length !== hostLength) throw new SizeMismatchError(`startOverlappedStep: ${role} has ${buffer.length} elements, the ParamSet ${hostLength}`);
    }
    const predicts = params.stateBuffer('predicted') !== undefined;
    if ((targets.devicePredicted !== undefined) !== predicts || (targets.hostPredicted !== undefined) !== (predicts && targets.hostWeights !== undefined))
      throw new InvalidArgumentError('startOverlappedStep: give devicePredicted exactly when the optimizer predicts, and hostPredicted when it does and hostWeights is given');
    const buffers = {
      ...params.updateBuffers('step', undefined),
      weightsIn: (targets.deviceWeightsIn ?? params.weights).handle,
      weights: targets.deviceWeights.handle,
      ...(targets.devicePredicted ? { predicted: targets.devicePredicted.handle } : {}),
    };
    const counts = bucketRanges(params.length, targets.bucketBytes, targets.firstBucketBytes).map(([, count]) => count);
    if (targets.ready !== undefined && targets.hostGrads !== undefined)
      throw new InvalidArgumentError('startOverlappedStep: events say where a backward pass on the device has got to; a host gradient has none');
    const events = targets.ready === undefined ? undefined : this.readyEvents(targets.ready, counts.length, 'startOverlappedStep');
    const ticket = optimizer.beginStep('step', { external: true });
    const config: NativeUpdateConfig = { ...ticket.config, gradScale: ((ticket.config.gradScale ?? 1) * targets.gradScaleFactor) / this.size };
    // Operations are submitted one by one; a refused one throws at once (before anything later
    // is queued), those already queued run regardless.
    const stageOut = (into: Promise<unknown>[]): void => {
      if (!targets.hostWeights) return;
      into.push(this.stage(false, targets.deviceWeights, targets.hostWeights, hostLength));
      if (targets.devicePredicted) into.push(this.stage(false, targets.devicePredicted, targets.hostPredicted!, hostLength));
    };
    const queued: Promise<unknown>[] = [];
    let fused: Promise<NcclStepResult> | undefined;
    let refused: unknown;
    try {
      if (ticket.firstStep) params.prepareFirstStep();
      if (targets.hostGrads) queued.push(this.stage(true, params.grads, targets.hostGrads, hostLength));
      fused = this.fused(config, buffers, counts, false, false, events);
      targets.ready?.markWaited();
      queued.push(fused);
      stageOut(queued);
    } catch (error) {
      if (queued.length === 0) {
        ticket.abort();
        throw error;
      }
      refused = error;
    }
    return (async () => {
      // Everything settles before the ticket ends: nothing queued may still use the buffers. The
      // step counts as what the device did (a refused stage-out after the fused step still
      // leaves the device state advanced); any failure then rejects, and the trainer refuses
      // every later call.
      const rejected = await firstRejection(queued);
      let failure = refused ?? rejected;
      let result = fused ? await fused.catch(() => undefined) : undefined;
      if (failure === undefined && result && !result.applied && result.overflowRisk) {
        try {
          result = await this.fused(config, buffers, counts, false, true);
        } catch (error) {
          ticket.finish(false, 0);
          throw error;
        }
        if (result.applied) {
          const outs: Promise<unknown>[] = [];
          try {
            stageOut(outs);
          } catch (error) {
            failure = error;
          }
          const outFailure = await firstRejection(outs);
          failure ??= outFailure;
        }
      }
      const counted = ticket.finish(result?.applied ?? false, result?.nonFiniteCount ?? 0);
      if (failure !== undefined) throw failure;
      return counted;
    })();
  }

  /**
   * Copies the first `count` floats of `host` to `device` (toDevice) or back, in order on the
   * queue. Throws at once when refused (nothing queued).
   */
  private stage(toDevice: boolean, device: DeviceBuffer, host: FlatBuffer, count: number): Promise<void> {
    if (this.destroyed) throw new DisposedError('NcclCommunicator: the communicator was destroyed; create a new one');
    this.checkDevice(device, toDevice ? 'stage(to device)' : 'stage(to host)');
    return awaitNative(callNative(() => this.handle.stage(this.queue.handle, toDevice, device.handle, host.handle, count)));
  }

  /**
   * After sharded steps each rank's optimizer state is current on its own part only; this gathers
   * every part to every rank (an all-gather in place per state buffer), before copyToHost() and a
   * checkpoint, or a replicated step. Every rank must call it.
   */
  async gatherShardedState(params: DeviceParamSet): Promise<void> {
    this.checkLive('gatherShardedState');
    if (!(params instanceof DeviceParamSet)) throw new InvalidArgumentError('gatherShardedState(params) must be a DeviceParamSet');
    params.checkLive('gatherShardedState');
    if (params.length % this.size !== 0)
      throw new SizeMismatchError(`gatherShardedState: create the DeviceParamSet with { shards: ${this.size} }`);
    const part = params.length / this.size;
    for (const name of ['momentum', 'secondMoment', 'backup'] as const) {
      const buffer = params.stateBuffer(name);
      if (buffer) await this.collective(NcclCollective.allgather, buffer, this.rank * part, part, buffer, 0, 0);
    }
  }

  private checkDevice(buffer: DeviceBuffer, what: string): void {
    if (buffer.device !== this.device) throw new InvalidArgumentError(`${what} is on ${buffer.device}, the communicator on ${this.device}`);
  }

  /** Resolves with the non-finite count of a reduction's result (0 for the other kinds). */
  private async collective(kind: number, a: DeviceBuffer, aOffset: number, count: number, b: DeviceBuffer | null, bOffset: number, arg: number): Promise<number> {
    if (this.destroyed) throw new DisposedError('NcclCommunicator: the communicator was destroyed; create a new one');
    return awaitNative(callNative(() => this.handle.collective(this.queue.handle, kind, a.handle, aOffset, count, b?.handle ?? null, bOffset, arg)));
  }

  /**
   * A backward pass's events for a step of `buckets` buckets: on this device, one per bucket, every
   * one recorded since the last step waited on them (on a GPU a wait on an event never recorded
   * returns at once, and the bucket would be reduced before its gradient is written). The caller
   * marks them waited on once the step is queued.
   */
  private readyEvents(ready: DeviceEvents, buckets: number, what: string): CudaEventsHandle {
    if (!(ready instanceof DeviceEvents)) throw new InvalidArgumentError(`${what}: ready must be DeviceEvents`);
    if (ready.device !== this.device) throw new InvalidArgumentError(`${what}: the events are on ${ready.device}, the communicator on ${this.device}`);
    if (ready.count !== buckets) throw new SizeMismatchError(`${what}: ${ready.count} events for ${buckets} buckets; give one per bucket`);
    const missing = ready.firstUnrecorded();
    if (missing >= 0)
      throw new InvalidArgumentError(
        `${what}: the event of bucket ${missing} was not recorded since the last step, so its reduction would not wait for its gradient; record every bucket's event once the backward pass has enqueued that bucket`,
      );
    return ready.handleFor(what);
  }

  /** Submits a fused step (or its recheck); throws at once when refused (nothing queued). */
  private fused(
    config: NativeUpdateConfig,
    buffers: ReturnType<DeviceParamSet['updateBuffers']>,
    counts: number[],
    sharded: boolean,
    recheck: boolean,
    ready?: CudaEventsHandle,
  ): Promise<NcclStepResult> {
    return awaitNative(callNative(() => this.handle.fusedUpdate(this.queue.handle, config, buffers, counts, sharded, recheck, ready ?? null)));
  }
}
