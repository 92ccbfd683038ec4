/**
 * `sapipe/tfjs`: train a TensorFlow.js model with sapipe's fused updates, all-reduce and
 * trainers, without rewriting it. The model keeps its own forward and backward (tfjs computes the
 * gradients); sapipe holds the weights, gradients and optimizer state in a ParamSet laid out from
 * the model's trainable weights, and writes into the model's variables the weights its forward
 * must read (the predicted ones under weight prediction).
 *
 * ```js
 * import * as tf from '@tensorflow/tfjs';
 * import { TfjsParams } from 'sapipe/tfjs';
 * const tp = TfjsParams.fromModel(tf, model, { memory: comm });
 * const trainer = await DataParallelTrainer.create({ comm, params: tp.params, mode: 'sapipe-wp', optimizer });
 * for (const batch of batches) {
 *   tp.writeWeights(trainer.forwardWeights);               // what this step's forward reads
 *   trainer.zeroGrad();
 *   tp.computeGradients(() => tf.losses.softmaxCrossEntropy(batch.ys, model.apply(batch.xs)));
 *   await trainer.step();
 * }
 * ```
 *
 * Any flavour of TensorFlow.js works (`@tensorflow/tfjs`, `-node`, `-node-gpu`): the adapter uses
 * the `tf` namespace it is given, so its tensors live in the caller's engine. `@tensorflow/tfjs-core`
 * is an optional peer dependency; importing this module without it is a BackendUnavailableError
 * that says what to install.
 */
import { createRequire } from 'node:module';

import type { NamedTensorMap, Scalar, Tensor, Variable } from '@tensorflow/tfjs-core';

import { BackendUnavailableError, InvalidArgumentError, SizeMismatchError } from '../errors.js';
import type { StageBackwardOptions, StageModel } from '../nn/stage-model.js';
import { FlatBuffer, ParamSet, type ParamSetOptions } from '../tensor.js';
import { checkOptions, describeValue, optionKeys } from '../validate.js';

/**
 * @internal Throws BackendUnavailableError unless `pkg` resolves from this module: the import-time
 * check that TensorFlow.js is installed.
 */
export function requirePackage(pkg: string, from: string = import.meta.url): void {
  try {
    createRequire(from).resolve(pkg);
  } catch {
    throw new BackendUnavailableError(
      `sapipe/tfjs needs TensorFlow.js, and ${pkg} is not installed: npm install @tensorflow/tfjs (or @tensorflow/tfjs-node for its native backend)`,
    );
  }
}
requirePackage('@tensorflow/tfjs-core');

/** The part of a TensorFlow.js namespace the adapter uses (`import * as tf from '@tensorflow/tfjs'`). @category TensorFlow.js */
export interface TfjsNamespace {
  tensor(values: Float32Array, shape: number[], dtype: 'float32'): Tensor;
  variableGrads(f: () => Scalar, varList?: Variable[]): { value: Scalar; grads: NamedTensorMap };
}

/** A trainable weight of a tfjs model (a LayersModel's `trainableWeights` entry). @category TensorFlow.js */
export interface TfjsWeightLike {
  readonly name: string;
  /** Concrete for a built model's weights (tfjs types a shape's dimensions as `number | null`). */
  readonly shape: readonly (number | null)[];
  readonly dtype?: string;
  /** The weight's value (a tf.Variable behind a LayersModel's weights, though typed as a Tensor). */
  read(): Tensor;
  write(value: Tensor): unknown;
}

/** A tfjs model: anything with `trainableWeights` (a `tf.LayersModel`, a layer). @category TensorFlow.js */
export interface TfjsModelLike {
  readonly trainableWeights: readonly TfjsWeightLike[];
}

/** Options of {@link TfjsParams.fromModel}. @category TensorFlow.js */
export interface TfjsParamsOptions {
  /** Where the ParamSet's buffers come from (a communicator: shared memory for its collectives). */
  memory?: ParamSetOptions['memory'];
}
const OPTION_KEYS = optionKeys<TfjsParamsOptions>({ memory: true });

