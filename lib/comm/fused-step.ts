/**
 * The fused all-reduce + update: a ParamSet's gradients are averaged over the ranks in buckets
 * (default 25 MB, a smaller first bucket so the update can start early) and the optimizer's fused
 * kernel (update + compensation + prediction) runs on each bucket.
 *
 * All-or-nothing under the non-finite guard. A NaN/Inf found in a late bucket after earlier
 * buckets were updated would leave a half-applied step, and fp32 updates cannot be undone exactly.
 * So a bucket is updated only once the step is known to be finite, in one of two ways:
 *
 * - `guard: 'prescan'`: before any reduction each rank reads its local gradient once (a squared
 *   norm in double, which is non-finite iff an element is, and bounds every |g_i|); one tiny
 *   all-reduce of those norms tells every rank whether any input is non-finite or large enough
 *   that the sum of n of them could overflow fp32 (|g| > FLT_MAX/n). If neither, every reduced
 *   bucket is finite by construction, so bucket k is updated while bucket k+1 is still being
 *   reduced. A non-finite input skips the step on every rank before anything is reduced; a
 *   possible overflow falls back to `deferred`. Best where communication is slower than memory
 *   (a network transport, or `emulate`): the extra local read is hidden by the overlap.
 * - `guard: 'deferred'`: the reduction counts non-finite results as it writes them (no extra
 *   read), and nothing is updated until every sum is known finite. On the local backend (without
 *   emulation or bucket options) this is two native passes: a reduce-scatter in place (rank r sums
 *   part r into its own gradient buffer, counting), then, if every sum is finite, every rank
 *   updates its whole ParamSet reading part q of the averaged gradient where rank q left it, so the
 *   reduced gradient is never copied to every rank and read back. Afterwards each rank's `grads`
 *   hold its own part averaged and the rest as it was. Elsewhere all buckets are reduced first,
 *   then one update over the whole ParamSet. No overlap of update and reduction, but no extra
 *   pass: best where reduction and update compete for the same memory bandwidth. The default where
 *   every rank is reached at memory speed: `local`, or `ucx` with every rank on one machine,
 *   without emulation.
 *
 * Either way the reduced gradient is exact and the same on every rank, so every rank's update is
 * the reference update applied to the all-reduced average.
 *
 * `update: 'sharded'` (ZeRO-1 style): rank r owns part partition(length, size, r) of the ParamSet.
 * It reduces only that part of the gradient, updates only that part of its weights and optimizer
 * state, and the new weights (and predicted weights) of every part reach every rank. On the local
 * backend this is one pass per cache-sized block (reduce into L1, update, copy to the peers), so the
 * reduced gradient is never written to memory and each rank updates 1/size of the model. The guard
 * is the prescan. Exact (every rank's weights equal the replicated update's, bit for bit) for every
 * optimizer, delay compensation, linear prediction and the shadow step with the `prev-sync`
 * estimate; the `local` and `local-prev-sync` estimates need each rank's own gradient over the
 * whole model and are refused. The optimizer state is sharded: on each rank only its own part is
 * current, so call gatherShardedState() before exporting it or switching back to `replicated`.
 */
import { BackendUnavailableError, DisposedError, InvalidArgumentError, RankFailedError } from '../errors.js';
import { awaitNative, callNative, nativeAddon, type NativeClip, type NativeUpdateBuffers, type NativeUpdateConfig, type NativeUpdateResult } from '../native.js';
import { DeviceParamSet } from '../device/index.js';
import { Optimizer, type StepResult, type StepTicket } from '../optim/optimizer.js';
import { ALIGN_ELEMENTS, FlatBuffer } from '../tensor.js';
import { bucketRanges } from './buckets.js';
import { firstRejection } from './settle.js';
import { Communicator, type ReduceResult } from './communicator.js';
import { QueuedCommunicator } from './queued.js';
import { NcclCommunicator, type NcclStepOptions, type NcclStepResultInfo } from './nccl.js';
import { checkInteger, checkOptions, describeValue, optionKeys } from '../validate.js';


