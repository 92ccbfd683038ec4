/** The data-parallel trainer: see {@link DataParallelTrainer}. */
import { BusyError, DisposedError, InternalError, InvalidArgumentError, SapipeError, SizeMismatchError } from '../errors.js';
import { Communicator, type ReduceResult } from '../comm/communicator.js';
import { NcclCommunicator } from '../comm/nccl.js';
import { countNonFinite, squaredNorm } from '../ops.js';
import { bucketRanges } from '../comm/buckets.js';
import { allreduceAndStep, gatherShardedState, startOverlappedStep } from '../comm/fused-step.js';
import { ADAM_OPTION_KEYS } from '../optim/adam.js';
import { copyInto, type Optimizer, type OptimizerState, type StepResult } from '../optim/optimizer.js';
import { SGD_OPTION_KEYS } from '../optim/sgd.js';
import type { CompensationOptions, PredictionOptions } from '../optim/options.js';
import { checkOptimizerSpec, checkOptimizerValues, createOptimizer, type OptimizerSpec } from '../optim/registry.js';
import { FlatBuffer, ParamSet } from '../tensor.js';
import { cudaDeviceIndex, parseDevice, type CudaDevice, type DeviceBuffer, type DeviceParamSet } from '../device/index.js';
import { sparseAllreduce } from '../compress/sparse-allreduce.js';
import type { GradientListener } from '../nn/gradient-listener.js';
import { DeviceReplica, checkNcclOptions } from './device-replica.js';
import { checkSameLayout, gatherHostWords } from './layout-check.js';
import { resolveMode, type DataParallelModeOptions, type DataParallelOptimizerSpec, type ResolvedMode } from './mode.js';
import { checkInteger, checkKnownKeys, checkNumber, checkOptions, describeValue, optionKeys } from '../validate.js';

/** @category Data parallel */
export interface DataParallelTrainerOptions extends DataParallelModeOptions {
  /**
   * The ranks' communicator. Over `nccl` the weights and optimizer state live on the
   * communicator's GPU, where the gradient is averaged and applied (docs/cuda.md): modes `sync`
   * (replicated) and the staleness-1 modes with the overlapped update; clipGradNorm, compression,
   * a guard choice and `update: 'sharded'` are refused there. The model computes on the host
   * unless `device` says otherwise.
   */
  comm: Communicator | NcclCommunicator;
  /**
   * Where the model's forward and backward passes run, as `MLP`'s option of the same name: `cpu`
   * (default: the backward writes `trainer.grads`, a host buffer, over every backend) or the nccl
   * communicator's GPU, `cuda:N`: the backward writes `trainer.deviceGrads` and the forward reads
   * `trainer.deviceForwardWeights` (DeviceBuffers), each bucket of the device gradient is averaged
   * with NCCL and updated on the device behind its reduction, and nothing is copied to the host
   * inside a step; the host ParamSet is refreshed by `copyToHost()` and `exportState()`.
   * `accumulationSteps` above 1 is refused there.
   */
  device?: 'cpu' | CudaDevice;
  /**
   * The model's parameters; the trainer updates its weights (with `device: 'cuda:N'` the device
   * copy, and these host weights only on copyToHost() and exportState()).
   */
  params: ParamSet;
  optimizer: DataParallelOptimizerSpec;
  /**
   * The model, checked against the ParamSet: an `MLP` (whose `params` must be `options.params`), or
   * anything with a `numParams` equal to the ParamSet's.
   */
  model?: { readonly numParams: number; readonly params?: ParamSet; readonly device?: string; setGradientListener?: (listener: GradientListener | undefined) => void };
  /**
   * With device gradients: reduce each bucket of the gradient as soon as the model's backward pass
   * has enqueued all of it, while the backward still computes the layers below (the reduction
   * waits for the bucket on the GPU, not the host for the whole backward). Needs a `model` that
   * reports its backward's progress (an `MLP` or `Sequential`: setGradientListener, which the
   * trainer calls with its listener), whose backward writes `trainer.deviceGrads` before every
   * step(). `false`: one wait for the whole backward before the step, for any model (one of one's
   * own writing the gradient however it likes). Default: true when `model` reports its progress.
   * The results are the same either way.
   */
  overlapBackward?: boolean;
  /** Copy rank 0's weights to every rank at creation so all replicas start equal. Default true. */
  broadcastWeights?: boolean;
  /** `sync`: bucket sizes of the fused all-reduce + update (see allreduceAndStep). */
  bucketBytes?: number;
  firstBucketBytes?: number;
  /**
   * How the fused step stays all-or-nothing under NaN/Inf (see allreduceAndStep): in `sync`, and
   * in the staleness-1 modes with the overlapped update, where `prescan` updates each bucket as
   * soon as its reduction lands (behind a guard of every rank's gradient, one extra read, queued)
   * and `deferred` runs one update behind the last bucket. Default: `deferred` where every rank is
   * reached at memory speed, else `prescan`. With clipGradNorm the update waits for every bucket.
   */
  guard?: 'prescan' | 'deferred';
  /**
   * `sync`: `replicated` (default) or `sharded` (each rank reduces and updates only its part of the
   * model; see allreduceAndStep and docs/communication.md). With `sharded`, exportState() gathers
   * the optimizer state from every rank, so every rank must call it.
   */
  update?: 'replicated' | 'sharded';
  /**
   * Clip the averaged gradient to this global L2 norm before it is applied (torch's
   * clip_grad_norm_ after the all-reduce): the norm is of the gradient the optimizer applies,
   * averaged over ranks and in post-gradScale units (loss scale and accumulation removed), and
   * every element is multiplied by min(1, clipGradNorm / (norm + 1e-6)) inside the update's pass.
   * In `sync` mode the all-reduce then completes before the update (no per-bucket fusion). In the
   * staleness-1 modes with overlapUpdate, the norm is taken and the factor applied where the update
   * runs, behind the last bucket's reduction, off the JavaScript thread.
   */
  clipGradNorm?: number;
  /**
   * Micro-batches per update: step() is called after each; the first k-1 calls only count (the
   * gradients accumulate in params.grads, so zeroGrad() once per update, not per micro-batch), the
   * k-th reduces and applies their mean. Default 1.
   */
  accumulationSteps?: number;
  /**
   * Dynamic loss scaling (torch.amp.GradScaler): multiply the loss gradient by `trainer.lossScale`;
   * the trainer divides it out inside the update (no extra pass), halves the scale on a step the
   * non-finite guard skipped and doubles it after `growthInterval` good steps. `true` for the defaults.
   */
  lossScaling?: true | LossScalingOptions;
  /**
   * The staleness-1 modes: run each update in the background, right behind its all-reduce, while
   * the caller computes the next gradient, so that step() only waits for what is not done yet
   * (the update off the critical path; docs/communication.md). The forward pass reads one copy of
   * the weights (and predicted weights) while the update writes the other, and step() swaps them.
   * Default: on wherever it applies. It does not apply to the `local` and `local-prev-sync`
   * estimates (their prediction reads the gradient the caller has not computed yet) or to
   * `compression` (the scatter-add runs on the JavaScript thread); those apply each update at the
   * next step(), as `false` does. `true` where it cannot apply is an error.
   */
  overlapUpdate?: boolean;
  /**
   * Compressed exchange instead of the dense all-reduce, in every mode: each rank sends its top-k
   * gradient elements (MSTopK) and the ranks average the sparse contributions (sparseAllreduce;
   * docs/ALGORITHMS.md section 6). With error feedback (the default) what a rank did not send
   * stays in its residual and is added to its next gradient. The update then runs at step()
   * (no bucket fusion, no overlapUpdate): the selection and the scatter-add run between the
   * exchange and the update.
   */
  compression?: CompressionOptions;
}

