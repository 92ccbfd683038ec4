/**
 * A ParamSet on a device: DeviceParamSet keeps its weights, gradients and optimizer state in
 * device memory (DeviceBuffers laid out as on the host), so an optimizer step, or the NCCL fused
 * all-reduce + step, runs there. Checks and errors as DeviceBuffer's (./buffer.ts).
 */
import { DisposedError, InvalidArgumentError, SizeMismatchError } from '../errors.js';
import { callNative } from '../native.js';
import type { Optimizer, StateBufferName, StepResult } from '../optim/optimizer.js';
import { ALIGN_ELEMENTS, type FlatBuffer, type ParamSet } from '../tensor.js';
import { describeValue } from '../validate.js';
import { checkDeviceOptions, DeviceBuffer, type DeviceOptions } from './buffer.js';
import { cudaAddon, type CudaUpdateBuffers } from './cuda-native.js';
import type { CudaDevice } from './device-spec.js';

/** @category Tensors and memory */
export interface DeviceParamSetOptions extends DeviceOptions {
  /**
   * The optimizer whose state moves to the device with the parameters; needed by step() and the
   * NCCL fused step. Its hyperparameters and step count keep living in it; its host state
   * buffers are left alone until copyToHost().
   */
  optimizer?: Optimizer;
  /**
   * Pads the device buffers to a multiple of 16 x shards elements (zeros that stay zero), so the
   * sharded NCCL step can split them evenly: pass the world size. Default 1.
   */
  shards?: number;
}

/** Device state buffers a step writes, mirroring the optimizer's host ones. */
type DeviceState = Partial<Record<StateBufferName, DeviceBuffer>>;

/**
 * A ParamSet's weights and gradients (and its optimizer's state) in device memory, laid out as
 * on the host (tensors at the same offsets), so one kernel launch covers the whole set. The host
 * ParamSet stays the source of the layout and the staging area for initialisation and checkpoints.
 *
 * @category Tensors and memory
 */
export class DeviceParamSet {
  readonly params: ParamSet;
  readonly optimizer: Optimizer | undefined;
  /** Elements of each device buffer: the host length padded for `shards`. */
  readonly length: number;
  private readonly state: DeviceState;
  private weightBuffer: DeviceBuffer;
  private gradBuffer: DeviceBuffer;
  private isDisposed = false;

  private constructor(params: ParamSet, optimizer: Optimizer | undefined, weights: DeviceBuffer, grads: DeviceBuffer, state: DeviceState) {
    this.params = params;
    this.optimizer = optimizer;
    this.weightBuffer = weights;
    this.gradBuffer = grads;
    this.state = state;
    this.length = weights.length;
  }

  /**
   * Allocates the device copy of `params` (and of `options.optimizer`'s state) on
   * `options.device` and copies the host values in.
   */
  static create(params: ParamSet, options: DeviceParamSetOptions): DeviceParamSet {
    if (params === null || typeof params !== 'object' || typeof (params as ParamSet).checkLive !== 'function')
      throw new InvalidArgumentError('DeviceParamSet.create(params): params must be a ParamSet');
    params.checkLive('DeviceParamSet.create');
    const index = checkDeviceOptions(options, 'DeviceParamSet.create');
    const optimizer = options.optimizer;
    if (optimizer !== undefined) {
      if (optimizer === null || typeof optimizer !== 'object' || typeof (optimizer as Optimizer).beginStep !== 'function')
        throw new InvalidArgumentError('DeviceParamSet.create: options.optimizer must be an Optimizer');
      if (optimizer.params !== params) throw new InvalidArgumentError('DeviceParamSet.create: options.optimizer optimizes another ParamSet');
    }
    const shards = options.shards ?? 1;
    if (!Number.isInteger(shards) || shards < 1 || shards > 65536)
      throw new InvalidArgumentError(`DeviceParamSet.create: options.shards must be an integer in [1, 65536], got ${describeValue(shards)}`);
    const unit = ALIGN_ELEMENTS * shards;
    const length = Math.ceil(params.length / unit) * unit;
    const device = { device: `cuda:${index}` as CudaDevice };
    const made: DeviceBuffer[] = [];
    const upload = (host: FlatBuffer): DeviceBuffer => {
      const buffer = DeviceBuffer.allocate(length, device);
      made.push(buffer);
      buffer.copyFromHost(host);
      return buffer;
    };
    try {
      const weights = upload(params.weights);
      const grads = upload(params.grads);
      const state: DeviceState = {};
      for (const name of optimizer?.stateNames ?? []) state[name] = upload(optimizer!.stateBuffer(name)!);
      return new DeviceParamSet(params, optimizer, weights, grads, state);
    } catch (error) {
      for (const b of made) b.dispose();
      throw error;
    }
  }

