/**
 * A multilayer perceptron (Linear, ReLU, ..., Linear) with softmax cross-entropy, on one ParamSet
 * (tensors `layer{i}.weight` [out, in] and `layer{i}.bias` [out]), so one optimizer call updates
 * the whole model. Matrix products run on the native SGEMM; activations live in FlatBuffers that
 * grow to the largest batch seen and are reused.
 *
 *   const model = new MLP([784, 128, 10], { seed: 1 });
 *   model.forward(x, batch, optimizer.forwardWeights); // logits [batch, 10]
 *   const loss = model.loss(labels);                   // mean over the batch, keeps dLogits
 *   model.backward();                                  // into model.params.grads
 */
import { DisposedError, InvalidArgumentError, SizeMismatchError } from '../errors.js';
import { FlatBuffer, ParamSet, type MemorySource } from '../tensor.js';
import { seededRandom } from '../data/seeded-random.js';
import { biasUniform, kaimingUniform } from './init.js';
import { Linear } from './linear.js';
import { reluBackward, reluForward } from './relu.js';
import { softmaxCrossEntropy } from './softmax-cross-entropy.js';
import { checkArrayLike, checkOptions, describeValue, optionKeys } from '../validate.js';

/** @category Models */
export interface MLPOptions {
  /** Seed of the initial weights (default 0). */
  seed?: number;
  /**
   * Where the parameters (and their optimizer's state) are allocated, e.g. the communicator, so
   * that collectives on the ucx backend read the ranks' buffers in shared memory. See ParamSetOptions.
   */
  memory?: MemorySource;
}

const MLP_OPTION_KEYS = optionKeys<MLPOptions>({ seed: true, memory: true });

/**
 * A multi-layer perceptron (Linear + ReLU layers, softmax cross-entropy) on one ParamSet: the
 * reference model of the demo and the tests. `forward` can read predicted weights; `backward`
 * writes every gradient.
 *
 * @category Models
 */
export class MLP {
  readonly sizes: readonly number[];
  readonly params: ParamSet;
  readonly layers: readonly Linear[];
  /** activations[0] is the input copy (when given as a Float32Array); activations[i + 1] the output of layer i. */
  private readonly activations: FlatBuffer[] = [];
  private input: FlatBuffer | undefined;
  private gradA: FlatBuffer | undefined;
  private gradB: FlatBuffer | undefined;
  private capacity = 0;
  /** What the last forward pass read, needed by backward. */
  private last: { x: FlatBuffer; batch: number; weights: FlatBuffer } | undefined;
  private haveLossGrad = false;
  private isDisposed = false;