/** Gradient compression of {@link DataParallelTrainerOptions.compression}. @category Data parallel */
export interface CompressionOptions {
  kind: 'topk';
  /** Fraction of the gradient's elements each rank sends, in (0, 1] (e.g. 0.001 to 0.05). */
  density: number;
  /** Keep what was not sent and add it to the next gradient. Default true. */
  errorFeedback?: boolean;
  /** MSTopK's most sampling passes (default 8). */
  rounds?: number;
}
const COMPRESSION_KEYS = optionKeys<CompressionOptions>({ kind: true, density: true, errorFeedback: true, rounds: true });

function checkCompression(c: unknown): CompressionOptions | undefined {
  if (c === undefined) return undefined;
  checkOptions(c, COMPRESSION_KEYS, 'DataParallelTrainer: compression');
  const o = c as CompressionOptions;
  if (o.kind !== 'topk') throw new InvalidArgumentError(`DataParallelTrainer: compression.kind must be 'topk', got ${describeValue(o.kind)}`);
  checkNumber(o.density, 'DataParallelTrainer: compression.density', 0, 1, { loOpen: true });
  if (o.errorFeedback !== undefined && typeof o.errorFeedback !== 'boolean')
    throw new InvalidArgumentError(`DataParallelTrainer: compression.errorFeedback must be a boolean, got ${describeValue(o.errorFeedback)}`);
  if (o.rounds !== undefined) checkInteger(o.rounds, 'DataParallelTrainer: compression.rounds', 0, 64);
  return o;
}

/** Dynamic loss scaling; the defaults are torch.amp.GradScaler's. @category Data parallel */
export interface LossScalingOptions {
  /** Default 2^16. */
  initScale?: number;
  /** Default 2. */
  growthFactor?: number;
  /** Default 0.5. */
  backoffFactor?: number;
  /** Good steps before the scale grows. Default 2000. */
  growthInterval?: number;
}
const LOSS_SCALING_KEYS = optionKeys<LossScalingOptions>({ initScale: true, growthFactor: true, backoffFactor: true, growthInterval: true });

interface LossScaler {
  scale: number;
  readonly growthFactor: number;
  readonly backoffFactor: number;
  readonly growthInterval: number;
  goodSteps: number;
}

function resolveLossScaling(o: true | LossScalingOptions | undefined): LossScaler | undefined {
  if (o === undefined) return undefined;
  const options: LossScalingOptions = o === true ? {} : o;
  checkOptions(options, LOSS_SCALING_KEYS, 'DataParallelTrainer: lossScaling');
  return {
    scale: checkNumber(options.initScale ?? 2 ** 16, 'lossScaling.initScale', 0, Number.MAX_VALUE, { loOpen: true }),
    growthFactor: checkNumber(options.growthFactor ?? 2, 'lossScaling.growthFactor', 1, Number.MAX_VALUE, { loOpen: true }),
    backoffFactor: checkNumber(options.backoffFactor ?? 0.5, 'lossScaling.backoffFactor', 0, 1, { loOpen: true, hiOpen: true }),
    growthInterval: checkInteger(options.growthInterval ?? 2000, 'lossScaling.growthInterval', 1, Number.MAX_SAFE_INTEGER),
    goodSteps: 0,
  };
}

/** @category Data parallel */
export interface DataParallelStepResult extends StepResult {
  /** False on a step that only started a reduction (the first pipelined step, or the first after flush()). */
  updated: boolean;
  /** Milliseconds this call waited for the previous step's all-reduce (pipelined modes); 0 when it was already done. */
  waitedMs: number;
  /** True on the first accumulationSteps - 1 calls of each update, which only count. */
  accumulating: boolean;
  /** With clipGradNorm: the global norm of the applied gradient before clipping (post-gradScale units). */
  gradNorm?: number;
}

/** The trainer's state for a checkpoint: exact resumption, in-flight gradient included. @category Data parallel */
export interface DataParallelTrainerState {
  version: 1;
  mode: DataParallelTrainer['mode'];
  /** step() calls so far. */
  calls: number;
  weights: Float32Array;
  optimizer: OptimizerState;
  /** The averaged gradient that was in flight (completed by exportState), to be applied by the next step(); null if none. */
  pending: { averaged: Float32Array; nonFiniteCount: number } | null;
  /**
   * An overlapped trainer's update in flight, completed by exportState (its optimizer state is
   * already in `optimizer`): the weights and predicted weights the next step() puts in place, and
   * the result that step() reports. Absent or null if none.
   */
  ahead?: { weights: Float32Array; predicted: Float32Array | null; result: StepResult } | null;
  /** With compression and error feedback: this rank's residual (what it has not sent yet). Absent or null otherwise. */
  residual?: Float32Array | null;
  /** With lossScaling: the scale and the good steps counted toward its next growth. Absent or null otherwise. */
  lossScale?: { scale: number; goodSteps: number } | null;
  /**
   * With accumulationSteps: a save between the micro-batches of an update holds how many were
   * counted and the gradient they accumulated (the ParamSet's, which the next step() reduces).
   * Absent or null at an update boundary.
   */
  accumulation?: { count: number; grads: Float32Array } | null;
}

/** An overlapped update in flight (see overlapUpdate). */
interface OverlappedJob {
  /** The gradient buffer under reduction, returned to the caller once the job is collected (undefined for device gradients: the replica keeps both). */
  readonly grads: FlatBuffer | undefined;
  readonly done: Promise<StepResult & { gradNorm?: number }>;
  result: (StepResult & { gradNorm?: number }) | undefined;
}

interface Pending {
  buffer: FlatBuffer;
  reduction: Promise<ReduceResult>;
  result: ReduceResult | undefined;
  /** What the buffer's sum must be multiplied by: 1 / (accumulation steps x the loss scale it was computed with). */
  unscale: number;
}

/**
 * A data-parallel trainer: every rank holds the same ParamSet, computes a gradient on its own data,
 * and the trainer averages the gradients over a Communicator and applies them with a fused
 * optimizer step. Every rank runs the same loop, one `step()` per batch:
 *
 * ```ts
 * const comm = await LocalCommunicator.create(workerData.sapipeLocal);
 * const params = new ParamSet(model.spec);
 * const trainer = await DataParallelTrainer.create({ comm, params, mode: 'sapipe-wp', optimizer: { kind: 'sgd', lr: 0.05, momentum: 0.9 } });
 * for (const batch of batches) {
 *   trainer.zeroGrad();                                  // or params.zeroGrad(): the same buffer
 *   for (const micro of batch) {
 *     model.forward(micro.x, micro.rows, trainer.forwardWeights); // the (predicted) weights to read
 *     model.loss(micro.labels);
 *     model.backward(params.grads);                      // or accumulate into params.get(name).grad
 *   }
 *   await trainer.step();                                // average over the ranks, update
 * }
 * await trainer.flush();                                 // apply the gradient still in flight
 * ```
 *
 * Gradients are written into `params.grads` (the same buffer as `trainer.grads`), the weights of
 * the forward pass read from `trainer.forwardWeights`. In `sync` mode step() averages and applies
 * at once (bucketed all-reduce fused with the update). In the staleness-1 modes (`pipe-sgd`,
 * `sapipe-dc`, `sapipe-wp`) step() starts the all-reduce of the gradient just computed and returns
 * without waiting for it, so it runs while the caller computes the next gradient; the next step()
 * completes and applies it. For that, step() takes the filled buffer out of the ParamSet and gives
 * it another: nothing reached through the ParamSet (`grads`, a tensor's `grad`, `zeroGrad()`) is
 * ever a gradient in flight, so the loop above is correct in every mode. Re-read `params.grads`
 * every step rather than keeping it. The first pipelined step only starts its reduction; the first
 * update comes one step later and applies that gradient to the weights it was computed at (no
 * staleness); every later update applies a gradient one update late.
 *
 * On GPUs (one process and device per rank, the `nccl` backend) the model computes on the device
 * and the gradients never leave it, as with PyTorch's DistributedDataParallel:
 *
 * ```ts
 * const comm = await NcclCommunicator.create({ rank, size, device: `cuda:${rank}`, env: true });
 * const model = new MLP([784, 128, 10], { seed: 1, device: comm.device });
 * const trainer = await DataParallelTrainer.create({ comm, params: model.params, model, device: comm.device, mode: 'sapipe-dc', optimizer: { kind: 'sgd', lr: 0.05, momentum: 0.9 } });
 * for (const { x, labels } of batches) {
 *   model.forwardLogits(x, batch, trainer.deviceForwardWeights);
 *   model.loss(labels, { read: false });
 *   model.backward(trainer.deviceGrads);               // re-read it every step
 *   await trainer.step();                               // NCCL buckets, each updated on the device behind its reduction
 * }
 * await trainer.flush();
 * await trainer.copyToHost();                           // model.params now holds the trained weights
 * ```
 *
 * @category Data parallel
 */