/** Options of {@link TfjsParams.computeGradients} and {@link TfjsParams.writeGradients}. @category TensorFlow.js */
export interface TfjsGradientOptions {
  /** Add to the gradient buffer (micro-batches of one update) instead of overwriting it. Default false. */
  accumulate?: boolean;
  /** The buffer of the ParamSet's layout the gradients go into. Default `params.grads`. */
  into?: FlatBuffer;
}
const GRADIENT_OPTION_KEYS = optionKeys<TfjsGradientOptions>({ accumulate: true, into: true });

/**
 * A ParamSet laid out from a tfjs model's trainable weights (one tensor per weight, named and
 * shaped as in the model), with the copies between the two: gradients from tfjs into
 * `params.grads`, weights from a buffer of the ParamSet's layout into the model's variables. One
 * copy per tensor each way, and no tfjs tensor left behind (`tf.memory().numTensors` stays flat).
 *
 * @category TensorFlow.js
 */
export class TfjsParams {
  /** The model's weights as sapipe tensors: give it to an optimizer or a trainer. */
  readonly params: ParamSet;

  private constructor(
    private readonly tf: TfjsNamespace,
    private readonly model: TfjsModelLike,
    /** @internal */
    readonly weights: readonly TfjsWeightLike[],
    params: ParamSet,
  ) {
    this.params = params;
  }

  /**
   * The model still has the weights the ParamSet was laid out from (the same variables, in the
   * same order, of the same shapes): a model rebuilt or grown since would otherwise be written
   * into the wrong places, or not at all.
   */
  private checkModel(what: string): void {
    this.params.checkLive(what);
    const now = this.model.trainableWeights;
    const same =
      now.length === this.weights.length &&
      now.every((w, i) => w === this.weights[i] && w.shape.length === this.params.layout(w.name).shape.length && w.shape.every((d, j) => d === this.params.layout(w.name).shape[j]));
    if (!same)
      throw new SizeMismatchError(
        `${what}: the model's trainable weights changed since its ParamSet was made (${this.weights.length} then, ${now.length} now, or other variables or shapes); make a new TfjsParams.fromModel and a new trainer`,
      );
  }

  /** Lays out a ParamSet from `model.trainableWeights` and copies the model's current weights into it. */
  static fromModel(tf: TfjsNamespace, model: TfjsModelLike, options: TfjsParamsOptions = {}): TfjsParams {
    if (tf === null || typeof tf !== 'object' || typeof tf.tensor !== 'function' || typeof tf.variableGrads !== 'function')
      throw new InvalidArgumentError(`TfjsParams.fromModel(tf, model): tf must be the TensorFlow.js namespace (import * as tf from '@tensorflow/tfjs'), got ${describeValue(tf)}`);
    const list = (model as { trainableWeights?: unknown } | null)?.trainableWeights;
    if (!Array.isArray(list) || list.length === 0)
      throw new InvalidArgumentError(`TfjsParams.fromModel(tf, model): model must have trainable weights (a tf.LayersModel, built), got ${describeValue(model)}`);
    checkOptions(options, OPTION_KEYS, 'TfjsParams.fromModel(tf, model, options)');
    const weights = list as TfjsWeightLike[];
    for (const w of weights) {
      if (w === null || typeof w !== 'object' || typeof w.name !== 'string' || !Array.isArray(w.shape) || typeof w.read !== 'function' || typeof w.write !== 'function')
        throw new InvalidArgumentError(`TfjsParams.fromModel: a trainable weight must have name, shape, read() and write(), got ${describeValue(w)}`);
      if (w.shape.some((d) => typeof d !== 'number')) throw new InvalidArgumentError(`TfjsParams.fromModel: weight "${w.name}" has shape ${describeValue(w.shape)}; build the model first`);
      if (w.dtype !== undefined && w.dtype !== 'float32') throw new InvalidArgumentError(`TfjsParams.fromModel: weight "${w.name}" is ${w.dtype}; sapipe trains float32 weights`);
    }
    const params = new ParamSet(
      weights.map((w) => [w.name, [...w.shape] as number[]] as [string, number[]]),
      options.memory === undefined ? {} : { memory: options.memory },
    );
    const adapter = new TfjsParams(tf, model, [...weights], params);
    try {
      adapter.readWeights();
    } catch (error) {
      params.dispose();
      throw error;
    }
    return adapter;
  }