  constructor(sizes: readonly number[], options: MLPOptions = {}) {
    checkOptions(options, MLP_OPTION_KEYS, 'MLP(sizes, options)');
    if (!Array.isArray(sizes) || sizes.length < 2)
      throw new InvalidArgumentError('MLP: give at least an input and an output size, e.g. [784, 128, 10]');
    for (const s of sizes)
      if (!Number.isInteger(s) || s < 1 || s > 1 << 24) throw new InvalidArgumentError(`MLP: layer sizes must be integers in [1, 2^24], got ${describeValue(s)}`);
    const seed = options.seed ?? 0;
    if (!Number.isInteger(seed)) throw new InvalidArgumentError(`MLP: seed must be an integer, got ${describeValue(seed)}`);
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
   * `weights` (default the model's own; e.g. an optimizer's predicted weights). The returned view
   * is valid until the next forward pass.
   */
  forward(x: FlatBuffer | Float32Array, batch: number, weights: FlatBuffer = this.params.weights): Float32Array {
    this.checkLive('forward');
    if (!Number.isInteger(batch) || batch < 1) throw new InvalidArgumentError(`MLP.forward: batch must be a positive integer, got ${describeValue(batch)}`);
    this.checkLayout(weights, 'MLP.forward: weights');
    const need = batch * this.inFeatures;
    let input: FlatBuffer;
    if (x instanceof FlatBuffer) {
      if (x.disposed) throw new DisposedError('MLP.forward: the input buffer was disposed');
      if (x.length < need) throw new SizeMismatchError(`MLP.forward: x holds ${x.length} values, batch x ${this.inFeatures} needs ${need}`);
      this.reserve(batch);
      input = x;
    } else if (x instanceof Float32Array) {
      if (x.length < need) throw new SizeMismatchError(`MLP.forward: x holds ${x.length} values, batch x ${this.inFeatures} needs ${need}`);
      this.reserve(batch);
      input = this.input!;
      input.array.set(x.subarray(0, need));
    } else throw new InvalidArgumentError('MLP.forward: x must be a FlatBuffer or a Float32Array');
    let current = input;
    this.layers.forEach((layer, i) => {
      const out = this.activations[i]!;
      layer.forward({ buffer: current }, batch, { buffer: out }, weights);
      if (i + 1 < this.layers.length) reluForward(out.array.subarray(0, batch * layer.outFeatures));
      current = out;
    });
    this.last = { x: input, batch, weights };
    this.haveLossGrad = false;
    return current.array.subarray(0, batch * this.classes);
  }

  /** Mean softmax cross-entropy of the last forward pass against `labels`; keeps dLogits for backward(). */
  loss(labels: ArrayLike<number>): number {
    this.checkLive('loss');
    checkArrayLike(labels, 'MLP.loss(labels): labels');
    if (!this.last) throw new InvalidArgumentError('MLP.loss: call forward(x, batch) first');
    const { batch } = this.last;
    const logits = this.activations[this.layers.length - 1]!.array;
    const value = softmaxCrossEntropy(logits, labels, batch, this.classes, this.gradA!.array);
    this.haveLossGrad = true;
    return value;
  }

  /**
   * Backpropagates the dLogits of the last loss() call and writes (not accumulates) every gradient
   * into `grads`, a buffer with the ParamSet's layout (default the ParamSet's own gradients). With
   * `inputGrad`, also writes the loss's gradient with respect to the input [batch, inFeatures]
   * there (for a layer below the MLP, e.g. embeddings).
   */
  backward(grads: FlatBuffer = this.params.grads, inputGrad?: FlatBuffer): void {
    this.checkLive('backward');
    this.checkLayout(grads, 'MLP.backward: grads');
    if (inputGrad !== undefined) {
      if (!(inputGrad instanceof FlatBuffer)) throw new InvalidArgumentError('MLP.backward: inputGrad must be a FlatBuffer or left out');
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
      layer.backward({ buffer: input }, { buffer: dy }, batch, dInput, grads, weights);
      if (i > 0) {
        reluBackward(input.array.subarray(0, batch * layer.inFeatures), dx.array.subarray(0, batch * layer.inFeatures));
        [dy, dx] = [dx, dy];
      }
    }
    // dLogits were consumed (overwritten by the ping-pong).
    this.haveLossGrad = false;
  }

  /** Fraction of rows whose largest logit is at the label, with `weights` (default the model's own). */
  accuracy(x: FlatBuffer | Float32Array, labels: ArrayLike<number>, weights?: FlatBuffer): number {
    this.checkLive('accuracy');
    checkArrayLike(labels, 'MLP.accuracy(x, labels): labels');
    const batch = labels.length;
    if (batch < 1) throw new InvalidArgumentError('MLP.accuracy: give at least one label');
    for (let r = 0; r < batch; r++) {
      const l = labels[r]!;
      if (!Number.isInteger(l) || l < 0 || l >= this.classes)
        throw new InvalidArgumentError(`MLP.accuracy: label ${describeValue(l)} at row ${r} is not an integer class in [0, ${this.classes})`);
    }
    const logits = this.forward(x, batch, weights);
    const classes = this.classes;
    let correct = 0;
    for (let r = 0; r < batch; r++) {
      let best = 0;
      for (let j = 1; j < classes; j++) if (logits[r * classes + j]! > logits[r * classes + best]!) best = j;
      if (best === labels[r]) correct++;
    }
    return correct / batch;
  }

  /** Frees the parameters and activation buffers. Idempotent. */
  dispose(): void {
    if (this.isDisposed) return;
    this.isDisposed = true;
    for (const b of [...this.activations, this.input, this.gradA, this.gradB]) b?.dispose();
    this.activations.length = 0;
    this.last = undefined;
    this.params.dispose();
  }

  private reserve(batch: number): void {
    if (batch <= this.capacity) return;
    for (const b of [...this.activations, this.input, this.gradA, this.gradB]) b?.dispose();
    this.activations.length = 0;
    this.input = FlatBuffer.allocate(batch * this.inFeatures);
    for (const layer of this.layers) this.activations.push(FlatBuffer.allocate(batch * layer.outFeatures));
    const widest = Math.max(...this.sizes);
    this.gradA = FlatBuffer.allocate(batch * widest);
    this.gradB = FlatBuffer.allocate(batch * widest);
    this.capacity = batch;
    this.last = undefined;
  }

  private checkLayout(buffer: FlatBuffer, what: string): void {
    if (!(buffer instanceof FlatBuffer)) throw new InvalidArgumentError(`${what} must be a FlatBuffer with the model's ParamSet layout`);
    if (buffer.disposed) throw new DisposedError(`${what} was disposed`);
    if (buffer.length !== this.params.length)
      throw new SizeMismatchError(`${what} has ${buffer.length} elements, the model's ParamSet ${this.params.length}; use a buffer with its layout`);
  }

  private checkLive(what: string): void {
    if (this.isDisposed) throw new DisposedError(`MLP.${what}: the model was disposed; build a new one`);
  }
}