/** @category Communication */
export interface FusedStepOptions {
  /** Bytes per bucket (default 25 MB). */
  bucketBytes?: number;
  /** Bytes of the first bucket (default 1 MB). */
  firstBucketBytes?: number;
  /** How the step stays all-or-nothing (see above). Default: `deferred` where every rank is reached at memory speed (local, or ucx with every rank on one machine, without emulation), else `prescan`. */
  guard?: 'prescan' | 'deferred';
  /** This rank's local gradient (a copy: the all-reduce overwrites the ParamSet's grads), for the `local` estimates. */
  localGrad?: FlatBuffer;
  /** `replicated` (default): every rank updates the whole ParamSet. `sharded`: see above. */
  update?: 'replicated' | 'sharded';
}

/** @category Communication */
export interface FusedStepResult extends StepResult {
  /** Buckets the gradient was reduced in. */
  buckets: number;
  guard: 'prescan' | 'deferred';
  /** `sharded` when the sharded pass ran; `replicated` otherwise (also when a sharded step fell back). */
  update: 'replicated' | 'sharded';
}

const FUSED_STEP_OPTION_KEYS = optionKeys<FusedStepOptions>({ bucketBytes: true, firstBucketBytes: true, guard: true, localGrad: true, update: true });

function checkCommAndOptimizer(what: string, comm: unknown, optimizer: unknown): void {
  if (!(comm instanceof Communicator)) throw new InvalidArgumentError(`${what}(comm, optimizer): comm must be a Communicator, got ${describeValue(comm)}`);
  if (!(optimizer instanceof Optimizer))
    throw new InvalidArgumentError(`${what}(comm, optimizer): optimizer must be an SGD, Adam or AdamW, got ${describeValue(optimizer)}`);
}


/**
 * Averages the optimizer's ParamSet gradients over the communicator's ranks and applies one
 * optimizer step, bucket by bucket. Every rank must call it with the same bucket options.
 *
 * @category Communication
 */
export async function allreduceAndStep(comm: NcclCommunicator, params: DeviceParamSet, options?: NcclStepOptions): Promise<NcclStepResultInfo>;
export async function allreduceAndStep(comm: Communicator, optimizer: Optimizer, options?: FusedStepOptions): Promise<FusedStepResult>;
export async function allreduceAndStep(
  comm: Communicator | NcclCommunicator,
  target: Optimizer | DeviceParamSet,
  options: FusedStepOptions | NcclStepOptions = {},
): Promise<FusedStepResult | NcclStepResultInfo> {
  // One entry for every backend: the nccl backend steps a DeviceParamSet on its GPU (the bucketed
  // step of the CUDA plugin), the host backends an optimizer's ParamSet.
  if (comm instanceof NcclCommunicator) {
    if (!(target instanceof DeviceParamSet))
      throw new InvalidArgumentError(`allreduceAndStep(comm, params): the nccl backend steps a DeviceParamSet (with its optimizer attached), got ${describeValue(target)}`);
    return comm.allreduceAndStep(target, options as NcclStepOptions);
  }
  if (target instanceof DeviceParamSet)
    throw new InvalidArgumentError('allreduceAndStep(comm, params): a DeviceParamSet is stepped over the nccl backend; create an NcclCommunicator (createCommunicator(\'nccl\'))');
  return allreduceAndStepOnHost(comm, target, options as FusedStepOptions);
}