export class DataParallelTrainer {
  /** Set by the constructor: what `instanceof` checks (below), so an object that only borrows the prototype is not taken for a trainer. */
  readonly #constructed = true;
  /** `x instanceof DataParallelTrainer` holds for trainers the class built (and its subclasses'), not for `Object.create(DataParallelTrainer.prototype)`. */
  static [Symbol.hasInstance](value: unknown): boolean {
    return typeof value === 'object' && value !== null && #constructed in value;
  }
  readonly comm: Communicator | NcclCommunicator;
  readonly params: ParamSet;
  /** The optimizer the mode configured; change `optimizer.lr` between steps for schedules. */
  readonly optimizer: Optimizer;
  private readonly resolved: ResolvedMode;
  private readonly bucketOptions: { bucketBytes?: number; firstBucketBytes?: number; guard?: 'prescan' | 'deferred'; update?: 'replicated' | 'sharded' };
  /**
   * The gradient buffer of the double buffer (pipelined modes) that is neither the ParamSet's (the
   * one the caller fills) nor under reduction; undefined while both are in use.
   */
  private idle: FlatBuffer | undefined;
  /** This rank's newest local gradient, copied before its reduction overwrites it. */
  private readonly localCopy: FlatBuffer | undefined;
  private pending: Pending | undefined;
  /** Overlapped modes: the update in flight, and the buffers it writes (the weights and predicted weights not in use). */
  private job: OverlappedJob | undefined;
  private readonly overlap: boolean;
  private spareWeights: FlatBuffer | undefined;
  private sparePredicted: FlatBuffer | undefined;
  /**
   * Overlapped sapipe-wp: whether the optimizer's predicted buffer holds predicted weights yet.
   * Its step count runs one update ahead of what is in place (the update in flight counts once it
   * finishes), so the optimizer cannot tell: before the first update is put in place the forward
   * pass reads the real weights, as the optimizer's forwardWeights gives before its first step.
   */
  private predictionInPlace = false;
  private calls = 0;
  private readonly clipGradNorm: number | undefined;
  private readonly accumulationSteps: number;
  /** step() calls since the last update (accumulation). */
  private accumulated = 0;
  private readonly lossScaler: LossScaler | undefined;
  private readonly compression: CompressionOptions | undefined;
  /** Compression with error feedback: what this rank has selected but not sent yet. */
  private readonly residual: FlatBuffer | undefined;
  /** Over nccl: the device copy of the weights and optimizer state, where every update runs. */
  private readonly replica: DeviceReplica | undefined;
  /** The model whose backward the replica follows, and the listener the trainer gave it (removed by dispose()). */
  private listening: { model: NonNullable<DataParallelTrainerOptions['model']>; listener: GradientListener } | undefined;
  /** Where the model computes (the `device` option): `cpu`, or the nccl communicator's device. */
  readonly device: 'cpu' | CudaDevice;
  private busy = false;
  private failure: unknown;
  private isDisposed = false;

  private constructor(options: DataParallelTrainerOptions, resolved: ResolvedMode) {
    this.clipGradNorm = options.clipGradNorm;
    this.accumulationSteps = options.accumulationSteps ?? 1;
    this.lossScaler = resolveLossScaling(options.lossScaling);
    this.compression = options.compression;
    this.comm = options.comm;
    this.params = options.params;
    this.resolved = resolved;
    this.bucketOptions = { bucketBytes: options.bucketBytes, firstBucketBytes: options.firstBucketBytes, guard: options.guard, update: options.update };
    this.optimizer = buildOptimizer(options.params, options.optimizer, resolved);
    this.overlap = overlapApplies(options, resolved);
    this.device = options.device === undefined || options.device === 'cpu' ? 'cpu' : (options.comm as NcclCommunicator).device;
    const onDevice = this.device !== 'cpu';
    try {
      // The second gradient buffer is all-reduced like the ParamSet's own: the same memory.
      if (resolved.staleness === 1 && !onDevice) this.idle = options.params.allocateLike();
      if (resolved.needsLocalGrad) this.localCopy = FlatBuffer.allocate(options.params.length);
      if (this.overlap && !onDevice) {
        this.spareWeights = options.params.allocateLike();
        if (this.optimizer.stateBuffer('predicted')) this.sparePredicted = options.params.allocateLike();
      }
      if (this.compression && this.compression.errorFeedback !== false) this.residual = FlatBuffer.allocate(options.params.length);
      if (options.comm instanceof NcclCommunicator) {
        const follow = onDevice && followsBackward(options);
        const buckets = { bucketBytes: options.bucketBytes, firstBucketBytes: options.firstBucketBytes };
        this.replica = DeviceReplica.create(options.comm, options.params, this.optimizer, this.overlap, onDevice, follow ? buckets : undefined);
        if (follow) {
          const replica = this.replica;
          const model = options.model!;
          const listener: GradientListener = (grads, offset, count) => replica.reportGradients(grads, offset, count);
          model.setGradientListener!(listener);
          listeners.set(model, listener);
          this.listening = { model, listener };
        }
      }
    } catch (error) {
      this.idle?.dispose();
      this.spareWeights?.dispose();
      this.sparePredicted?.dispose();
      this.localCopy?.dispose();
      this.residual?.dispose();
      this.optimizer.dispose();
      throw error;
    }
  }

