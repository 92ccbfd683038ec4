/**
 * A multilayer perceptron (Linear, ReLU, ..., Linear) with softmax cross-entropy, on one ParamSet
 * (tensors `layer{i}.weight` [out, in] and `layer{i}.bias` [out]), so one optimizer call updates
 * the whole model. Every step is an operation of the model-operation table (ops.ts): on the CPU
 * the native SGEMM and loops over FlatBuffers, on `cuda:N` cuBLAS and the plugin's kernels over
 * DeviceBuffers, enqueued without waiting. Activations grow to the largest batch seen and are reused.
 *
 *   const model = new MLP([784, 128, 10], { seed: 1 });
 *   model.forward(x, batch, optimizer.forwardWeights); // logits [batch, 10]
 *   const loss = model.loss(labels);                   // mean over the batch, keeps dLogits
 *   model.backward();                                  // into model.params.grads
 *
 * On a GPU the same loop reads and writes a DeviceParamSet (`model.params` stays the host copy
 * the initial weights come from), and nothing returns to the host but the loss when it is read:
 *
 *   const model = new MLP([784, 128, 10], { seed: 1, device: 'cuda:0' });
 *   const onDevice = DeviceParamSet.create(model.params, { device: 'cuda:0', optimizer });
 *   model.forwardLogits(x, batch, onDevice.forwardWeights);
 *   model.loss(labels, { read: false });                 // NaN: the loss stays on the device
 *   model.backward(onDevice.grads);
 *   onDevice.step();
 */
import { DisposedError, InvalidArgumentError, SizeMismatchError } from '../errors.js';
import { FlatBuffer, ParamSet, type MemorySource } from '../tensor.js';
import { seededRandom } from '../data/seeded-random.js';
import { biasUniform, kaimingUniform } from './init.js';
import { Linear } from './linear.js';
import { modelDevice, relu, reluGrad, softmaxXent, type Device, type ModelDevice, type Tensor } from './ops.js';
import { checkArrayLike, checkOptions, describeValue, optionKeys } from '../validate.js';
import type { GradientListener, ReportsGradients } from './gradient-listener.js';

/** @category Models */
export interface MLPOptions {
  /** Seed of the initial weights (default 0). */
  seed?: number;
  /**
   * Where the parameters (and their optimizer's state) are allocated, e.g. the communicator, so
   * that collectives on the ucx backend read the ranks' buffers in shared memory. See ParamSetOptions.
   */
  memory?: MemorySource;
  /**
   * Where forward and backward run: `cpu` (default) or `cuda:N`. On a device the weights and
   * gradients passed in are DeviceBuffers on it (a DeviceParamSet's), and so are the activations.
   */
  device?: Device;
}

const MLP_OPTION_KEYS = optionKeys<MLPOptions>({ seed: true, memory: true, device: true });

/**
 * A multi-layer perceptron (Linear + ReLU layers, softmax cross-entropy) on one ParamSet: the
 * reference model of the demo and the tests. `forward` can read predicted weights; `backward`
 * writes every gradient.
 *
 * @category Models
 */
export class MLP implements ReportsGradients {
  readonly sizes: readonly number[];
  readonly params: ParamSet;
  readonly layers: readonly Linear[];
  /** Where forward and backward run. */
  readonly device: Device;
  private readonly memory: ModelDevice;
  /** activations[i] is the output of layer i. */
  private readonly activations: Tensor[] = [];
  private input: Tensor | undefined;
  private gradA: Tensor | undefined;
  private gradB: Tensor | undefined;
  /** Labels as floats, per-row losses and per-row hits of the last loss() or accuracy(). */
  private labels: Tensor | undefined;
  private losses: Tensor | undefined;
  private hits: Tensor | undefined;
  private capacity = 0;
  /** What the last forward pass read, needed by backward. */
  private last: { x: Tensor; batch: number; weights: Tensor } | undefined;
  private haveLossGrad = false;
  private isDisposed = false;
  private gradientListener: GradientListener | undefined;