  /** The names of the model's trainable weights, in the ParamSet's order. */
  get names(): string[] {
    return this.weights.map((w) => w.name);
  }

  /** Copies the model's variables into `params.weights` (the real weights sapipe updates). */
  readWeights(): void {
    this.checkModel('TfjsParams.readWeights');
    for (const w of this.weights) {
      const view = this.params.view(this.params.weights, w.name);
      const data = w.read().dataSync();
      if (data.length !== view.length) throw new SizeMismatchError(`TfjsParams.readWeights: weight "${w.name}" holds ${data.length} values, its tensor ${view.length}; was the model rebuilt?`);
      view.set(data);
    }
  }

  /**
   * Writes `source` (a buffer of the ParamSet's layout: `params.weights`, or a trainer's or
   * optimizer's `forwardWeights`) into the model's variables, so that its next forward reads them.
   */
  writeWeights(source: FlatBuffer = this.params.weights): void {
    this.checkModel('TfjsParams.writeWeights');
    if (!(source instanceof FlatBuffer) || source.length !== this.params.length)
      throw new SizeMismatchError(`TfjsParams.writeWeights(source): source must be a FlatBuffer of the ParamSet's length ${this.params.length}, got ${describeValue(source)}`);
    for (const w of this.weights) {
      // A copy: tfjs's CPU backend keeps the array it is given, and sapipe's buffer changes (or is freed) later.
      const t = this.tf.tensor(this.params.view(source, w.name).slice(), [...w.shape] as number[], 'float32');
      try {
        w.write(t);
      } finally {
        t.dispose();
      }
    }
  }

  /**
   * Runs `lossFn` (the model's forward and loss, returning a scalar) under tfjs's
   * `variableGrads` over the model's trainable weights, writes the gradients into `params.grads`
   * (added with `accumulate`), and returns the loss. Every tensor it made is disposed.
   */
  computeGradients(lossFn: () => Scalar, options: TfjsGradientOptions = {}): number {
    if (typeof lossFn !== 'function') throw new InvalidArgumentError(`TfjsParams.computeGradients(lossFn): lossFn must be a function returning a scalar, got ${describeValue(lossFn)}`);
    checkOptions(options, GRADIENT_OPTION_KEYS, 'TfjsParams.computeGradients(lossFn, options)');
    this.checkModel('TfjsParams.computeGradients');
    const { value, grads } = this.tf.variableGrads(lossFn, this.weights.map((w) => variableOf(w)));
    try {
      this.writeGradients(grads, options);
      return value.dataSync()[0]!;
    } finally {
      value.dispose();
      for (const g of Object.values(grads)) g.dispose();
    }
  }

  /** Copies gradients keyed by weight name (what `tf.variableGrads` returns) into `params.grads`; the caller keeps them. */
  writeGradients(grads: NamedTensorMap, options: TfjsGradientOptions = {}): void {
    if (grads === null || typeof grads !== 'object') throw new InvalidArgumentError(`TfjsParams.writeGradients(grads): grads must map weight names to tensors, got ${describeValue(grads)}`);
    checkOptions(options, GRADIENT_OPTION_KEYS, 'TfjsParams.writeGradients(grads, options)');
    this.checkModel('TfjsParams.writeGradients');
    const accumulate = options.accumulate ?? false;
    if (typeof accumulate !== 'boolean') throw new InvalidArgumentError(`TfjsParams: accumulate must be a boolean, got ${describeValue(accumulate)}`);
    const into = options.into ?? this.params.grads;
    if (!(into instanceof FlatBuffer) || into.length !== this.params.length)
      throw new SizeMismatchError(`TfjsParams.writeGradients: into must be a FlatBuffer of the ParamSet's length ${this.params.length}, got ${describeValue(into)}`);
    // Every gradient is read and checked before any is written: a bad one leaves the buffer as it was.
    const reads: { data: ArrayLike<number>; view: Float32Array }[] = [];
    for (const w of this.weights) {
      const g: unknown = grads[variableOf(w).name] ?? grads[w.name];
      if (g === undefined) throw new InvalidArgumentError(`TfjsParams.writeGradients: no gradient for weight "${w.name}" (does the loss depend on it?)`);
      if (g === null || typeof g !== 'object' || typeof (g as { dataSync?: unknown }).dataSync !== 'function')
        throw new InvalidArgumentError(`TfjsParams.writeGradients: the gradient of "${w.name}" must be a tf.Tensor, got ${describeValue(g)}`);
      let data: unknown;
      try {
        data = (g as { dataSync(): unknown }).dataSync();
      } catch (error) {
        throw new InvalidArgumentError(`TfjsParams.writeGradients: cannot read the gradient of "${w.name}" (disposed?): ${(error as Error)?.message ?? describeValue(error)}`, { cause: error });
      }
      if (!ArrayBuffer.isView(data) || data instanceof DataView || data instanceof BigInt64Array || data instanceof BigUint64Array)
        throw new InvalidArgumentError(`TfjsParams.writeGradients: the gradient of "${w.name}" must hold numbers, got ${describeValue(data)}`);
      const view = this.params.view(into, w.name);
      const values = data as unknown as ArrayLike<number>;
      if (values.length !== view.length) throw new SizeMismatchError(`TfjsParams.writeGradients: the gradient of "${w.name}" holds ${values.length} values, the weight ${view.length}`);
      reads.push({ data: values, view });
    }
    for (const { data, view } of reads) {
      if (accumulate) for (let i = 0; i < view.length; i++) view[i]! += data[i]!;
      else view.set(data);
    }
  }
}

