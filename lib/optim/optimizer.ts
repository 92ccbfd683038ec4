/**
 * The optimizer base: owns the state buffers of one ParamSet and runs the fused native update
 * (optimizer step + delay compensation + weight prediction + non-finite guard) in one call per step.
 */
import { BusyError, DisposedError, InvalidArgumentError, OutOfMemoryError, SizeMismatchError } from '../errors.js';
import {
  awaitNative,
  callNative,
  CompensationKind,
  EstimateKind,
  OptimizerKind,
  nativeAddon,
  PredictionKind,
  type NativeUpdateBuffers,
  type NativeUpdateConfig,
  type NativeUpdateResult,
} from '../native.js';
import { defaultExecutionQueue, type ExecutionQueue } from '../queue.js';
import { checkAvailable, formatBytes, totalMemoryBytes } from '../system-memory.js';
import { FlatBuffer, type ParamSet } from '../tensor.js';
import { checkKnownKeys, checkNumber, checkObject, checkOneOf, describeValue } from '../validate.js';
import {
  resolveCompensation,
  resolvePrediction,
  type CommonOptimizerOptions,
  type ResolvedCompensation,
  type ResolvedPrediction,
} from './options.js';

/** Buffers a step reads besides the ParamSet's own. @category Optimizers */
export interface StepInputs {
  /** The gradient to apply (e.g. an all-reduced average). Default: the ParamSet's grads. */
  grad?: FlatBuffer;
  /** This worker's newest local gradient: needed by the `local` and `local-prev-sync` estimates. */
  localGrad?: FlatBuffer;
  /**
   * The caller has verified that every gradient read is finite (for example `sum()` returned
   * nonFiniteCount 0): the guard's extra read of the gradients is skipped. Default false.
   */
  gradChecked?: boolean;
}

/** @category Optimizers */
export interface StepResult {
  /** False when a NaN/Inf gradient made the non-finite guard skip the step (nothing was written). */
  applied: boolean;
  /** Non-finite gradient elements seen by the guard (0 when applied). */
  nonFiniteCount: number;
  /** Optimizer steps applied so far, this one included. */
  step: number;
}

/** @internal A step in progress: see {@link Optimizer.beginStep}. */
export interface StepTicket {
  readonly config: NativeUpdateConfig;
  /** The step's host buffers over the whole ParamSet (undefined for an external step). */
  readonly buffers: NativeUpdateBuffers | undefined;
  readonly queue: ExecutionQueue;
  /** The optimizer's first step: delay compensation's backup must equal the weights. */
  readonly firstStep: boolean;
  finish(applied: boolean, nonFiniteCount: number): StepResult;
  /** Ends a step that never ran (its native call threw): nothing is counted. */
  abort(): void;
}

/** The optimizer state buffers, by name. @category Optimizers */
export const STATE_BUFFER_NAMES = ['momentum', 'secondMoment', 'backup', 'predicted', 'prevLocalGrad'] as const;
/** @category Optimizers */
export type StateBufferName = (typeof STATE_BUFFER_NAMES)[number];

/**
 * The optimizer kinds: those the kernels implement (`OptimizerKind`, the C ABI's enum). lib/optim/
 * registry.ts describes each (the compiler holds its OPTIMIZERS to exactly these keys); everything
 * else reads the registry.
 *
 * @category Optimizers
 */
export type OptimizerKindName = keyof typeof OptimizerKind;

/** A snapshot of an optimizer's state (copies), for checkpoints. @category Optimizers */
export interface OptimizerState {
  kind: OptimizerKindName;
  step: number;
  skippedSteps: number;
  lr: number;
  length: number;
  buffers: Partial<Record<StateBufferName, Float32Array>>;
}

/**
 * The base of SGD, Adam and AdamW: one fused native step over a whole ParamSet (update,
 * compensation, prediction and the all-or-nothing non-finite guard), its state buffers, the
 * weights a forward pass reads (`forwardWeights`), and `lr`/`gradScale` changeable between steps.
 *
 * @category Optimizers
 */
export abstract class Optimizer {
  readonly params: ParamSet;
  readonly compensation: ResolvedCompensation | undefined;
  readonly prediction: ResolvedPrediction | undefined;
  protected readonly state: Partial<Record<StateBufferName, FlatBuffer>> = {};
  private learningRate: number;
  private readonly weightDecay: number;
  private gradScaleValue: number;
  private readonly queue: ExecutionQueue;
  private stepCount = 0;
  private skipped = 0;
  /** Steps skipped since the last applied one (the warning's count). */
  private skippedInARow = 0;
  private inFlight = false;
  private isDisposed = false;