  constructor(sizes: readonly number[], options: MLPOptions = {}) {
    checkOptions(options, MLP_OPTION_KEYS, 'MLP(sizes, options)');
    if (!Array.isArray(sizes) || sizes.length < 2)
      throw new InvalidArgumentError('MLP: give at least an input and an output size, e.g. [784, 128, 10]');
    for (const s of sizes)
      if (!Number.isInteger(s) || s < 1 || s > 1 << 24) throw new InvalidArgumentError(`MLP: layer sizes must be integers in [1, 2^24], got ${describeValue(s)}`);
    const seed = options.seed ?? 0;
    if (!Number.isInteger(seed)) throw new InvalidArgumentError(`MLP: seed must be an integer, got ${describeValue(seed)}`);
    this.memory = modelDevice(options.device ?? 'cpu');
    this.device = this.memory.device;
    this.sizes = Object.freeze([...sizes]);
    const spec: Array<[string, number[]]> = [];
    for (let i = 0; i + 1 < sizes.length; i++) {
      spec.push([`layer${i}.weight`, [sizes[i + 1]!, sizes[i]!]], [`layer${i}.bias`, [sizes[i + 1]!]]);
    }
    this.params = new ParamSet(spec, options.memory === undefined ? {} : { memory: options.memory });
    this.layers = Object.freeze(spec.filter((_, j) => j % 2 === 0).map((_, i) => new Linear(this.params, `layer${i}.weight`, `layer${i}.bias`)));
    const next = seededRandom(seed);
    for (const layer of this.layers) {
      kaimingUniform(this.params.view(this.params.weights, layer.weight.name), layer.inFeatures, next);
      biasUniform(this.params.view(this.params.weights, layer.bias.name), layer.inFeatures, next);
    }
  }

  /** Number of parameters (weights and biases of every layer). */
  get numParams(): number {
    return this.params.numParams;
  }

  get inFeatures(): number {
    return this.sizes[0]!;
  }
  get classes(): number {
    return this.sizes[this.sizes.length - 1]!;
  }
  get disposed(): boolean {
    return this.isDisposed;
  }

  /**
   * Logits [batch, classes] of x [batch, inFeatures] (row-major), computed with the weights in
   * `weights` (default the model's own on the CPU; e.g. an optimizer's predicted weights), copied
   * to the host: on a device this waits for the device. The returned array is valid until the
   * next forward pass. Training loops that only need the loss call {@link forwardLogits}.
   */
  forward(x: Tensor | Float32Array, batch: number, weights?: Tensor): Float32Array {
    const logits = this.forwardLogits(x, batch, weights);
    const n = batch * this.classes;
    return logits instanceof FlatBuffer ? logits.array.subarray(0, n) : this.memory.read(logits, n);
  }

  /**
   * The forward pass without copying anything back: returns the logits tensor (at least batch x
   * classes values, in the model's memory), valid until the next forward pass. `x` is a tensor in
   * the model's memory, or host values copied in.
   */
  forwardLogits(x: Tensor | Float32Array, batch: number, weights?: Tensor): Tensor {
    this.checkLive('forward');
    if (!Number.isInteger(batch) || batch < 1) throw new InvalidArgumentError(`MLP.forward: batch must be a positive integer, got ${describeValue(batch)}`);
    const w = this.checkLayout(weights, 'MLP.forward: weights', this.params.weights);
    const need = batch * this.inFeatures;
    let input: Tensor;
    if (x instanceof Float32Array) {
      if (x.length < need) throw new SizeMismatchError(`MLP.forward: x holds ${x.length} values, batch x ${this.inFeatures} needs ${need}`);
      this.reserve(batch);
      input = this.input!;
      this.memory.write(input, x.length === need ? x : x.subarray(0, need));
    } else if (this.memory.holds(x)) {
      if (x.disposed) throw new DisposedError('MLP.forward: the input buffer was disposed');
      if (x.length < need) throw new SizeMismatchError(`MLP.forward: x holds ${x.length} values, batch x ${this.inFeatures} needs ${need}`);
      this.reserve(batch);
      input = x;
    } else throw new InvalidArgumentError(`MLP.forward: x must be a Float32Array or a ${this.tensorKind()}`);
    let current = input;
    this.layers.forEach((layer, i) => {
      const out = this.activations[i]!;
      layer.forward({ buffer: current }, batch, { buffer: out }, w);
      if (i + 1 < this.layers.length) relu({ buffer: out }, { buffer: out }, batch * layer.outFeatures);
      current = out;
    });
    this.last = { x: input, batch, weights: w };
    this.haveLossGrad = false;
    return current;
  }