  /**
   * Creates the trainer on every rank (a collective: all ranks call it with the same mode and
   * ParamSet layout). Checks that every rank's ParamSet has the same tensors (names, shapes,
   * order; SizeMismatchError on every rank naming the first difference) and, unless
   * `broadcastWeights: false`, gives every rank rank 0's weights.
   */
  static async create(options: DataParallelTrainerOptions): Promise<DataParallelTrainer> {
    checkOptions(options, TRAINER_OPTION_KEYS, 'DataParallelTrainer.create(options)');
    const { comm, params } = options;
    if (!(comm instanceof Communicator)) throw new InvalidArgumentError('DataParallelTrainer: options.comm must be a Communicator (e.g. from LocalCommunicator.create)');
    comm.checkLive('DataParallelTrainer.create');
    if (!(params instanceof ParamSet)) throw new InvalidArgumentError('DataParallelTrainer: options.params must be a ParamSet');
    params.checkLive('DataParallelTrainer.create');
    if (options.optimizer === null || typeof options.optimizer !== 'object')
      throw new InvalidArgumentError("DataParallelTrainer: options.optimizer must be an object like { kind: 'sgd', lr: 0.1, momentum: 0.9 }");
    // Compensation and prediction come from the mode: naming them in the spec is a mistake the message explains.
    checkOptimizerSpec(options.optimizer, 'DataParallelTrainer', {
      keys: ['compensation', 'prediction', 'queue'],
      why: "by the trainer from its mode; use the trainer's options (mode, compensation, estimate) instead",
    });
    const onDevice = checkTrainerDevice(options, comm);
    if (options.model !== undefined) {
      const model = options.model as { numParams?: unknown; params?: unknown; device?: unknown } | null;
      if (model !== null && typeof model === 'object' && model.params instanceof ParamSet && model.params !== params)
        throw new InvalidArgumentError(
          'DataParallelTrainer: options.model has its own ParamSet, not options.params; pass the model\'s: { params: model.params, model }',
        );
      const n = model?.numParams;
      if (typeof n !== 'number')
        throw new InvalidArgumentError(`DataParallelTrainer: options.model must have a numeric numParams (an MLP, or { numParams }), got ${describeValue(model)}`);
      if (n !== params.numParams)
        throw new SizeMismatchError(`DataParallelTrainer: the model has ${n} parameters but the ParamSet ${params.numParams}; build the ParamSet from the model's parameter spec`);
      checkModelDevice(model!.device, options.device ?? 'cpu');
    }
    const broadcast = options.broadcastWeights ?? true;
    if (typeof broadcast !== 'boolean') throw new InvalidArgumentError('DataParallelTrainer: broadcastWeights must be a boolean');
    const resolved = resolveMode(options, comm.size);
    // Every value of the optimizer, with the mode's compensation and prediction, before any collective.
    checkOptimizerValues(options.optimizer as OptimizerSpec, 'DataParallelTrainer', modeOptimizerOptions(resolved));
    if (options.update !== undefined && options.update !== 'replicated' && options.update !== 'sharded')
      throw new InvalidArgumentError(`DataParallelTrainer: update must be 'replicated' or 'sharded', got ${describeValue(options.update)}`);
    if (options.clipGradNorm !== undefined) {
      checkNumber(options.clipGradNorm, 'DataParallelTrainer: clipGradNorm', 0, Number.MAX_VALUE, { loOpen: true });
      if (options.update === 'sharded')
        throw new InvalidArgumentError("DataParallelTrainer: clipGradNorm needs the whole gradient's norm on every rank; use update 'replicated'");
    }
    checkInteger(options.accumulationSteps ?? 1, 'DataParallelTrainer: accumulationSteps', 1, 1 << 20);
    if (options.overlapBackward !== undefined) {
      if (typeof options.overlapBackward !== 'boolean')
        throw new InvalidArgumentError(`DataParallelTrainer: overlapBackward must be a boolean, got ${describeValue(options.overlapBackward)}`);
      if (options.overlapBackward && !onDevice)
        throw new InvalidArgumentError("DataParallelTrainer: overlapBackward is for device gradients (device: 'cuda:N' over the nccl communicator); a host gradient is complete when step() is called");
      if (options.overlapBackward && typeof options.model?.setGradientListener !== 'function')
        throw new InvalidArgumentError(
          'DataParallelTrainer: overlapBackward needs options.model to report its backward pass (setGradientListener, as MLP and Sequential do); pass the model, or overlapBackward: false to wait for the whole backward',
        );
    }
    if (onDevice && (options.accumulationSteps ?? 1) > 1)
      throw new InvalidArgumentError(
        `DataParallelTrainer: accumulationSteps is not offered with device gradients (device '${options.device}'); average the micro-batches in the loss (one backward per update), or leave accumulationSteps unset`,
      );
    resolveLossScaling(options.lossScaling);
    if (resolved.needsLocalGrad && ((options.accumulationSteps ?? 1) > 1 || options.lossScaling !== undefined))
      throw new InvalidArgumentError(
        `DataParallelTrainer: the '${options.estimate}' estimate reads this rank's own gradient unscaled; with accumulationSteps or lossScaling use estimate 'prev-sync'`,
      );
    if (options.overlapUpdate !== undefined) {
      if (typeof options.overlapUpdate !== 'boolean')
        throw new InvalidArgumentError(`DataParallelTrainer: overlapUpdate must be a boolean, got ${describeValue(options.overlapUpdate)}`);
      const obstacle = overlapObstacle(options, resolved);
      if (options.overlapUpdate && obstacle !== undefined)
        throw new InvalidArgumentError(`DataParallelTrainer: overlapUpdate cannot apply here: ${obstacle}; leave overlapUpdate unset`);
    }
    const compression = checkCompression(options.compression);
    if (compression) {
      if (options.update === 'sharded') throw new InvalidArgumentError("DataParallelTrainer: compression exchanges whole sparse gradients; use update 'replicated'");
      if (options.lossScaling !== undefined && compression.errorFeedback !== false)
        throw new InvalidArgumentError('DataParallelTrainer: compression with error feedback keeps unsent gradient in the loss scale it was computed with; a changing loss scale would mix scales in the residual. Leave lossScaling unset or set compression.errorFeedback: false');
    }
    if (options.update === 'sharded' && resolved.staleness !== 0)
      throw new InvalidArgumentError(
        `DataParallelTrainer: update 'sharded' is offered for mode 'sync'; mode '${options.mode}' applies each averaged gradient one step later through its own pipeline`,
      );
    if (comm instanceof NcclCommunicator) {
      checkNcclOptions({ ...options, staleness: resolved.staleness, overlap: overlapApplies(options, resolved) });
      await DeviceReplica.checkLayoutAndBroadcast(comm, params, broadcast, onDevice && followsBackward(options));
      return new DataParallelTrainer(options, resolved);
    }
    await checkSameLayout(params, comm.size, (words) => gatherHostWords(comm, words), 'DataParallelTrainer.create');
    if (broadcast) await comm.broadcast(params.weights, 0);
    return new DataParallelTrainer(options, resolved);
  }

  get mode(): ResolvedMode['mode'] {
    return this.resolved.mode;
  }
  get staleness(): 0 | 1 {
    return this.resolved.staleness;
  }
  /**
   * With device gradients: whether each bucket of the gradient is reduced behind the model's
   * backward pass as soon as the backward has enqueued it (`overlapBackward`), rather than after
   * one wait for the whole backward. False for host gradients.
   */
  get overlapsBackward(): boolean {
    return this.replica?.followsBackward ?? false;
  }
  /** step() calls so far. */
  get stepCalls(): number {
    return this.calls;
  }
  /** True while the all-reduce started by the last step() is still pending (pipelined modes; with overlapUpdate, its update too). */
  get reductionInFlight(): boolean {
    if (this.job) return this.job.result === undefined;
    return this.pending !== undefined && this.pending.result === undefined;
  }

  /** Whether each update runs in the background behind its all-reduce (see overlapUpdate). */
  get overlapped(): boolean {
    return this.overlap;
  }

  /**
   * The buffer to write this step's local gradient into: always the ParamSet's `grads` (in the
   * pipelined modes the trainer gives the ParamSet a fresh buffer at each step() while it reduces
   * the one just filled, so re-read it every step rather than keeping it).
   */
  get grads(): FlatBuffer {
    this.checkUsable('grads');
    if (this.device !== 'cpu')
      throw new InvalidArgumentError(`DataParallelTrainer.grads: this trainer's gradients live on ${this.device}; the backward pass writes trainer.deviceGrads (a DeviceBuffer)`);
    return this.params.grads;
  }

  /**
   * With `device: 'cuda:N'`: the device buffer the backward pass writes this step's gradient
   * into (the ParamSet's layout). In the staleness-1 modes the trainer puts a second buffer in its
   * place at each step() while it reduces the one just filled, so re-read it every step.
   */
  get deviceGrads(): DeviceBuffer {
    return this.deviceSet('deviceGrads').grads;
  }

  /**
   * With `device: 'cuda:N'`: the device weights the forward (and backward) pass reads: the
   * predicted weights in `sapipe-wp` while an update is in flight, else the weights.
   */
  get deviceForwardWeights(): DeviceBuffer {
    const set = this.deviceSet('deviceForwardWeights');
    if (this.resolved.mode !== 'sapipe-wp' || !this.job || !this.predictionInPlace) return set.weights;
    return set.stateBuffer('predicted')!;
  }

  /**
   * With `device: 'cuda:N'`: the current device weights (not the predicted ones), e.g. for an
   * evaluation on the device. Read-only: change weights through importState().
   */
  get deviceWeights(): DeviceBuffer {
    return this.deviceSet('deviceWeights').weights;
  }