async function allreduceAndStepOnHost(comm: Communicator, optimizer: Optimizer, options: FusedStepOptions): Promise<FusedStepResult> {
  checkOptions(options, FUSED_STEP_OPTION_KEYS, 'allreduceAndStep(comm, optimizer, options)');
  checkCommAndOptimizer('allreduceAndStep', comm, optimizer);
  comm.checkLive('allreduceAndStep');
  const params = optimizer.params;
  params.checkLive('allreduceAndStep');
  const ranges = bucketRanges(params.length, options.bucketBytes, options.firstBucketBytes);
  const guard = options.guard ?? (comm instanceof QueuedCommunicator && comm.memorySpeedLinks ? 'deferred' : 'prescan');
  if (guard !== 'prescan' && guard !== 'deferred') throw new InvalidArgumentError(`allreduceAndStep: guard must be 'prescan' or 'deferred', got ${describeValue(guard)}`);
  const grads = params.grads;
  const inputs = options.localGrad ? { localGrad: options.localGrad } : {};
  const addon = nativeAddon();

  const update = options.update ?? 'replicated';
  if (update !== 'replicated' && update !== 'sharded') throw new InvalidArgumentError(`allreduceAndStep: update must be 'replicated' or 'sharded', got ${describeValue(update)}`);
  // The backend's own replicated step (QueuedCommunicator.replicatedReduce / replicatedApply),
  // where it has one and no bucket sizes were asked for (buckets are for links slower than memory,
  // where each bucket's update hides behind the next bucket's reduction).
  const native = comm instanceof QueuedCommunicator && comm.fusesReplicatedUpdate && options.bucketBytes === undefined && options.firstBucketBytes === undefined ? comm : undefined;
  const nativeReplicated = async (backend: QueuedCommunicator): Promise<FusedStepResult> => {
    // As the bucketed deferred path: the reduction first, so a failure there counts no step.
    const nonFinite = await backend.replicatedReduce(grads, 1 / comm.size);
    const step = optimizer.beginStep('allreduceAndStep', inputs);
    const done = { buckets: 1, guard: 'deferred', update: 'replicated' } as const;
    if (nonFinite > 0) return { ...step.finish(false, nonFinite), ...done };
    try {
      await backend.replicatedApply({ config: { ...step.config, gradChecked: true }, buffers: step.buffers!, queue: step.queue, grads, weights: params.weights, predicted: optimizer.stateBuffer('predicted') });
    } catch (error) {
      step.finish(false, 0);
      throw error;
    }
    return { ...step.finish(true, 0), ...done };
  };
  if (update === 'sharded') {
    const p = optimizer.prediction;
    if (p?.kind === 'sapipe' && p.estimate !== 'prev-sync')
      throw new InvalidArgumentError(
        `allreduceAndStep: the '${p.estimate}' estimate needs each rank's own gradient over the whole model, so it cannot be sharded; use the 'prev-sync' estimate or update: 'replicated'`,
      );
    if (!(comm instanceof QueuedCommunicator))
      throw new BackendUnavailableError(`allreduceAndStep: the ${comm.backend} backend has no sharded update; use update: 'replicated'`);
    // 'prescan' backends update blocks as they reduce them, so finiteness must be known first;
    // 'reduced' backends reduce their whole part first and skip on every rank by themselves.
    const { step, verdict } =
      comm.shardedGuard === 'prescan'
        ? await beginGuarded(comm, optimizer, grads, () => optimizer.beginStep('allreduceAndStep'))
        : { step: optimizer.beginStep('allreduceAndStep'), verdict: { nonFinite: 0, safe: true } };
    const resultGuard = comm.shardedGuard === 'prescan' ? 'prescan' : 'deferred';
    if (verdict.nonFinite > 0) return { ...step.finish(false, verdict.nonFinite), buckets: 0, guard: resultGuard, update };
    if (verdict.safe) {
      const predicted = optimizer.stateBuffer('predicted');
      let r: Awaited<ReturnType<QueuedCommunicator['shardedUpdate']>>;
      try {
        r = await comm.shardedUpdate(
          { config: { ...step.config, gradChecked: true }, buffers: step.buffers!, queue: step.queue, grads, weights: params.weights, predicted },
          1 / comm.size,
        );
      } catch (error) {
        step.finish(false, 0);
        throw error;
      }
      return { ...step.finish(r.applied, r.nonFiniteCount), buckets: 1, guard: resultGuard, update };
    }
    // A sum could overflow: the replicated deferred path below finds out exactly. It updates every
    // part on every rank, so each rank first needs the whole state (every rank reaches this verdict).
    step.abort();
    await gatherShardedState(comm, optimizer);
  } else if (guard === 'prescan') {
    const { step, verdict } = await beginGuarded(comm, optimizer, grads, () => optimizer.beginStep('allreduceAndStep', inputs));
    if (verdict.nonFinite > 0) return { ...step.finish(false, verdict.nonFinite), buckets: 0, guard, update };
    if (!verdict.safe) step.abort(); // the deferred path below begins it again
    else {
      const updates: Promise<unknown>[] = [];
      let failure: unknown;
      try {
        for (const [offset, count] of ranges) {
          await comm.allreduce(grads, { op: 'avg', offset, count });
          const config = { ...step.config, gradChecked: true };
          updates.push(awaitNative(callNative(() => addon.updateAsync(step.queue.handle, config, { ...step.buffers!, offset, count }))));
        }
      } catch (error) {
        failure = error;
      }
      const settled = await Promise.allSettled(updates);
      const bad = settled.find((s) => s.status === 'rejected');
      if (failure !== undefined || bad) {
        step.finish(false, 0);
        throw failure ?? (bad as PromiseRejectedResult).reason;
      }
      return { ...step.finish(true, 0), buckets: ranges.length, guard, update };
    }
  }
  // deferred (also a prescan's possible overflow, and the sharded step's fallback): on a backend
  // with its own replicated step, its two passes; else reduce every bucket (pipelined on the
  // communicator's queue), then one update.
  if (native) return nativeReplicated(native);
  const reductions = ranges.map(([offset, count]) => comm.allreduce(grads, { op: 'avg', offset, count }));
  const results = await Promise.all(reductions);
  const nonFinite = results.reduce((a, r) => a + r.nonFiniteCount, 0);
  const step = optimizer.beginStep('allreduceAndStep', inputs);
  if (nonFinite > 0) return { ...step.finish(false, nonFinite), buckets: ranges.length, guard: 'deferred', update: 'replicated' };
  try {
    const r = await awaitNative(callNative(() => addon.updateAsync(step.queue.handle, { ...step.config, gradChecked: true }, step.buffers!)));
    return { ...step.finish(r.applied, r.nonFiniteCount), buckets: ranges.length, guard: 'deferred', update: 'replicated' };
  } catch (error) {
    step.finish(false, 0);
    throw error;
  }
}