  /**
   * Mean softmax cross-entropy of the last forward pass against `labels`; keeps dLogits for
   * backward(). `labels` are class numbers, checked and copied in, or a tensor in the model's
   * memory holding them as floats (e.g. a whole data set's labels placed on the device once;
   * not checked: a value that is no class number gives a NaN loss and no gradient for its row).
   * With `{ read: false }` the loss is not copied back (no wait for a device) and NaN is returned.
   */
  loss(labels: ArrayLike<number> | Tensor, options: { read?: boolean } = {}): number {
    this.checkLive('loss');
    checkOptions(options, ['read'], 'MLP.loss(labels, options)');
    if (!this.last) throw new InvalidArgumentError('MLP.loss: call forward(x, batch) first');
    const { batch } = this.last;
    const labelTensor = this.labelTensor(labels, batch, 'MLP.loss');
    const logits = this.activations[this.layers.length - 1]!;
    softmaxXent({ buffer: logits }, { buffer: labelTensor }, batch, this.classes, 1 / batch, { losses: { buffer: this.losses! }, dlogits: { buffer: this.gradA! } });
    this.haveLossGrad = true;
    if (options.read === false) return Number.NaN;
    return sum(this.memory.read(this.losses!, batch)) / batch;
  }

  /**
   * Backpropagates the dLogits of the last loss() call and writes (not accumulates) every gradient
   * into `grads`, a buffer with the ParamSet's layout (default the ParamSet's own gradients on the
   * CPU; a DeviceParamSet's `grads` on a device). With `inputGrad`, also writes the loss's gradient
   * with respect to the input [batch, inFeatures] there (for a layer below the MLP, e.g. embeddings).
   */
  backward(grads?: Tensor, inputGrad?: Tensor): void {
    this.checkLive('backward');
    const g = this.checkLayout(grads, 'MLP.backward: grads', this.params.grads);
    if (inputGrad !== undefined) {
      if (!this.memory.holds(inputGrad)) throw new InvalidArgumentError(`MLP.backward: inputGrad must be a ${this.tensorKind()} or left out`);
      if (inputGrad.disposed) throw new DisposedError('MLP.backward: inputGrad was disposed');
      const need = (this.last?.batch ?? 0) * this.inFeatures;
      if (inputGrad.length < need) throw new SizeMismatchError(`MLP.backward: inputGrad holds ${inputGrad.length} values, batch x ${this.inFeatures} needs ${need}`);
    }
    if (!this.last || !this.haveLossGrad) throw new InvalidArgumentError('MLP.backward: call forward(x, batch) and then loss(labels) first');
    const { x, batch, weights } = this.last;
    if (x.disposed) throw new DisposedError('MLP.backward: the input buffer of the forward pass was disposed');
    // The gradient ping-pongs between two buffers: layer i reads dY from one and writes dX to the other.
    let dy = this.gradA!;
    let dx = this.gradB!;
    for (let i = this.layers.length - 1; i >= 0; i--) {
      const layer = this.layers[i]!;
      const input = i === 0 ? x : this.activations[i - 1]!;
      const dInput = i === 0 ? (inputGrad === undefined ? undefined : { buffer: inputGrad }) : { buffer: dx };
      // The parameter gradients first, so that the listener hears of them before dX is computed.
      layer.weightGrad({ buffer: input }, { buffer: dy }, batch, g);
      if (this.gradientListener) {
        this.gradientListener(g, layer.weight.offset, layer.weight.size);
        this.gradientListener(g, layer.bias.offset, layer.bias.size);
      }
      if (dInput) layer.inputGrad({ buffer: dy }, batch, dInput, weights);
      if (i > 0) {
        reluGrad({ buffer: dx }, { buffer: input }, { buffer: dx }, batch * layer.inFeatures);
        [dy, dx] = [dx, dy];
      }
    }
    // dLogits were consumed (overwritten by the ping-pong).
    this.haveLossGrad = false;
  }

  /**
   * Calls `listener` in every later backward pass after each layer's weight and bias gradients are
   * written (on a device: enqueued), from the last layer to the first, once per tensor with its
   * range in the gradient buffer. The data-parallel trainer listens to reduce the gradient bucket
   * by bucket while the backward runs. Undefined stops.
   */
  setGradientListener(listener: GradientListener | undefined): void {
    if (listener !== undefined && typeof listener !== 'function')
      throw new InvalidArgumentError(`MLP.setGradientListener: listener must be a function or undefined, got ${describeValue(listener)}`);
    this.gradientListener = listener;
  }

  /** Fraction of rows whose largest logit is at the label, with `weights` (default the model's own on the CPU). */
  accuracy(x: Tensor | Float32Array, labels: ArrayLike<number>, weights?: Tensor): number {
    this.checkLive('accuracy');
    checkArrayLike(labels, 'MLP.accuracy(x, labels): labels');
    const batch = labels.length;
    if (batch < 1) throw new InvalidArgumentError('MLP.accuracy: give at least one label');
    for (let r = 0; r < batch; r++) {
      const l = labels[r]!;
      if (!Number.isInteger(l) || l < 0 || l >= this.classes)
        throw new InvalidArgumentError(`MLP.accuracy: label ${describeValue(l)} at row ${r} is not an integer class in [0, ${this.classes})`);
    }
    const logits = this.forwardLogits(x, batch, weights);
    this.writeLabels(labels, batch, 'MLP.accuracy');
    softmaxXent({ buffer: logits }, { buffer: this.labels! }, batch, this.classes, 1 / batch, { losses: { buffer: this.losses! }, correct: { buffer: this.hits! } });
    return sum(this.memory.read(this.hits!, batch)) / batch;
  }