  /**
   * Copies the device's weights and optimizer state into the host ParamSet (`params.weights`) and
   * optimizer, e.g. before saving the model or evaluating it on the host. With `device: 'cuda:N'`
   * the host weights are otherwise left as they were at create(); with host gradients over nccl
   * they are current already and this refreshes the optimizer state; over the host backends it
   * does nothing. The weights are those the forward pass reads as real weights now: in the
   * staleness-1 modes the update in flight is not in them (flush() first to include it), while the
   * optimizer state already includes it (this waits for it). A checkpoint takes exportState(),
   * which keeps that update too.
   */
  async copyToHost(): Promise<void> {
    this.enter('copyToHost');
    try {
      const job = this.job;
      if (job) await this.collect(job, false);
      if (this.pending) await this.complete(this.pending);
      this.replica?.stateToHost();
      if (this.replica?.deviceGrads) this.replica.weightsToHost();
    } catch (error) {
      this.failure = error;
      throw error;
    } finally {
      this.busy = false;
    }
  }

  /** The replica's device set, for the device-gradient accessors; InvalidArgumentError saying what to do otherwise. */
  private deviceSet(what: string): DeviceParamSet {
    this.checkUsable(what);
    if (!this.replica?.deviceGrads)
      throw new InvalidArgumentError(
        `DataParallelTrainer.${what}: this trainer's model computes on the host (device 'cpu'); use trainer.${what === 'deviceGrads' ? 'grads' : what === 'deviceWeights' ? 'params.weights' : 'forwardWeights'}, or create the trainer over an NcclCommunicator with device: 'cuda:N'`,
      );
    return this.replica.deviceSet;
  }

  /**
   * Zeroes the gradient buffer the caller fills next (`trainer.grads`, which is `params.grads`), for
   * loops that accumulate into it. The buffer under reduction is never the ParamSet's, so zeroing
   * through the trainer or through `params.zeroGrad()` cannot touch a gradient in flight.
   */
  zeroGrad(): void {
    this.checkUsable('zeroGrad');
    if (this.busy) throw new BusyError('DataParallelTrainer.zeroGrad: a step() is in flight; await it first');
    if (this.replica?.deviceGrads) this.replica.zeroGrads();
    else this.params.zeroGrad();
  }

  /** The view of tensor `name` in `grads`. */
  gradView(name: string): Float32Array {
    return this.params.view(this.grads, name);
  }

  /**
   * The weights this step's forward (and backward) pass reads: the predicted weights in
   * `sapipe-wp` while an update is in flight, else the real weights.
   */
  get forwardWeights(): FlatBuffer {
    this.checkUsable('forwardWeights');
    if (this.device !== 'cpu')
      throw new InvalidArgumentError(`DataParallelTrainer.forwardWeights: this trainer's weights live on ${this.device}; the forward pass reads trainer.deviceForwardWeights (a DeviceBuffer)`);
    if (this.resolved.mode !== 'sapipe-wp' || !(this.pending || this.job)) return this.params.weights;
    if (this.overlap && !this.predictionInPlace) return this.params.weights;
    return this.optimizer.forwardWeights;
  }

  /** The view of tensor `name` in `forwardWeights`. */
  forwardView(name: string): Float32Array {
    return this.params.view(this.forwardWeights, name);
  }

  /** Averages this step's gradient over the ranks and updates the weights (see the file comment for when). */
  async step(): Promise<DataParallelStepResult> {
    this.enter('step');
    try {
      if (++this.accumulated < this.accumulationSteps) {
        this.calls += 1;
        return { applied: false, nonFiniteCount: 0, step: this.optimizer.steps, updated: false, waitedMs: 0, accumulating: true };
      }
      this.accumulated = 0;
      const unscale = this.currentUnscale();
      if (this.resolved.staleness === 0) {
        let r: StepResult & { gradNorm?: number };
        if (this.replica) {
          const replica = this.replica;
          r = await this.withGradScale(unscale, () => replica.syncStep(this.bucketOptions));
        } else if (this.clipGradNorm === undefined && !this.compression)
          r = await this.withGradScale(unscale, () => allreduceAndStep(this.hostComm, this.optimizer, this.bucketOptions));
        else {
          // The norm needs the whole averaged gradient before any part is updated; a compressed
          // exchange ends with the scatter-add on this thread before the update can run.
          const grads = this.params.grads;
          const reduced = this.compression ? await this.compressedAverage(grads) : await this.hostComm.allreduce(grads, { op: 'avg' });
          r = await this.apply(grads, reduced, unscale);
        }
        this.calls += 1;
        this.updateLossScale(r);
        return { applied: r.applied, nonFiniteCount: r.nonFiniteCount, step: r.step, updated: true, waitedMs: 0, accumulating: false, ...(r.gradNorm === undefined ? {} : { gradNorm: r.gradNorm }) };
      }
      const fresh = this.params.grads;
      if (this.overlap) {
        // The update of the gradient reduced since the previous call has run (or is finishing)
        // in the background: wait for what is left, put its weights in place, and start the next.
        const previous = this.job;
        const start = performance.now();
        const done = previous ? await this.collect(previous, true) : undefined;
        const waitedMs = performance.now() - start;
        this.job = undefined;
        if (this.replica?.deviceGrads) {
          // The device gradient: the replica reduces it and gives the set its other gradient buffer.
          this.job = this.trackJob(undefined, this.replica.startOverlappedOnDevice(unscale, this.bucketOptions));
        } else {
          checkFresh(fresh);
          this.job = this.startJob(fresh, unscale);
          const next = previous ? previous.grads! : this.idle!;
          this.idle = undefined;
          this.params.exchangeGrads(next);
        }
        this.calls += 1;
        if (!done) return { applied: false, nonFiniteCount: 0, step: this.optimizer.steps, updated: false, waitedMs, accumulating: false };
        this.updateLossScale(done);
        return { ...done, updated: true, waitedMs, accumulating: false };
      }
      if (this.localCopy) this.localCopy.array.set(fresh.array);
      const previous = this.pending;
      const start = performance.now();
      const done = previous ? await this.complete(previous) : undefined;
      const waitedMs = performance.now() - start;
      checkFresh(fresh);
      // Start this step's reduction before updating, so the update overlaps it too, and take the
      // buffer under reduction out of the ParamSet at once: nothing the caller reaches through the
      // ParamSet (grads, a tensor's grad, zeroGrad) is ever a gradient in flight. The caller fills
      // the buffer just applied (or, with nothing in flight before, the idle one) next.
      this.pending = this.startReduction(fresh, unscale);
      const next = previous ? previous.buffer : this.idle!;
      this.idle = undefined;
      this.params.exchangeGrads(next);
      this.calls += 1;
      if (!previous || !done) return { applied: false, nonFiniteCount: 0, step: this.optimizer.steps, updated: false, waitedMs, accumulating: false };
      const r = await this.apply(previous.buffer, done, previous.unscale);
      this.updateLossScale(r);
      return { ...r, updated: true, waitedMs, accumulating: false };
    } catch (error) {
      this.failure = error;
      throw error;
    } finally {
      this.busy = false;
    }
  }

  /**
   * Completes and applies the gradient in flight, leaving the pipeline empty (e.g. at the end of
   * training, so no averaged gradient is lost). The next step() starts the pipeline again as the
   * first one did: it only starts a reduction, and the update after it is not compensated.
   * Resolves with the update's result, or null if nothing was in flight.
   */
  async flush(): Promise<StepResult | null> {
    this.enter('flush');
    try {
      let r: StepResult;
      if (this.job) {
        const job = this.job;
        r = await this.collect(job, true);
        this.job = undefined;
        this.idle = job.grads;
      } else {
        const previous = this.pending;
        if (!previous) return null;
        const done = await this.complete(previous);
        this.pending = undefined;
        this.idle = previous.buffer;
        r = await this.apply(previous.buffer, done, previous.unscale);
      }
      this.updateLossScale(r);
      // The next update applies a gradient computed at the current weights: nothing to compensate.
      const backup = this.optimizer.stateBuffer('backup');
      if (backup && !this.replica?.deviceGrads) backup.array.set(this.params.weights.array);
      this.replica?.resetBackup();
      return r;
    } catch (error) {
      this.failure = error;
      throw error;
    } finally {
      this.busy = false;
    }
  }