/** @internal What the overlapped staleness-1 step writes, besides the optimizer's state in place. */
export interface OverlappedStepTargets {
  /** The gradient to average and apply (taken out of the ParamSet by the caller). */
  grads: FlatBuffer;
  /** Receives the updated weights; the ParamSet's current weights are only read (the forward pass reads them meanwhile). */
  weights: FlatBuffer;
  /** Receives the predicted weights (when the optimizer predicts); the optimizer's own are read meanwhile. */
  predicted: FlatBuffer | undefined;
  /** Multiplies the optimizer's gradScale for this step (loss scale and accumulation). */
  gradScaleFactor: number;
  /**
   * Clip the averaged gradient to this global L2 norm (in the units the optimizer applies), decided
   * where the update runs once the last bucket has landed; the result then carries `gradNorm`.
   */
  clipGradNorm?: number | undefined;
  bucketBytes?: number | undefined;
  firstBucketBytes?: number | undefined;
  /**
   * `prescan`: each bucket is updated as soon as its reduction lands, behind a guard of every
   * rank's gradient taken first (one extra read, queued). `deferred`: one update behind the last
   * bucket, its own read of the averaged gradient the guard. Default as allreduceAndStep's. With
   * clipGradNorm the update always waits for the last bucket (the norm needs every bucket).
   */
  guard?: 'prescan' | 'deferred' | undefined;
}