  /** The device weights (a step updates them; an out-of-place step's output takes their place, see exchangeWeights). */
  get weights(): DeviceBuffer {
    return this.weightBuffer;
  }

  /**
   * The device gradients: what a backward pass writes and a step reads. A trainer that reduces one
   * gradient while the next is computed puts a second buffer here at each step (exchangeGrads), so
   * re-read it every step rather than keeping it.
   */
  get grads(): DeviceBuffer {
    return this.gradBuffer;
  }

  /** `cuda:N`. */
  get device(): CudaDevice {
    return this.weights.device;
  }

  get disposed(): boolean {
    return this.isDisposed;
  }

  /** A device state buffer (momentum, secondMoment, backup, predicted, prevLocalGrad), if the optimizer has it. */
  stateBuffer(name: StateBufferName): DeviceBuffer | undefined {
    this.checkLive('stateBuffer');
    return this.state[name];
  }

  /**
   * The weights a forward pass should read: the predicted weights when the optimizer predicts,
   * else the weights. Before the first step the predicted weights are the weights.
   */
  get forwardWeights(): DeviceBuffer {
    this.checkLive('forwardWeights');
    const predicted = this.state.predicted;
    if (!predicted) return this.weights;
    if (this.optimizer?.steps === 0) predicted.copyFrom(this.weights);
    return predicted;
  }

  /**
   * @internal Puts `buffer` in place as the weights and returns the previous ones, as
   * ParamSet.exchangeWeights does on the host: an out-of-place step writes the next weights into a
   * second buffer while the current ones are read, and this swaps them once the step is done.
   */
  exchangeWeights(buffer: DeviceBuffer): DeviceBuffer {
    this.checkExchange(buffer, 'exchangeWeights');
    const previous = this.weightBuffer;
    this.weightBuffer = buffer;
    return previous;
  }

  /**
   * @internal Puts `buffer` in place as the gradients and returns the previous ones, as
   * ParamSet.exchangeGrads does on the host: the staleness-1 trainer reduces the gradient just
   * computed while the backward pass writes the next one into the other buffer.
   */
  exchangeGrads(buffer: DeviceBuffer): DeviceBuffer {
    this.checkExchange(buffer, 'exchangeGrads');
    const previous = this.gradBuffer;
    this.gradBuffer = buffer;
    return previous;
  }

  /** @internal As exchangeWeights, for a state buffer (the predicted weights of an out-of-place step). */
  exchangeStateBuffer(name: StateBufferName, buffer: DeviceBuffer): DeviceBuffer {
    this.checkExchange(buffer, 'exchangeStateBuffer');
    const previous = this.state[name];
    if (!previous) throw new InvalidArgumentError(`DeviceParamSet.exchangeStateBuffer: the optimizer has no '${name}' buffer`);
    this.state[name] = buffer;
    return previous;
  }

  private checkExchange(buffer: DeviceBuffer, what: string): void {
    this.checkLive(what);
    if (!(buffer instanceof DeviceBuffer) || buffer.length !== this.length || buffer.device !== this.device)
      throw new SizeMismatchError(`DeviceParamSet.${what}: the buffer must be a DeviceBuffer of ${this.length} elements on ${this.device}`);
    buffer.checkLive(what);
  }

  /**
   * Copies the host ParamSet's weights and its optimizer's state to the device (after the host
   * values changed: importState(), a restored checkpoint), the inverse of copyToHost().
   */
  copyFromHost(): void {
    this.checkLive('copyFromHost');
    this.params.checkLive('copyFromHost');
    this.weights.copyFromHost(this.params.weights);
    for (const [name, buffer] of Object.entries(this.state) as [StateBufferName, DeviceBuffer][]) {
      const host = this.optimizer?.stateBuffer(name);
      if (host) buffer.copyFromHost(host);
    }
  }