  /**
   * A checkpoint of this rank: weights, optimizer state and the averaged gradient in flight (this
   * waits for its all-reduce, which every rank has already issued, so no new collective starts).
   * Resuming with importState() continues exactly as if training had not stopped. `reuse`: an
   * earlier export the caller is done with, whose arrays are overwritten instead of allocating new
   * ones (a snapshot then costs a copy into memory already touched).
   */
  async exportState(reuse?: DataParallelTrainerState): Promise<DataParallelTrainerState> {
    this.enter('exportState');
    try {
      const previous = this.pending;
      const done = previous ? await this.complete(previous) : undefined;
      const job = this.job;
      const ahead = job ? await this.collect(job, false) : null;
      if (this.bucketOptions.update === 'sharded') await gatherShardedState(this.hostComm, this.optimizer);
      this.replica?.stateToHost();
      const old = (reuse ?? {}) as Partial<DataParallelTrainerState>;
      const onDevice = this.replica?.deviceGrads === true;
      if (onDevice) this.replica!.weightsToHost();
      const aheadWeights = !ahead ? null : onDevice ? this.replica!.aheadToHost(old.ahead ?? undefined) : {
        weights: copyInto(this.spareWeights!.array, old.ahead?.weights),
        predicted: this.sparePredicted ? copyInto(this.sparePredicted.array, old.ahead?.predicted ?? undefined) : null,
      };
      return {
        version: 1,
        mode: this.mode,
        calls: this.calls,
        weights: copyInto(this.params.weights.array, old.weights),
        optimizer: this.optimizer.exportState(old.optimizer ?? undefined),
        pending: previous && done ? { averaged: copyInto(previous.buffer.array, old.pending?.averaged), nonFiniteCount: done.nonFiniteCount } : null,
        ahead: ahead && aheadWeights && { ...aheadWeights, result: { ...ahead } },
        residual: this.residual ? copyInto(this.residual.array, old.residual ?? undefined) : null,
        lossScale: this.lossScaler ? { scale: this.lossScaler.scale, goodSteps: this.lossScaler.goodSteps } : null,
        accumulation: this.accumulated > 0 ? { count: this.accumulated, grads: copyInto(this.params.grads.array, old.accumulation?.grads) } : null,
      };
    } catch (error) {
      this.failure = error;
      throw error;
    } finally {
      this.busy = false;
    }
  }

  /** Restores exportState()'s checkpoint into a trainer of the same mode and layout with nothing in flight. */
  importState(state: DataParallelTrainerState): void {
    this.checkUsable('importState');
    if (this.busy) throw new BusyError('DataParallelTrainer.importState: a step() is in flight; await it first');
    if (this.pending || this.job) throw new BusyError('DataParallelTrainer.importState: this trainer has a gradient in flight; import into a fresh trainer (or flush() first)');
    if (state === null || typeof state !== 'object' || state.version !== 1)
      throw new InvalidArgumentError('DataParallelTrainer.importState: not a state from exportState() (version 1)');
    if (state.mode !== this.mode) throw new InvalidArgumentError(`DataParallelTrainer.importState: the state is from mode ${describeValue(state.mode)}, this trainer is '${this.mode}'`);
    if (!Number.isInteger(state.calls) || state.calls < 0) throw new InvalidArgumentError('DataParallelTrainer.importState: calls must be a non-negative integer');
    if (!(state.weights instanceof Float32Array) || state.weights.length !== this.params.length)
      throw new SizeMismatchError(`DataParallelTrainer.importState: weights must be a Float32Array of ${this.params.length} elements`);
    const p = state.pending;
    if (p !== null) {
      if (typeof p !== 'object' || !(p.averaged instanceof Float32Array) || p.averaged.length !== this.params.length)
        throw new SizeMismatchError(`DataParallelTrainer.importState: pending.averaged must be a Float32Array of ${this.params.length} elements`);
      if (this.resolved.staleness === 0) throw new InvalidArgumentError('DataParallelTrainer.importState: a sync trainer has no gradient in flight');
      if (this.overlap)
        throw new InvalidArgumentError('DataParallelTrainer.importState: the state holds a gradient not yet applied (from a trainer with overlapUpdate off); import it into a trainer created with overlapUpdate: false');
    }
    const ahead = state.ahead ?? null;
    if (ahead !== null) {
      if (!this.overlap)
        throw new InvalidArgumentError('DataParallelTrainer.importState: the state holds an update already applied ahead (from a trainer with overlapUpdate); import it into a trainer with overlapUpdate on');
      if (typeof ahead !== 'object' || !(ahead.weights instanceof Float32Array) || ahead.weights.length !== this.params.length)
        throw new SizeMismatchError(`DataParallelTrainer.importState: ahead.weights must be a Float32Array of ${this.params.length} elements`);
      if (this.sparePredicted && (!(ahead.predicted instanceof Float32Array) || ahead.predicted.length !== this.params.length))
        throw new SizeMismatchError(`DataParallelTrainer.importState: ahead.predicted must be a Float32Array of ${this.params.length} elements`);
      const r = ahead.result as Partial<StepResult> | null;
      if (r === null || typeof r !== 'object' || typeof r.applied !== 'boolean' || !Number.isInteger(r.nonFiniteCount) || !Number.isInteger(r.step))
        throw new InvalidArgumentError('DataParallelTrainer.importState: ahead.result must be a step result { applied, nonFiniteCount, step }');
    }
    const residual = state.residual ?? null;
    if (this.residual) {
      if (!(residual instanceof Float32Array) || residual.length !== this.params.length)
        throw new SizeMismatchError(`DataParallelTrainer.importState: this trainer compresses with error feedback; residual must be a Float32Array of ${this.params.length} elements`);
    } else if (residual !== null)
      throw new InvalidArgumentError('DataParallelTrainer.importState: the state holds a compression residual; import it into a trainer with compression and error feedback');
    const lossScale = state.lossScale ?? null;
    if (lossScale !== null) {
      if (!this.lossScaler) throw new InvalidArgumentError('DataParallelTrainer.importState: the state holds a loss scale; import it into a trainer with lossScaling');
      if (typeof lossScale !== 'object' || !(Number.isFinite(lossScale.scale) && lossScale.scale > 0) || !Number.isInteger(lossScale.goodSteps) || lossScale.goodSteps < 0)
        throw new InvalidArgumentError('DataParallelTrainer.importState: lossScale must be { scale > 0, goodSteps >= 0 (an integer) }');
    }
    const accumulation = state.accumulation ?? null;
    if (accumulation !== null) {
      if (typeof accumulation !== 'object' || !Number.isInteger(accumulation.count) || accumulation.count < 1 || accumulation.count >= this.accumulationSteps)
        throw new InvalidArgumentError(`DataParallelTrainer.importState: accumulation.count must be an integer in [1, ${this.accumulationSteps - 1}] (this trainer's accumulationSteps is ${this.accumulationSteps})`);
      if (!(accumulation.grads instanceof Float32Array) || accumulation.grads.length !== this.params.length)
        throw new SizeMismatchError(`DataParallelTrainer.importState: accumulation.grads must be a Float32Array of ${this.params.length} elements`);
    }
    const weights = this.params.weights.array.slice();
    this.params.weights.array.set(state.weights);
    try {
      this.optimizer.importState(state.optimizer);
    } catch (error) {
      this.params.weights.array.set(weights);
      throw error;
    }
    this.calls = state.calls;
    if (this.residual) this.residual.array.set(residual!);
    if (this.lossScaler && lossScale) {
      this.lossScaler.scale = lossScale.scale;
      this.lossScaler.goodSteps = lossScale.goodSteps;
    }
    this.accumulated = accumulation ? accumulation.count : 0;
    if (accumulation) this.params.grads.array.set(accumulation.grads);
    // The imported predicted weights are in place once an update before the one ahead was applied.
    this.predictionInPlace = state.optimizer.step > (ahead?.result.applied ? 1 : 0);
    if (ahead) {
      // The update already applied ahead: its weights wait in the spare buffers, its gradient
      // buffer is the idle one, and the next step() puts them in place as if it had just finished.
      if (this.spareWeights) this.spareWeights.array.set(ahead.weights);
      if (this.sparePredicted) this.sparePredicted.array.set(ahead.predicted!);
      const result = { ...ahead.result };
      this.job = { grads: this.idle, done: Promise.resolve(result), result };
      this.idle = undefined;
    }
    if (p) {
      // The restored gradient takes the idle buffer; the caller fills the ParamSet's next.
      const buffer = this.idle!;
      buffer.array.set(p.averaged);
      const result = { nonFiniteCount: p.nonFiniteCount };
      this.pending = { buffer, reduction: Promise.resolve(result), result, unscale: this.currentUnscale() };
      this.idle = undefined;
    }
    // Over nccl the device holds the truth: the restored weights, state and update ahead go there.
    const onDevice = this.replica?.deviceGrads === true;
    this.replica?.stateFromHost(
      ahead ? (onDevice ? { weights: ahead.weights, predicted: ahead.predicted ?? undefined } : { weights: this.spareWeights!, predicted: this.sparePredicted }) : undefined,
    );
  }