  /** Frees the activation buffers and the host parameters (not a DeviceParamSet made from them). Idempotent. */
  dispose(): void {
    if (this.isDisposed) return;
    this.isDisposed = true;
    this.freeActivations();
    this.last = undefined;
    this.params.dispose();
  }

  /** The labels as a tensor in the model's memory: `labels` itself when it is one, else checked and copied in. */
  private labelTensor(labels: ArrayLike<number> | Tensor, batch: number, what: string): Tensor {
    if (this.memory.holds(labels)) {
      if (labels.disposed) throw new DisposedError(`${what}: the labels tensor was disposed`);
      if (labels.length < batch) throw new SizeMismatchError(`${what}: the labels tensor holds ${labels.length} values for a batch of ${batch}`);
      return labels;
    }
    if (labels instanceof FlatBuffer || (typeof labels === 'object' && labels !== null && 'handle' in labels))
      throw new InvalidArgumentError(`${what}: labels must be class numbers or a ${this.tensorKind()}`);
    checkArrayLike(labels, `${what}(labels): labels`);
    this.writeLabels(labels as ArrayLike<number>, batch, what);
    return this.labels!;
  }

  private writeLabels(labels: ArrayLike<number>, batch: number, what: string): void {
    if (labels.length !== batch) throw new SizeMismatchError(`${what}: ${labels.length} labels for a batch of ${batch}; give one label per row`);
    const values = new Float32Array(batch);
    for (let r = 0; r < batch; r++) {
      const label = labels[r]!;
      if (!Number.isInteger(label) || label < 0 || label >= this.classes)
        throw new InvalidArgumentError(`${what}: label ${describeValue(label)} at row ${r} is not an integer class in [0, ${this.classes})`);
      values[r] = label;
    }
    this.memory.write(this.labels!, values);
  }

  private freeActivations(): void {
    for (const b of [...this.activations, this.input, this.gradA, this.gradB, this.labels, this.losses, this.hits]) b?.dispose();
    this.activations.length = 0;
  }

  private reserve(batch: number): void {
    if (batch <= this.capacity) return;
    this.freeActivations();
    const allocate = (n: number): Tensor => this.memory.allocate(n);
    this.input = allocate(batch * this.inFeatures);
    for (const layer of this.layers) this.activations.push(allocate(batch * layer.outFeatures));
    const widest = Math.max(...this.sizes);
    this.gradA = allocate(batch * widest);
    this.gradB = allocate(batch * widest);
    this.labels = allocate(batch);
    this.losses = allocate(batch);
    this.hits = allocate(batch);
    this.capacity = batch;
    this.last = undefined;
  }

  private tensorKind(): string {
    return this.device === 'cpu' ? 'FlatBuffer' : `DeviceBuffer on ${this.device}`;
  }

  /** The weights or gradients buffer to use: `buffer`, or on the CPU the ParamSet's own (`host`) when left out. */
  private checkLayout(buffer: Tensor | undefined, what: string, host: FlatBuffer): Tensor {
    if (buffer === undefined) {
      if (this.device !== 'cpu')
        throw new InvalidArgumentError(`${what}: the model runs on ${this.device}; pass a DeviceBuffer there with its ParamSet's layout (a DeviceParamSet's forwardWeights or grads)`);
      return host;
    }
    if (!this.memory.holds(buffer)) throw new InvalidArgumentError(`${what} must be a ${this.tensorKind()} with the model's ParamSet layout`);
    if (buffer.disposed) throw new DisposedError(`${what} was disposed`);
    if (buffer instanceof FlatBuffer ? buffer.length !== this.params.length : buffer.length < this.params.length)
      throw new SizeMismatchError(`${what} has ${buffer.length} elements, the model's ParamSet ${this.params.length}; use a buffer with its layout`);
    return buffer;
  }

  private checkLive(what: string): void {
    if (this.isDisposed) throw new DisposedError(`MLP.${what}: the model was disposed; build a new one`);
  }
}

function sum(values: Float32Array): number {
  let total = 0;
  for (const v of values) total += v;
  return total;
}