  /** Copies the host ParamSet's gradients to the device (gradients computed on the host). */
  copyGradsFromHost(): void {
    this.checkLive('copyGradsFromHost');
    this.params.checkLive('copyGradsFromHost');
    this.grads.copyFromHost(this.params.grads);
  }

  /**
   * Copies the device weights, gradients and optimizer state back into the host ParamSet and
   * optimizer (before exportState(), a checkpoint, or host use of the weights).
   */
  copyToHost(): void {
    this.checkLive('copyToHost');
    this.params.checkLive('copyToHost');
    this.weights.copyToHost(this.params.weights);
    this.grads.copyToHost(this.params.grads);
    for (const [name, buffer] of Object.entries(this.state) as [StateBufferName, DeviceBuffer][]) {
      const host = this.optimizer?.stateBuffer(name);
      if (host) buffer.copyToHost(host);
    }
  }

  /**
   * One optimizer step on the device (the fused update: optimizer + compensation + prediction +
   * non-finite guard, one launch over the whole set), run to completion.
   */
  step(inputs: { localGrad?: DeviceBuffer; gradChecked?: boolean } = {}): StepResult {
    this.checkLive('step');
    if (inputs === null || typeof inputs !== 'object') throw new InvalidArgumentError('DeviceParamSet.step(inputs) must be an object');
    if (inputs.gradChecked !== undefined && typeof inputs.gradChecked !== 'boolean')
      throw new InvalidArgumentError('DeviceParamSet.step: inputs.gradChecked must be a boolean');
    const optimizer = this.requireOptimizer('step');
    const buffers = this.updateBuffers('step', inputs.localGrad);
    const step = optimizer.beginStep('step', { external: true, gradChecked: inputs.gradChecked ?? false });
    try {
      if (step.firstStep) this.prepareFirstStep();
      const result = callNative(() => cudaAddon().cudaUpdate(step.config, buffers));
      return step.finish(result.applied, result.nonFiniteCount);
    } catch (error) {
      step.finish(false, 0);
      throw error;
    }
  }

  /** Frees the device buffers (not the host ParamSet or optimizer). Idempotent. */
  dispose(): void {
    if (this.isDisposed) return;
    for (const b of [this.weights, this.grads, ...Object.values(this.state)]) b.dispose();
    this.isDisposed = true;
  }

  /** @internal */
  checkLive(what: string): void {
    if (this.isDisposed) throw new DisposedError(`DeviceParamSet.${what}: the DeviceParamSet was disposed`);
    for (const b of [this.weights, this.grads]) b.checkLive(`${what} (DeviceParamSet)`);
  }

  /** @internal */
  requireOptimizer(what: string): Optimizer {
    if (!this.optimizer) throw new InvalidArgumentError(`DeviceParamSet.${what}: create it with { optimizer } to step`);
    return this.optimizer;
  }

  /** @internal The buffers of a step; checks the local gradient the optimizer may need. */
  updateBuffers(what: string, localGrad: DeviceBuffer | undefined): CudaUpdateBuffers {
    const optimizer = this.requireOptimizer(what);
    if (optimizer.readsLocalGrad && localGrad === undefined)
      throw new InvalidArgumentError(`DeviceParamSet.${what}: the optimizer's estimate needs inputs.localGrad (this rank's own gradient, a DeviceBuffer)`);
    if (localGrad !== undefined) {
      if (!(localGrad instanceof DeviceBuffer)) throw new InvalidArgumentError(`DeviceParamSet.${what}: localGrad must be a DeviceBuffer`);
      localGrad.checkLive(`${what} (localGrad)`);
      if (localGrad.length !== this.length)
        throw new SizeMismatchError(`DeviceParamSet.${what}: localGrad has ${localGrad.length} elements, the device set ${this.length}`);
    }
    const s = this.state;
    return {
      weights: this.weights.handle,
      grad: this.grads.handle,
      momentum: s.momentum?.handle,
      secondMoment: s.secondMoment?.handle,
      backup: s.backup?.handle,
      predicted: s.predicted?.handle,
      localGrad: optimizer.readsLocalGrad ? localGrad?.handle : undefined,
      prevLocalGrad: s.prevLocalGrad?.handle,
    };
  }

  /** @internal Delay compensation's w_c before the first step is the current weights. */
  prepareFirstStep(): void {
    this.state.backup?.copyFrom(this.weights);
  }
}