  /** Waits for any reduction in flight, then frees the trainer's buffers and optimizer state. */
  async dispose(): Promise<void> {
    if (this.isDisposed) return;
    if (this.busy) throw new BusyError('DataParallelTrainer.dispose: a step() is in flight; await it first');
    const pending = this.pending;
    const job = this.job;
    this.isDisposed = true;
    if (pending) await pending.reduction.catch(() => undefined);
    if (job) await job.done.catch(() => undefined);
    this.pending = undefined;
    this.job = undefined;
    this.optimizer.dispose();
    // The ParamSet keeps (and frees) whichever buffer it holds now; the trainer frees the other.
    (this.idle ?? pending?.buffer ?? job?.grads)?.dispose();
    this.idle = undefined;
    this.localCopy?.dispose();
    this.spareWeights?.dispose();
    this.sparePredicted?.dispose();
    this.residual?.dispose();
    // Unless a later trainer of the same model gave it its own listener meanwhile.
    if (this.listening && listeners.get(this.listening.model) === this.listening.listener) {
      this.listening.model.setGradientListener?.(undefined);
      listeners.delete(this.listening.model);
    }
    this.listening = undefined;
    this.replica?.dispose();
  }

  /** The communicator of the host paths (every path that reduces host buffers; create() refuses those over nccl). */
  private get hostComm(): Communicator {
    if (this.comm instanceof NcclCommunicator) throw new InternalError('DataParallelTrainer: a host collective was reached over the nccl backend');
    return this.comm as Communicator;
  }

  private startReduction(buffer: FlatBuffer, unscale: number): Pending {
    // In the same buckets as the overlapped update's reduction, so that the two sum every element
    // in the same order (a ring over 3+ ranks orders its sums by chunk) and agree bit for bit.
    const dense = (): Promise<ReduceResult> =>
      Promise.all(
        bucketRanges(buffer.length, this.bucketOptions.bucketBytes, this.bucketOptions.firstBucketBytes).map(([offset, count]) =>
          this.hostComm.allreduce(buffer, { op: 'avg', offset, count }),
        ),
      ).then((results) => ({ nonFiniteCount: results.reduce((n, r) => n + r.nonFiniteCount, 0) }));
    const reduction = this.compression ? this.compressedAverage(buffer) : dense();
    const pending: Pending = { buffer, reduction, result: undefined, unscale };
    // Record completion as it happens (reductionInFlight), and keep a failure from being reported
    // as unhandled before the next step() awaits it.
    pending.reduction.then(
      (r) => (pending.result = r),
      () => undefined,
    );
    return pending;
  }

  private startJob(grads: FlatBuffer, unscale: number): OverlappedJob {
    const done = this.replica
      ? this.replica.startOverlapped(grads, this.spareWeights!, this.sparePredicted, unscale, this.bucketOptions)
      : startOverlappedStep(this.hostComm, this.optimizer, {
          grads,
          weights: this.spareWeights!,
          predicted: this.sparePredicted,
          gradScaleFactor: unscale,
          clipGradNorm: this.clipGradNorm,
          bucketBytes: this.bucketOptions.bucketBytes,
          firstBucketBytes: this.bucketOptions.firstBucketBytes,
          guard: this.bucketOptions.guard,
        });
    return this.trackJob(grads, done);
  }

  private trackJob(grads: FlatBuffer | undefined, done: Promise<StepResult & { gradNorm?: number }>): OverlappedJob {
    const job: OverlappedJob = { grads, done, result: undefined };
    // Record completion as it happens (reductionInFlight), and keep a failure from being reported
    // as unhandled before the next step() awaits it.
    done.then(
      (r) => (job.result = r),
      () => undefined,
    );
    return job;
  }

  /**
   * Waits for an overlapped update; with `swap`, puts what it wrote in place: its weights become
   * the ParamSet's (the ones read until now become the spare) and its predicted weights the
   * optimizer's. A skipped step wrote nothing, so nothing is swapped. Once per job.
   */
  private async collect(job: OverlappedJob, swap: boolean): Promise<StepResult> {
    const r = job.result ?? (await job.done);
    job.result = r;
    if (swap && r.applied) {
      this.replica?.swap();
      if (this.spareWeights) this.spareWeights = this.params.exchangeWeights(this.spareWeights);
      if (this.sparePredicted) this.sparePredicted = this.optimizer.exchangeStateBuffer('predicted', this.sparePredicted);
      if (this.optimizer.stateBuffer('predicted')) this.predictionInPlace = true;
    }
    return r;
  }

  /**
   * The compressed exchange: `grads` becomes the average of every rank's top-k selection. Its
   * count of non-finite values is of the inputs (a NaN anywhere makes the average NaN); a sum of
   * finite values that overflowed is counted here, so the update's guard is never told wrongly.
   */
  private async compressedAverage(grads: FlatBuffer): Promise<ReduceResult> {
    const c = this.compression!;
    const r = await sparseAllreduce(this.hostComm, grads, {
      density: c.density,
      ...(this.residual ? { residual: this.residual } : {}),
      ...(c.rounds !== undefined ? { rounds: c.rounds } : {}),
    });
    return { nonFiniteCount: r.nonFiniteCount > 0 ? r.nonFiniteCount : countNonFinite(grads) };
  }

  private async complete(p: Pending): Promise<ReduceResult> {
    const r = p.result ?? (await p.reduction);
    p.result = r;
    return r;
  }

  /**
   * The loss scale the caller multiplies this step's loss gradient by (1 without lossScaling). It
   * changes only between updates: halved after a step the non-finite guard skipped, grown after
   * growthInterval good steps.
   */
  get lossScale(): number {
    return this.lossScaler?.scale ?? 1;
  }

  /** 1 / (accumulation steps x loss scale): what the gradient now being computed is multiplied by when applied. */
  private currentUnscale(): number {
    return 1 / (this.accumulationSteps * this.lossScale);
  }

  /** Runs `step` with the optimizer's gradScale multiplied by `factor` (folded into the update's read of the gradient). */
  private async withGradScale<T>(factor: number, step: () => Promise<T>): Promise<T> {
    const base = this.optimizer.gradScale;
    if (factor === 1) return step();
    this.optimizer.gradScale = base * factor;
    try {
      return await step();
    } finally {
      this.optimizer.gradScale = base;
    }
  }