/**
 * @internal The staleness-1 modes' fused step, overlapped with the caller's next gradient: the
 * average of `grads` over the ranks in buckets, then one fused update (compensation and prediction
 * included) that reads the current weights and writes the next ones into `targets.weights` (and
 * `targets.predicted`), so a forward pass can read the current ones meanwhile. On the native host
 * backends the update is queued right behind the last bucket on the communicator's queue and runs
 * without the JavaScript thread; under network emulation the two are chained here.
 *
 * All or nothing, by one of two guards (targets.guard, default as allreduceAndStep's):
 * - `deferred`: the update waits for the last bucket and its own guard reads the averaged
 *   gradient (identical on every rank) before writing, so a NaN/Inf anywhere skips the step on
 *   every rank and writes nothing. No extra read; the update starts only when every bucket is in.
 * - `prescan` (no clip, native chain): each rank's gradient is guarded first (its non-finite
 *   count and whether a sum could overflow, one read, queued ahead of the reductions) and the
 *   verdict all-reduced; each bucket's update then runs as soon as that bucket lands, gated by the
 *   verdict, so every bucket of every rank updates or none does. A step skipped for the overflow
 *   risk alone is applied whole once the reductions show every sum finite (at the next turn of
 *   the JavaScript thread: rare, and exact).
 *
 * A failed reduction (a lost peer) fails the returned promise, and every update queued behind it
 * fails before writing (a latch signal behind each reduction vouches for it): the `deferred` update
 * writes nothing; `prescan` updates of buckets that landed before the failure have written theirs.
 * On the emulated path a failed bucket already stops the update. The ParamSet's weights, only
 * read, stay as they were; the trainer refuses every later call after a failure.
 *
 * The optimizer counts as stepping until the returned promise settles. Every rank must call it
 * with the same bucket options.
 */
export function startOverlappedStep(comm: Communicator, optimizer: Optimizer, targets: OverlappedStepTargets): Promise<StepResult & { gradNorm?: number }> {
  checkCommAndOptimizer('startOverlappedStep', comm, optimizer);
  comm.checkLive('step');
  const params = optimizer.params;
  const ranges = bucketRanges(params.length, targets.bucketBytes, targets.firstBucketBytes);
  // Every buffer is checked before anything starts: a disposed one found by a native call after
  // the first bucket was queued would leave a reduction running on a buffer the caller then frees.
  for (const [role, buffer] of [['grads', targets.grads], ['weights', targets.weights], ['predicted', targets.predicted], ['current weights', params.weights]] as const)
    if (buffer?.disposed) throw new DisposedError(`step: the ${role} buffer was disposed; create the trainer or optimizer again`);
  const ticket = optimizer.beginStep('step', { grad: targets.grads });
  const config = { ...ticket.config, gradScale: (ticket.config.gradScale ?? 1) * targets.gradScaleFactor, gradChecked: false };
  const buffers = {
    ...ticket.buffers!,
    weightsIn: params.weights.handle,
    weights: targets.weights.handle,
    ...(targets.predicted ? { predicted: targets.predicted.handle } : {}),
  };
  const clip: NativeClip | undefined =
    targets.clipGradNorm === undefined ? undefined : { maxNorm: targets.clipGradNorm, base: ticket.config.gradScale ?? 1, unscale: targets.gradScaleFactor };
  const guard = targets.guard ?? (comm instanceof QueuedCommunicator && comm.memorySpeedLinks ? 'deferred' : 'prescan');
  if (guard !== 'prescan' && guard !== 'deferred') {
    ticket.abort();
    throw new InvalidArgumentError(`startOverlappedStep: guard must be 'prescan' or 'deferred', got ${describeValue(guard)}`);
  }
  if (guard === 'prescan' && clip === undefined && comm instanceof QueuedCommunicator) {
    const byBucket = startByBucket(comm, ticket, ranges, targets.grads, config, buffers);
    if (byBucket) return byBucket;
  }
  let reductions: Promise<ReduceResult>[];
  let update: Promise<NativeUpdateResult>;
  try {
    const chained = comm instanceof QueuedCommunicator ? comm.reduceThenUpdate(targets.grads, ranges, config, buffers, clip) : undefined;
    if (chained) ({ reductions, update } = chained);
    else {
      reductions = ranges.map(([offset, count]) => comm.allreduce(targets.grads, { op: 'avg', offset, count }));
      update = Promise.all(reductions).then(() => awaitNative(callNative(() => nativeAddon().updateAsync(ticket.queue.handle, config, buffers, clip))));
    }
  } catch (error) {
    // The update was refused (a buffer failed its native checks): nothing ran, or only reductions
    // queued before it, whose average is never applied. The step never ran.
    ticket.abort();
    throw error;
  }
  return (async () => {
    // Everything settles before the ticket ends: nothing queued may still use the buffers.
    const [updated, ...reduced] = await Promise.allSettled([update, ...reductions]);
    const failed = [...reduced, updated!].find((r) => r.status === 'rejected');
    if (failed) {
      ticket.finish(false, 0);
      throw (failed as PromiseRejectedResult).reason;
    }
    const r = (updated as PromiseFulfilledResult<NativeUpdateResult>).value;
    const result = ticket.finish(r.applied, r.nonFiniteCount);
    return r.gradNorm === undefined ? result : { ...result, gradNorm: r.gradNorm };
  })();
}