/** The tf.Variable behind a weight (what `variableGrads` differentiates against). */
function variableOf(w: TfjsWeightLike): Variable {
  const v = w.read() as Partial<Variable>;
  if (typeof v.assign !== 'function' || typeof v.name !== 'string')
    throw new InvalidArgumentError(`TfjsParams: weight "${w.name}" does not read as a tf.Variable; pass a tfjs model's trainableWeights`);
  return v as Variable;
}

/** A tfjs model that maps a batch of inputs to outputs (a `tf.LayersModel`). @category TensorFlow.js */
export interface TfjsLayersModelLike extends TfjsModelLike {
  readonly inputs: readonly { readonly shape: readonly (number | null)[] }[];
  readonly outputs: readonly { readonly shape: readonly (number | null)[] }[];
  /** Typed loosely: a real LayersModel's apply also returns symbolic tensors (for tensors in, it returns a tensor). */
  apply(input: Tensor): unknown;
}

/** The part of a TensorFlow.js namespace a {@link TfjsStage} uses besides {@link TfjsNamespace}. @category TensorFlow.js */
export interface TfjsStageNamespace extends TfjsNamespace {
  variable(initialValue: Tensor, trainable?: boolean, name?: string): Variable;
  mul(a: Tensor, b: Tensor): Tensor;
  sum(x: Tensor): Scalar;
  reshape(x: Tensor, shape: number[]): Tensor;
}

/**
 * A tfjs sub-model as a pipeline stage (a {@link StageModel}): its forward and backward run
 * through tfjs, its weights, update and transfers through sapipe. The forward keeps the
 * micro-batch's input; the backward runs the forward again under tfjs's gradient tape, at the
 * weights the forward read (a stashed or predicted version included), and takes the
 * vector-Jacobian product with the output's gradient: activations are recomputed rather than kept
 * (tfjs's tape lives inside one call). A module exporting `createStage(part, parts)` that returns
 * one plugs into `PipelineTrainer({ model: { module, parts } })`.
 *
 * @category TensorFlow.js
 */
export class TfjsStage implements StageModel {
  readonly params: ParamSet;
  readonly inputSize: number;
  readonly outputSize: number;
  private readonly adapter: TfjsParams;
  private readonly inputShape: number[];
  private readonly slots = new Map<number, { input: Float32Array; batch: number; weights: FlatBuffer }>();