  private updateLossScale(r: StepResult): void {
    const s = this.lossScaler;
    if (!s) return;
    if (!r.applied && r.nonFiniteCount > 0) {
      s.scale *= s.backoffFactor;
      s.goodSteps = 0;
    } else if (++s.goodSteps >= s.growthInterval) {
      s.scale *= s.growthFactor;
      s.goodSteps = 0;
    }
  }

  private async apply(averaged: FlatBuffer, reduced: ReduceResult, unscale: number): Promise<StepResult & { gradNorm?: number }> {
    let factor = unscale;
    let gradNorm: number | undefined;
    if (this.clipGradNorm !== undefined) {
      // In the units the optimizer applies: the averaged sum times gradScale and the unscale.
      gradNorm = Math.sqrt(squaredNorm(averaged)) * this.optimizer.gradScale * unscale;
      // A non-finite norm means a non-finite gradient: the guard skips the step, nothing to clip.
      if (Number.isFinite(gradNorm) && gradNorm > this.clipGradNorm) factor *= this.clipGradNorm / (gradNorm + 1e-6);
    }
    const r = await this.withGradScale(factor, () => this.stepOn(averaged, reduced));
    return gradNorm === undefined ? r : { ...r, gradNorm };
  }

  private async stepOn(averaged: FlatBuffer, reduced: ReduceResult): Promise<StepResult> {
    const local = this.localCopy;
    // Whether a step is skipped must be decided alike on every rank, or the replicas diverge. The
    // averaged gradient is the same everywhere, but a NaN/Inf in this rank's own newest gradient
    // would make only this rank's guard skip. Such a gradient poisons the next average anyway (that
    // step is then skipped on every rank), so here the prediction falls back to the averaged gradient.
    if (local && reduced.nonFiniteCount === 0 && countNonFinite(local) > 0) local.array.set(averaged.array);
    return this.optimizer.step({
      grad: averaged,
      ...(local ? { localGrad: local } : {}),
      // The reduction counted non-finite results as it wrote them, and the local copy is now finite.
      gradChecked: reduced.nonFiniteCount === 0,
    });
  }

  private enter(what: string): void {
    this.checkUsable(what);
    if (this.busy) throw new BusyError(`DataParallelTrainer.${what}: the previous call is still running; await it first`);
    // A failed collective leaves the ranks out of step; continuing would pair the wrong gradients.
    if (this.failure !== undefined) {
      if (this.failure instanceof SapipeError) throw this.failure;
      throw new InternalError(`DataParallelTrainer.${what}: an earlier step failed (${describeValue(this.failure)}); create a new communicator and trainer`, { cause: this.failure });
    }
    this.busy = true;
  }

  private checkUsable(what: string): void {
    if (this.isDisposed) throw new DisposedError(`DataParallelTrainer.${what}: the trainer was disposed; create a new one`);
    this.params.checkLive(`${what} (trainer)`);
  }
}

/**
 * The gradient step() took from the ParamSet is still allocated after step() waited for the
 * previous one (the caller may have disposed it meanwhile): a reduction started on a disposed
 * buffer would fail only later, natively, with the trainer's buffers already exchanged.
 */
function checkFresh(grads: FlatBuffer): void {
  if (grads.disposed) throw new DisposedError('DataParallelTrainer.step: the gradient buffer was disposed while step() ran; create a new ParamSet and trainer');
}

/** Every option DataParallelTrainer.create takes. */
const TRAINER_OPTION_KEYS = optionKeys<DataParallelTrainerOptions>({
  comm: true,
  params: true,
  optimizer: true,
  model: true,
  broadcastWeights: true,
  bucketBytes: true,
  firstBucketBytes: true,
  guard: true,
  update: true,
  mode: true,
  staleness: true,
  compensation: true,
  estimate: true,
  compensateEstimate: true,
  clipGradNorm: true,
  accumulationSteps: true,
  lossScaling: true,
  overlapUpdate: true,
  compression: true,
  device: true,
  overlapBackward: true,
});

/** The listener a trainer last gave each model (a model may outlive its trainer and serve the next). */
const listeners = new WeakMap<object, GradientListener>();

/** Whether the device replica follows the model's backward bucket by bucket (the overlapBackward option, checked by create()). */
function followsBackward(options: DataParallelTrainerOptions): boolean {
  return options.overlapBackward ?? typeof options.model?.setGradientListener === 'function';
}

/**
 * Checks the `device` option against the communicator; true for device gradients. A GPU needs
 * the nccl communicator of that GPU (InvalidArgumentError saying how to create it).
 */
function checkTrainerDevice(options: DataParallelTrainerOptions, comm: Communicator | NcclCommunicator): boolean {
  const device = options.device;
  if (device === undefined || device === 'cpu') return false;
  if (typeof device !== 'string')
    throw new InvalidArgumentError(`DataParallelTrainer: device must be 'cpu' or the nccl communicator's 'cuda:N', got ${describeValue(device)}`);
  let index: number;
  try {
    index = cudaDeviceIndex(device, 'DataParallelTrainer: device');
  } catch (error) {
    if (error instanceof InvalidArgumentError) throw new InvalidArgumentError(`DataParallelTrainer: device must be 'cpu' or 'cuda:N', got ${describeValue(device)}`, { cause: error });
    throw error;
  }
  if (!(comm instanceof NcclCommunicator))
    throw new InvalidArgumentError(
      `DataParallelTrainer: device '${device}' keeps the gradients on a GPU, which only the nccl backend reduces; create the communicator with NcclCommunicator.create({ rank, size, device: '${device}', env: true }), or leave device unset to compute on the host`,
    );
  if (index !== cudaDeviceIndex(comm.device))
    throw new InvalidArgumentError(`DataParallelTrainer: device '${device}' is not the nccl communicator's (${comm.device}); pass device: comm.device (one GPU per rank)`);
  return true;
}

/** A model that says where it computes (an MLP's `device`) must compute where the trainer's gradients are. */
function checkModelDevice(modelDevice: unknown, device: string): void {
  if (typeof modelDevice !== 'string') return;
  const where = (d: string): string => {
    const parsed = parseDevice(d);
    return parsed.kind === 'cpu' ? 'cpu' : `cuda:${parsed.index}`;
  };
  let model: string;
  try {
    model = where(modelDevice);
  } catch {
    return;
  }
  if (model === where(device)) return;
  throw new InvalidArgumentError(
    model === 'cpu'
      ? `DataParallelTrainer: options.model computes on the host, but device is '${device}'; build the model with { device: '${device}' } or leave device unset`
      : `DataParallelTrainer: options.model computes on ${model}, but the trainer's device is '${device}'; pass device: '${model}' (over the nccl communicator of that GPU) so that the backward writes trainer.deviceGrads`,
  );
}

/** Whether the overlapped update applies (overlapUpdate not false, and no overlapObstacle). */
function overlapApplies(options: DataParallelTrainerOptions, mode: ResolvedMode): boolean {
  return options.overlapUpdate !== false && overlapObstacle(options, mode) === undefined;
}

/** Why the update cannot overlap its all-reduce (something needs the JS thread between the two), or undefined. */
function overlapObstacle(options: DataParallelTrainerOptions, mode: ResolvedMode): string | undefined {
  if (mode.staleness !== 1) return `mode '${mode.mode}' applies each gradient at once`;
  if (mode.needsLocalGrad) return `the '${options.estimate}' estimate reads the gradient the caller computes next`;
  if (options.compression !== undefined) return 'compression scatter-adds the selected elements on the JavaScript thread before the update';
  return undefined;
}

/** The optimizer options the trainer's mode adds to the user's spec. */
function modeOptimizerOptions(mode: ResolvedMode): { compensation?: CompensationOptions; prediction?: PredictionOptions } {
  return { ...(mode.compensation ? { compensation: mode.compensation } : {}), ...(mode.prediction ? { prediction: mode.prediction } : {}) };
}

function buildOptimizer(params: ParamSet, spec: DataParallelOptimizerSpec, mode: ResolvedMode): Optimizer {
  return createOptimizer(params, spec as OptimizerSpec, modeOptimizerOptions(mode));
}