/**
 * The `prescan` form of startOverlappedStep on a native chain: guard, verdict, then each bucket's
 * reduction and gated update (QueuedCommunicator.reduceAndUpdateByBucket). Undefined (nothing
 * queued) where the backend chains nothing natively.
 */
function startByBucket(
  comm: QueuedCommunicator,
  ticket: StepTicket,
  ranges: readonly (readonly [number, number])[],
  grads: FlatBuffer,
  config: NativeUpdateConfig,
  buffers: NativeUpdateBuffers,
): Promise<StepResult> | undefined {
  // The verdict rules out every non-finite sum before any bucket is updated.
  const checked = { ...config, gradChecked: true };
  const scratch: FlatBuffer[] = [];
  const release = (): void => {
    for (const b of scratch) {
      try {
        b.dispose();
      } catch {
        // still held by an operation queued before a refusal: collected once it lets go
      }
    }
  };
  let chain: ReturnType<QueuedCommunicator['reduceAndUpdateByBucket']>;
  try {
    const gate = FlatBuffer.allocate(ALIGN_ELEMENTS);
    scratch.push(gate);
    const latch = FlatBuffer.allocate(Math.ceil((ranges.length + 1) / ALIGN_ELEMENTS) * ALIGN_ELEMENTS);
    scratch.push(latch);
    // The updates run on the optimizer's queue, each waiting for its bucket's reduction.
    chain = comm.reduceAndUpdateByBucket(grads, ranges, checked, buffers, gate, latch, ticket.queue.handle);
  } catch (error) {
    // Operations queued before the refusal run regardless (the trainer refuses every later call
    // after a failure).
    ticket.abort();
    release();
    throw error;
  }
  if (!chain) {
    release();
    return undefined;
  }
  const { queued, reductions, updates } = chain;
  const gate = scratch[0]!;
  return (async () => {
    try {
      const failure = await firstRejection([...queued, ...reductions, ...updates]);
      if (failure !== undefined) throw failure;
      const results = await Promise.all(updates);
      if (results.every((r) => r.applied)) return ticket.finish(true, 0);
      const nonFinite = gate.array[0]!;
      if (nonFinite > 0) return ticket.finish(false, nonFinite);
      // Skipped for the overflow risk alone: the reductions counted their non-finite sums as they
      // wrote them; none means the averaged gradient is finite, and the update runs now, whole.
      const sums = (await Promise.all(reductions)).reduce((n, r) => n + r.nonFiniteCount, 0);
      if (sums > 0) return ticket.finish(false, sums);
      const r = await awaitNative(callNative(() => nativeAddon().updateAsync(ticket.queue.handle, checked, buffers)));
      return ticket.finish(r.applied, r.nonFiniteCount);
    } catch (error) {
      ticket.finish(false, 0);
      throw error;
    } finally {
      release();
    }
  })();
}