  protected constructor(
    params: ParamSet,
    options: CommonOptimizerOptions,
    readonly kind: OptimizerState['kind'],
    optionNames: readonly string[],
  ) {
    if (params === null || typeof params !== 'object' || typeof (params as ParamSet).checkLive !== 'function')
      throw new InvalidArgumentError(`${kind}: the first argument must be a ParamSet`);
    params.checkLive(`${kind} optimizer`);
    checkObject(options, `${kind} options`);
    checkKnownKeys(options, optionNames, `${new.target.name} options`);
    this.params = params;
    this.learningRate = checkNumber(options.lr, 'lr', 0, Number.MAX_VALUE);
    this.weightDecay = checkNumber(options.weightDecay ?? 0, 'weightDecay', 0, Number.MAX_VALUE);
    this.gradScaleValue = checkNumber(options.gradScale ?? 1, 'gradScale', 0, Number.MAX_VALUE, { loOpen: true });
    this.compensation = resolveCompensation(options.compensation);
    this.prediction = resolvePrediction(options.prediction, this.compensation);
    this.queue = options.queue ?? defaultExecutionQueue();
  }

  /** Allocates the state buffers; subclasses call it at the end of their constructor. */
  protected allocateState(names: StateBufferName[]): void {
    const all = new Set(names);
    if (this.compensation) all.add('backup');
    if (this.prediction) all.add('predicted');
    if (this.prediction?.kind === 'sapipe' && this.prediction.estimate === 'local-prev-sync') all.add('prevLocalGrad');
    // The state is written in full at the first step; Linux would hand out the pages then, and a
    // state that does not fit would end the process in the OOM killer instead of an error here.
    const bytes = all.size * this.params.length * 4;
    const advice = 'Use a smaller model, an optimizer with less state (SGD without momentum keeps none), or a machine with more memory.';
    checkAvailable(bytes, `${this.constructor.name}'s state (${[...all].join(', ')}: ${all.size} x ${this.params.length} floats)`, advice);
    // Weights, gradients and state together beyond all the memory there is can never all be written.
    const model = (2 + all.size) * this.params.length * 4;
    if (model > totalMemoryBytes())
      throw new OutOfMemoryError(
        `${this.constructor.name}: weights, gradients and state need ${formatBytes(model)}, more than the machine's ${formatBytes(totalMemoryBytes())} of RAM and swap. ${advice}`,
      );
    try {
      for (const name of all) this.state[name] = this.params.allocateLike();
    } catch (error) {
      for (const b of Object.values(this.state)) b.dispose();
      throw error;
    }
  }

  /** Learning rate; may be changed between steps. */
  get lr(): number {
    return this.learningRate;
  }
  set lr(value: number) {
    this.learningRate = checkNumber(value, 'lr', 0, Number.MAX_VALUE);
  }

  /**
   * The multiplier applied to every gradient element on read (1/n averaging, loss-scale unscale,
   * accumulation); changeable between steps, like `lr`.
   */
  get gradScale(): number {
    return this.gradScaleValue;
  }
  set gradScale(value: number) {
    this.gradScaleValue = checkNumber(value, 'gradScale', 0, Number.MAX_VALUE, { loOpen: true });
  }

  /** Steps applied so far. */
  get steps(): number {
    return this.stepCount;
  }
  /** Steps the non-finite guard skipped so far. */
  get skippedSteps(): number {
    return this.skipped;
  }

  /**
   * The weights a forward pass should read: the predicted weights when prediction is on, else the
   * real weights. Before the first step the predicted weights are the real ones.
   */
  get forwardWeights(): FlatBuffer {
    const predicted = this.state.predicted;
    if (!predicted) return this.params.weights;
    this.checkUsable('forwardWeights');
    if (this.stepCount === 0) callNative(() => nativeAddon().copy(predicted.handle, this.params.weights.handle));
    return predicted;
  }

  /** The predicted-weights view of one tensor (the real weights when prediction is off). */
  forwardView(name: string): Float32Array {
    return this.params.view(this.forwardWeights, name);
  }

  /** A state buffer (momentum, secondMoment, backup, predicted, prevLocalGrad), if this optimizer has it. */
  stateBuffer(name: StateBufferName): FlatBuffer | undefined {
    checkOneOf(name, 'stateBuffer(name)', STATE_BUFFER_NAMES);
    return this.state[name];
  }