  constructor(
    private readonly tf: TfjsStageNamespace,
    private readonly model: TfjsLayersModelLike,
  ) {
    if (tf === null || typeof tf !== 'object' || typeof tf.variable !== 'function' || typeof tf.mul !== 'function' || typeof tf.sum !== 'function' || typeof tf.reshape !== 'function')
      throw new InvalidArgumentError(`TfjsStage(tf, model): tf must be the TensorFlow.js namespace, got ${describeValue(tf)}`);
    const shapeOf = (list: unknown, what: string): number[] => {
      const shape = Array.isArray(list) && list.length === 1 ? (list[0] as { shape?: unknown }).shape : undefined;
      if (!Array.isArray(shape) || shape.length < 2 || shape.slice(1).some((d) => typeof d !== 'number' || !Number.isInteger(d) || d < 1))
        throw new InvalidArgumentError(`TfjsStage: the model must have one ${what} of a known shape [batch, ...], got ${describeValue(shape)}`);
      return shape.slice(1) as number[];
    };
    if (model === null || typeof model !== 'object' || typeof model.apply !== 'function')
      throw new InvalidArgumentError(`TfjsStage(tf, model): model must be a tf.LayersModel, got ${describeValue(model)}`);
    this.inputShape = shapeOf(model.inputs, 'input');
    const outputShape = shapeOf(model.outputs, 'output');
    this.inputSize = this.inputShape.reduce((a, b) => a * b, 1);
    this.outputSize = outputShape.reduce((a, b) => a * b, 1);
    this.adapter = TfjsParams.fromModel(tf, model);
    this.params = this.adapter.params;
  }

  forward(slot: number, input: FlatBuffer, batch: number, weights: FlatBuffer): FlatBuffer {
    const x = input.array.slice(0, batch * this.inputSize);
    this.slots.set(slot, { input: x, batch, weights });
    this.adapter.writeWeights(weights);
    const y = this.run(x, batch);
    try {
      const out = FlatBuffer.allocate(batch * this.outputSize);
      out.array.set(y.dataSync());
      return out;
    } finally {
      y.dispose();
    }
  }

  backward(slot: number, gradOutput: FlatBuffer, options: StageBackwardOptions): FlatBuffer | undefined {
    const saved = this.slots.get(slot);
    if (saved === undefined) throw new InvalidArgumentError(`TfjsStage.backward: no forward in slot ${slot}`);
    if (options.weightGrad === false) throw new InvalidArgumentError('TfjsStage: a split backward (weightGrad: false) is not offered; use a schedule without zero-bubble splits');
    this.slots.delete(slot);
    const { input, batch } = saved;
    // A tfjs stage runs on the host: writeWeights and writeGradients refuse device buffers, typed.
    this.adapter.writeWeights((options.weights ?? saved.weights) as FlatBuffer);
    const tf = this.tf;
    const xTensor = tf.tensor(input, [batch, ...this.inputShape], 'float32');
    const dy = tf.tensor(gradOutput.array.slice(0, batch * this.outputSize), [batch * this.outputSize], 'float32');
    const wantInput = options.inputGrad ?? true;
    const x = wantInput ? tf.variable(xTensor, true) : undefined;
    try {
      // d/dw sum(f(x) * dy) = the vector-Jacobian product of f with dy, for the weights and the input.
      const { value, grads } = tf.variableGrads(() => {
        const y = this.model.apply(x ?? xTensor) as Tensor;
        return tf.sum(tf.mul(tf.reshape(y, [batch * this.outputSize]), dy));
      }, [...this.adapter.weights.map((w) => variableOf(w)), ...(x ? [x] : [])]);
      try {
        this.adapter.writeGradients(grads, { into: options.grads as FlatBuffer, accumulate: options.accumulate ?? false });
        if (!x) return undefined;
        const gx = grads[x.name]!;
        const out = FlatBuffer.allocate(batch * this.inputSize);
        out.array.set(gx.dataSync());
        return out;
      } finally {
        value.dispose();
        for (const g of Object.values(grads)) g.dispose();
      }
    } finally {
      xTensor.dispose();
      dy.dispose();
      x?.dispose();
    }
  }

  activationFloats(batch: number): number {
    return batch * this.inputSize;
  }

  recycle(buffer: FlatBuffer): void {
    buffer.dispose();
  }

  dispose(): void {
    this.slots.clear();
    this.params.dispose();
  }

  private run(x: Float32Array, batch: number): Tensor {
    const tf = this.tf;
    const xTensor = tf.tensor(x, [batch, ...this.inputShape], 'float32');
    try {
      return this.model.apply(xTensor) as Tensor;
    } finally {
      xTensor.dispose();
    }
  }
}