/**
 * The step's ticket (`begin`: its checks), then the prescan guard's verdict, so that no rank is
 * left waiting: a rank whose checks or guard fail still joins the verdict's all-reduce, marking
 * it failed, and then throws its own error; every other rank throws a RankFailedError. No rank
 * counts a step then. The ticket is returned open (or aborted when this throws).
 */
async function beginGuarded(
  comm: Communicator,
  optimizer: Optimizer,
  grads: FlatBuffer,
  begin: () => StepTicket,
): Promise<{ step: StepTicket; verdict: { nonFinite: number; safe: boolean } }> {
  let step: StepTicket | undefined;
  let failure: unknown;
  try {
    step = begin();
  } catch (error) {
    failure = error;
  }
  try {
    const verdict = await prescan(comm, optimizer, grads, failure);
    return { step: step!, verdict };
  } catch (error) {
    step?.abort();
    throw error;
  }
}

/**
 * The prescan guard's verdict: this rank's guard of `grads` (the native guardAsync: its non-finite
 * count and whether a sum over the ranks could overflow; queued on the communicator's queue,
 * behind any collective still using `grads`, and off the JavaScript thread), then one tiny sum
 * all-reduce of it. `safe`: every reduced element will be finite. The same guard the per-bucket
 * overlapped step queues. `failedBefore`: this rank's step already failed (gate[2] tells the
 * others; so does a guard that fails).
 */
async function prescan(comm: Communicator, optimizer: Optimizer, grads: FlatBuffer, failedBefore?: unknown): Promise<{ nonFinite: number; safe: boolean }> {
  const gate = FlatBuffer.allocate(ALIGN_ELEMENTS);
  try {
    let failure = failedBefore;
    if (failure === undefined)
      try {
        if (comm instanceof QueuedCommunicator) await comm.queueGuard(grads, gate);
        else await awaitNative(callNative(() => nativeAddon().guardAsync(optimizer.executionQueue.handle, grads.handle, gate.handle, comm.size)));
      } catch (error) {
        failure = error;
      }
    if (failure !== undefined) {
      gate.array.fill(0);
      gate.array[2] = 1;
    }
    try {
      await comm.allreduce(gate);
    } catch (error) {
      throw failure ?? error;
    }
    if (failure !== undefined) throw failure;
    const failedRanks = gate.array[2]!;
    if (failedRanks > 0)
      throw new RankFailedError(
        `allreduceAndStep: ${failedRanks} other rank${failedRanks === 1 ? '' : 's'} failed this step before its reductions (their own errors say why); no rank stepped`,
      );
    return { nonFinite: gate.array[0]!, safe: gate.array[1] === 0 };
  } finally {
    gate.dispose();
  }
}

/**
 * After sharded steps each rank's optimizer state is current on its own part only; this copies
 * every part to every rank (one all-gather per state buffer), so exportState() or a replicated
 * step sees the whole state. Every rank must call it.
 *
 * @category Communication
 */
export async function gatherShardedState(comm: NcclCommunicator, params: DeviceParamSet): Promise<void>;
export async function gatherShardedState(comm: Communicator, optimizer: Optimizer): Promise<void>;
export async function gatherShardedState(comm: Communicator | NcclCommunicator, target: Optimizer | DeviceParamSet): Promise<void> {
  if (comm instanceof NcclCommunicator) {
    if (!(target instanceof DeviceParamSet))
      throw new InvalidArgumentError(`gatherShardedState(comm, params): the nccl backend gathers a DeviceParamSet's state, got ${describeValue(target)}`);
    return comm.gatherShardedState(target);
  }
  const optimizer = target as Optimizer;
  checkCommAndOptimizer('gatherShardedState', comm, optimizer);
  comm.checkLive('gatherShardedState');
  optimizer.params.checkLive('gatherShardedState');
  if (!(comm instanceof QueuedCommunicator)) throw new BackendUnavailableError(`gatherShardedState: the ${comm.backend} backend has no sharded update`);
  for (const name of ['momentum', 'secondMoment', 'backup'] as const) {
    const buffer = optimizer.stateBuffer(name);
    if (buffer) await comm.allgatherShards(buffer);
  }
}