  /** Bytes of memory traffic per element of one step, as ALGORITHMS.md counts them. */
  get bytesPerElement(): number {
    return nativeAddon().updateBytesPerElement(this.nativeConfig());
  }

  /** @internal The queue its steps run on (also where a fused step queues its gradient guard). */
  get executionQueue(): ExecutionQueue {
    return this.queue;
  }

  /** Runs one step on the calling thread. */
  stepSync(inputs: StepInputs = {}): StepResult {
    const ticket = this.beginStep('stepSync', inputs);
    let result: NativeUpdateResult;
    try {
      result = callNative(() => nativeAddon().update(ticket.config, ticket.buffers!));
    } catch (error) {
      ticket.abort();
      throw error;
    }
    return ticket.finish(result.applied, result.nonFiniteCount);
  }

  /** Runs one step on the execution queue; resolves when it is done. One step at a time per optimizer. */
  async step(inputs: StepInputs = {}): Promise<StepResult> {
    const ticket = this.beginStep('step', inputs);
    let result: NativeUpdateResult;
    try {
      result = await awaitNative(callNative(() => nativeAddon().updateAsync(ticket.queue.handle, ticket.config, ticket.buffers!)));
    } catch (error) {
      ticket.abort();
      throw error;
    }
    return ticket.finish(result.applied, result.nonFiniteCount);
  }

  /**
   * @internal The one protocol of an optimizer step, for everything that applies one (step(),
   * stepSync(), the fused all-reduce's buckets and sharded parts, a device step, a pipeline
   * stage): a ticket holding the step's native configuration (with `gradChecked`), its host
   * buffers (none for an `external` step, whose buffers live on a device), the queue to run it on,
   * and whether it is the first step. The optimizer counts as stepping, and refuses another step,
   * until `finish(applied, nonFiniteCount)` is called once; its count and skipped-step count
   * follow what finish reports. A host step's first call also rotates delay compensation's backup.
   */
  beginStep(what: string, inputs: StepInputs | { external: true; gradChecked?: boolean } = {}): StepTicket {
    checkObject(inputs as unknown, `${what}(inputs)`);
    const external = (inputs as { external?: unknown }).external === true;
    let config: NativeUpdateConfig;
    let buffers: NativeUpdateBuffers | undefined;
    if (external) {
      this.checkUsable(what);
      if (this.inFlight) throw new BusyError(`Optimizer.${what}(): a step is in flight; await it before stepping again`);
      const gradChecked = (inputs as { gradChecked?: unknown }).gradChecked ?? false;
      if (typeof gradChecked !== 'boolean') throw new InvalidArgumentError(`Optimizer.${what}(): gradChecked must be a boolean`);
      config = this.nativeConfig();
      config.gradChecked = gradChecked;
    } else [config, buffers] = this.prepare(inputs as StepInputs, what);
    const firstStep = this.stepCount === 0;
    this.inFlight = true;
    let finished = false;
    return {
      config,
      buffers,
      queue: this.queue,
      firstStep,
      finish: (applied, nonFiniteCount) => {
        if (finished) throw new BusyError(`Optimizer.${what}(): the step was already finished`);
        finished = true;
        this.inFlight = false;
        return this.finish({ applied, nonFiniteCount });
      },
      abort: () => {
        if (finished) return;
        finished = true;
        this.inFlight = false;
      },
    };
  }

  /**
   * @internal Puts `buffer` (same length) in place of state buffer `name` and returns the one it
   * replaces, which the caller now owns: the data-parallel trainer double-buffers the predicted
   * weights so that a forward pass reads one while the overlapped update writes the other.
   */
  exchangeStateBuffer(name: StateBufferName, buffer: FlatBuffer): FlatBuffer {
    this.checkUsable('exchangeStateBuffer');
    const previous = this.state[name];
    if (!previous) throw new InvalidArgumentError(`Optimizer.exchangeStateBuffer: this optimizer has no '${name}' buffer`);
    if (!(buffer instanceof FlatBuffer) || buffer.length !== previous.length)
      throw new SizeMismatchError(`Optimizer.exchangeStateBuffer: the buffer must be a FlatBuffer of ${previous.length} elements`);
    this.state[name] = buffer;
    return previous;
  }

  /** Names of the state buffers this optimizer holds (what a device copy of its state needs). */
  get stateNames(): StateBufferName[] {
    return Object.keys(this.state) as StateBufferName[];
  }

  /** Whether a step reads a local gradient besides the averaged one (the `local` estimates). */
  get readsLocalGrad(): boolean {
    return this.prediction?.kind === 'sapipe' && this.prediction.estimate !== 'prev-sync';
  }

  /** Copies of the state, for checkpoints; into the arrays of `reuse` (an earlier export the caller is done with) where they fit. */
  exportState(reuse?: OptimizerState): OptimizerState {
    this.checkUsable('exportState');
    const buffers: OptimizerState['buffers'] = {};
    for (const [name, buffer] of Object.entries(this.state) as [StateBufferName, FlatBuffer][])
      buffers[name] = copyInto(buffer.array, (reuse as Partial<OptimizerState> | undefined)?.buffers?.[name]);
    return { kind: this.kind, step: this.stepCount, skippedSteps: this.skipped, lr: this.learningRate, length: this.params.length, buffers };
  }

  /** Restores a state from exportState(); validates everything before changing anything. */
  importState(state: OptimizerState): void {
    this.checkUsable('importState');
    checkObject(state as unknown, "importState(state)");
    if (state.kind !== this.kind)
      throw new InvalidArgumentError(`importState: the state is from a ${describeValue(state.kind)} optimizer, this is ${this.kind}`);
    if (state.length !== this.params.length)
      throw new SizeMismatchError(`importState: the state has length ${describeValue(state.length)}, this ParamSet ${this.params.length}`);
    const step = state.step;
    if (!Number.isInteger(step) || step < 0) throw new InvalidArgumentError('importState: step must be a non-negative integer');
    checkObject(state.buffers as unknown, "importState(state).buffers");
    for (const name of Object.keys(this.state) as StateBufferName[]) {
      const data = state.buffers[name];
      if (!(data instanceof Float32Array))
        throw new InvalidArgumentError(`importState: buffer "${name}" is missing (the state was made with other options)`);
      if (data.length !== this.params.length)
        throw new SizeMismatchError(`importState: buffer "${name}" has ${data.length} elements, expected ${this.params.length}`);
    }
    const lr = checkNumber(state.lr, 'importState: lr', 0, Number.MAX_VALUE);
    for (const [name, buffer] of Object.entries(this.state) as [StateBufferName, FlatBuffer][])
      buffer.array.set(state.buffers[name] as Float32Array);
    this.stepCount = step;
    this.skipped = Number.isInteger(state.skippedSteps) && state.skippedSteps >= 0 ? state.skippedSteps : 0;
    this.learningRate = lr;
  }

  /** Frees the state buffers (not the ParamSet). */
  dispose(): void {
    if (this.isDisposed) return;
    if (this.inFlight) throw new BusyError('Optimizer.dispose(): a step() is in flight; await it first');
    for (const b of Object.values(this.state)) b.dispose();
    this.isDisposed = true;
  }

  /** Optimizer-specific part of the native configuration. */
  protected abstract optimizerConfig(firstStep: boolean): NativeUpdateConfig;

  private nativeConfig(): NativeUpdateConfig {
    const first = this.stepCount === 0;
    const config: NativeUpdateConfig = {
      ...this.optimizerConfig(first),
      lr: this.learningRate,
      weightDecay: this.weightDecay,
      gradScale: this.gradScaleValue,
      step: this.stepCount + 1,
    };
    if (this.compensation) {
      config.compensation = CompensationKind[this.compensation.kind];
      config.compensationLambda = this.compensation.lambda;
      config.compensationEps = this.compensation.eps;
    }
    const p = this.prediction;
    if (p?.kind === 'sapipe') {
      config.prediction = PredictionKind.shadowStep;
      config.estimate = EstimateKind[p.estimate];
      config.compensateEstimate = p.compensate;
      config.worldSize = p.worldSize;
      config.localGradScale = p.localGradScale;
      config.havePrevLocal = !first;
    } else if (p?.kind === 'linear') {
      config.prediction = PredictionKind.linear;
      config.predictionSteps = p.steps;
    }
    return config;
  }

  private checkUsable(what: string): void {
    if (this.isDisposed) throw new DisposedError(`Optimizer.${what}: the optimizer was disposed; create a new one`);
    this.params.checkLive(`${what} (optimizer)`);
  }

  private prepare(inputs: StepInputs, what: string): [NativeUpdateConfig, NativeUpdateBuffers] {
    this.checkUsable(what);
    if (this.inFlight) throw new BusyError(`Optimizer.${what}(): a step() is in flight; await it before stepping again`);
    checkObject(inputs as unknown, `${what}(inputs)`);
    const grad = inputs.grad ?? this.params.grads;
    const needsLocal = this.prediction?.kind === 'sapipe' && this.prediction.estimate !== 'prev-sync';
    if (needsLocal && !inputs.localGrad)
      throw new InvalidArgumentError(`Optimizer.${what}(): the '${this.prediction?.kind === 'sapipe' ? this.prediction.estimate : ''}' estimate needs inputs.localGrad`);
    for (const [name, b] of [['grad', inputs.grad], ['localGrad', inputs.localGrad]] as const) {
      if (b === undefined) continue;
      if (!(b instanceof FlatBuffer)) throw new InvalidArgumentError(`Optimizer.${what}(): inputs.${name} must be a FlatBuffer`);
      if (b.length !== this.params.length)
        throw new SizeMismatchError(`Optimizer.${what}(): inputs.${name} has ${b.length} elements, the ParamSet ${this.params.length}`);
    }
    if (inputs.gradChecked !== undefined && typeof inputs.gradChecked !== 'boolean')
      throw new InvalidArgumentError(`Optimizer.${what}(): inputs.gradChecked must be a boolean`);
    const config = this.nativeConfig();
    config.gradChecked = inputs.gradChecked ?? false;
    const s = this.state;
    // Delay compensation's w_c before the first step is the current weights: the first update has
    // no staleness, so it is not compensated.
    if (this.stepCount === 0 && s.backup) {
      const backup = s.backup;
      callNative(() => nativeAddon().copy(backup.handle, this.params.weights.handle));
    }
    const buffers: NativeUpdateBuffers = {
      weights: this.params.weights.handle,
      grad: grad.handle,
      momentum: s.momentum?.handle,
      secondMoment: s.secondMoment?.handle,
      backup: s.backup?.handle,
      predicted: s.predicted?.handle,
      localGrad: needsLocal ? inputs.localGrad?.handle : undefined,
      prevLocalGrad: s.prevLocalGrad?.handle,
    };
    return [config, buffers];
  }

  private finish(result: NativeUpdateResult): StepResult {
    if (result.applied) {
      this.stepCount += 1;
      this.skippedInARow = 0;
    } else {
      this.skipped += 1;
      this.skippedInARow += 1;
      // One overflowed step skipped is the guard doing its job; a run of them means the loop feeds
      // non-finite gradients and the model has stopped training. Said once per run of skips.
      if (this.skippedInARow === NON_FINITE_WARNING_STEPS) warnSkippedSteps(this.params, this.skippedInARow, result.nonFiniteCount);
    }
    return { applied: result.applied, nonFiniteCount: result.nonFiniteCount, step: this.stepCount };
  }
}

/**
 * Steps in a row the non-finite guard may skip before the optimizer warns (once per run of skips)
 * through `process.emitWarning`, code `SAPIPE_NON_FINITE_STEPS`: `process.on('warning', ...)`
 * receives it; Node prints it to stderr unless warnings are silenced. @category Optimizers
 */
export const NON_FINITE_WARNING_STEPS = 10;

/** The warning of a run of skipped steps, naming the first tensor whose host gradient holds NaN or Inf. */
function warnSkippedSteps(params: ParamSet, steps: number, lastCount: number): void {
  let where = 'no tensor of the ParamSet\'s host gradient holds one now (a device or staged gradient, or one written elsewhere)';
  if (!params.disposed)
    for (const name of params.names) {
      if (params.view(params.grads, name).some((x) => !Number.isFinite(x))) {
        where = `the first in tensor "${name}"`;
        break;
      }
    }
  process.emitWarning(
    `${steps} optimizer steps in a row were skipped: their gradients held NaN or Inf (${lastCount} non-finite values in the last; ${where}). ` +
      'The weights have not changed since. Check the loss and the gradients your backward pass writes (reading a wrong property gives NaN), ' +
      'the learning rate, and with loss scaling its initScale.',
    { code: 'SAPIPE_NON_FINITE_STEPS' },
  );
}

/**
 * @internal A copy of `source`: into `into` when it is a Float32Array of the same length (an
 * earlier snapshot the caller is done with: memory already touched, so the copy runs at memcpy
 * speed instead of faulting in fresh pages), else a new array.
 */
export function copyInto(source: Float32Array, into: unknown): Float32Array {
  if (into instanceof Float32Array && into.length === source.length && into.buffer !== source.buffer) {
    into.set(source);
    return into;
  }
  return source.slice();
}
