/**
 * A sequential model of `lib/nn` layers that can be cut into pipeline stages. The model is
 * described by data (a list of {@link LayerSpec}s and a seed), so that every stage worker builds
 * its own part from the same description: part k of a cut holds exactly the layers, and the
 * initial weights, that the unpartitioned model holds for them.
 *
 * Each part owns one ParamSet (tensors `layer{i}.weight` / `layer{i}.bias`, with `i` the layer's
 * index in the whole model) and implements {@link StageModel}: the forward pass of a micro-batch
 * keeps what its backward needs under the micro-batch's slot until the backward releases it, so a
 * stage can hold several micro-batches in flight (1F1B, PipeDream) and read a different weight
 * buffer in each pass (stashed or predicted versions).
 */
import { DisposedError, InvalidArgumentError, SizeMismatchError } from '../errors.js';
import { seededRandom } from '../data/seeded-random.js';
import { FlatBuffer, ParamSet } from '../tensor.js';
import { checkInteger, checkObject, checkOptions, describeValue, optionKeys } from '../validate.js';
import { biasUniform, kaimingUniform } from './init.js';
import { Linear } from './linear.js';
import { relu, reluGrad } from './ops.js';
import type { StageBackwardOptions, StageModel } from './stage-model.js';

/** One layer of a {@link Sequential} model. @category Models */
export type LayerSpec = { readonly kind: 'linear'; readonly in: number; readonly out: number } | { readonly kind: 'relu' };

/** The layers of an MLP: Linear, ReLU, ..., Linear (sizes [784, 256, 10] gives 3 layers). @category Models */
export function mlpLayers(sizes: readonly number[]): LayerSpec[] {
  if (!Array.isArray(sizes) || sizes.length < 2) throw new InvalidArgumentError('mlpLayers(sizes): give at least an input and an output size, e.g. [784, 128, 10]');
  const layers: LayerSpec[] = [];
  for (let i = 0; i + 1 < sizes.length; i++) {
    const inF = checkInteger(sizes[i], `mlpLayers: sizes[${i}]`, 1, 1 << 24);
    const outF = checkInteger(sizes[i + 1], `mlpLayers: sizes[${i + 1}]`, 1, 1 << 24);
    layers.push({ kind: 'linear', in: inF, out: outF });
    if (i + 2 < sizes.length) layers.push({ kind: 'relu' });
  }
  return layers;
}

/** @category Models Checks a layer list: known kinds, positive sizes, each layer's input the previous output. Returns the feature counts between layers. */
export function checkLayers(layers: readonly LayerSpec[], label: string = 'layers'): number[] {
  const what = typeof label === 'string' ? label : 'layers';
  if (!Array.isArray(layers) || layers.length === 0) throw new InvalidArgumentError(`${what} must be a non-empty array of layers, e.g. mlpLayers([784, 256, 10])`);
  const widths: number[] = [];
  layers.forEach((layer: LayerSpec, i) => {
    checkObject(layer, `${what}[${i}]`);
    if (layer.kind === 'linear') {
      const inF = checkInteger(layer.in, `${what}[${i}].in`, 1, 1 << 24);
      const outF = checkInteger(layer.out, `${what}[${i}].out`, 1, 1 << 24);
      if (widths.length > 0 && widths[widths.length - 1] !== inF)
        throw new SizeMismatchError(`${what}[${i}] is linear ${inF} -> ${outF}, but the layer before outputs ${widths[widths.length - 1]} features; make them agree`);
      if (widths.length === 0) widths.push(inF);
      widths.push(outF);
    } else if (layer.kind === 'relu') {
      if (widths.length === 0) throw new InvalidArgumentError(`${what}[${i}]: the first layer must be linear (it fixes the input size)`);
      widths.push(widths[widths.length - 1]!);
    } else throw new InvalidArgumentError(`${what}[${i}].kind must be 'linear' or 'relu', got ${describeValue((layer as { kind?: unknown }).kind)}`);
  });
  return widths;
}

/** The parameter count of each layer (0 for ReLU). @category Models */
export function layerParams(layers: readonly LayerSpec[]): number[] {
  checkLayers(layers);
  return layers.map((l) => (l.kind === 'linear' ? l.out * l.in + l.out : 0));
}

/**
 * The initial weights of every linear layer of the whole model, drawn from one seeded stream in
 * layer order (weights then bias, as {@link MLP} draws them), so a part's weights do not depend on
 * how the model is cut.
 */
function initialWeights(layers: readonly LayerSpec[], seed: number): Map<number, { weight: Float32Array; bias: Float32Array }> {
  const next = seededRandom(seed);
  const out = new Map<number, { weight: Float32Array; bias: Float32Array }>();
  layers.forEach((l, i) => {
    if (l.kind !== 'linear') return;
    const weight = new Float32Array(l.out * l.in);
    const bias = new Float32Array(l.out);
    kaimingUniform(weight, l.in, next);
    biasUniform(bias, l.in, next);
    out.set(i, { weight, bias });
  });
  return out;
}

/** What the forward pass of one micro-batch keeps for its backward. */
interface SlotContext {
  input: FlatBuffer;
  batch: number;
  weights: FlatBuffer;
  /** Output of each layer of the part. */
  outputs: FlatBuffer[];
  /** Gradient at each linear layer's output, kept by backward(weightGrad: false) for weightGrad(). */
  layerGrads: Map<number, FlatBuffer> | undefined;
}

/** @category Models */
export interface SequentialOptions {
  /** Seed of the initial weights (default 0). */
  seed?: number;
  /** The part of the model this object holds: layers [start, end) (default: all of them). */
  range?: readonly [number, number];
}
const SEQUENTIAL_OPTION_KEYS = optionKeys<SequentialOptions>({ seed: true, range: true });

/**
 * A sequential model (or one contiguous part of it) of Linear and ReLU layers on one ParamSet,
 * usable alone (forward, loss, backward like {@link MLP}) and as a pipeline stage
 * ({@link StageModel}). Build the parts of a pipeline with {@link Sequential.part}.
 *
 * @category Models
 */
export class Sequential implements StageModel {
  readonly layers: readonly LayerSpec[];
  /** Index in the whole model of this part's first layer, and one past its last. */
  readonly start: number;
  readonly end: number;
  readonly params: ParamSet;
  readonly inputSize: number;
  readonly outputSize: number;
  private readonly linears = new Map<number, Linear>();
  private readonly widths: number[];
  private readonly slots = new Map<number, SlotContext>();
  private readonly pool = new Map<number, FlatBuffer[]>();
  private isDisposed = false;

  constructor(layers: readonly LayerSpec[], options: SequentialOptions = {}) {
    checkOptions(options, SEQUENTIAL_OPTION_KEYS, 'Sequential(layers, options)');
    const widths = checkLayers(layers);
    const seed = options.seed ?? 0;
    if (!Number.isInteger(seed)) throw new InvalidArgumentError(`Sequential: seed must be an integer, got ${describeValue(seed)}`);
    if (options.range !== undefined && (!Array.isArray(options.range) || options.range.length !== 2))
      throw new InvalidArgumentError(`Sequential: range must be [start, end), got ${describeValue(options.range)}`);
    const [start, end] = options.range ?? [0, layers.length];
    checkInteger(start, 'Sequential: range[0]', 0, layers.length - 1);
    checkInteger(end, 'Sequential: range[1]', start + 1, layers.length);
    this.layers = Object.freeze(layers.map((l) => Object.freeze({ ...l })));
    this.start = start;
    this.end = end;
    this.widths = widths.slice(start, end + 1);
    this.inputSize = this.widths[0]!;
    this.outputSize = this.widths[this.widths.length - 1]!;
    const spec: Array<[string, number[]]> = [];
    for (let i = start; i < end; i++) {
      const l = this.layers[i]!;
      if (l.kind === 'linear') spec.push([`layer${i}.weight`, [l.out, l.in]], [`layer${i}.bias`, [l.out]]);
    }
    // A part without parameters (only ReLUs) still gets a ParamSet of one element, so that every
    // stage has weights and an optimizer and the runtime needs no special case.
    this.params = new ParamSet(spec.length > 0 ? spec : [['unused', [1]]]);
    const init = initialWeights(this.layers, seed);
    for (let i = start; i < end; i++) {
      if (this.layers[i]!.kind !== 'linear') continue;
      const linear = new Linear(this.params, `layer${i}.weight`, `layer${i}.bias`);
      this.linears.set(i, linear);
      this.params.view(this.params.weights, `layer${i}.weight`).set(init.get(i)!.weight);
      this.params.view(this.params.weights, `layer${i}.bias`).set(init.get(i)!.bias);
    }
  }

  /**
   * Part `index` of the model cut at `boundaries` (the first layer of every part but the first, in
   * increasing order: [2, 4] cuts 6 layers into [0, 2), [2, 4), [4, 6)).
   */
  static part(layers: readonly LayerSpec[], boundaries: readonly number[], index: number, options: { seed?: number } = {}): Sequential {
    checkOptions(options, ['seed'], 'Sequential.part(layers, boundaries, index, options)');
    checkLayers(layers, 'Sequential.part: layers');
    const ranges = partRanges(layers.length, boundaries);
    checkInteger(index, 'Sequential.part: index', 0, ranges.length - 1);
    return new Sequential(layers, { ...options, range: ranges[index]! });
  }

  get disposed(): boolean {
    return this.isDisposed;
  }
  /** Micro-batches whose forward ran and whose backward has not released them. */
  get liveSlots(): number {
    return this.slots.size;
  }

  /** The input and every layer's output of `batch` samples: what a forward keeps for its backward. */
  activationFloats(batch: number): number {
    checkInteger(batch, 'Sequential.activationFloats: batch', 1, 1 << 24);
    return batch * this.widths.reduce((a, b) => a + b, 0);
  }

  forward(slot: number, input: FlatBuffer, batch: number, weights: FlatBuffer = this.params.weights): FlatBuffer {
    this.checkLive('forward');
    checkInteger(slot, 'Sequential.forward: slot', 0, Number.MAX_SAFE_INTEGER);
    checkInteger(batch, 'Sequential.forward: batch', 1, 1 << 24);
    if (this.slots.has(slot)) throw new InvalidArgumentError(`Sequential.forward: slot ${slot} already holds a micro-batch; release it first`);
    this.checkLayout(weights, 'forward: weights');
    if (!(input instanceof FlatBuffer) || input.disposed) throw new InvalidArgumentError('Sequential.forward: input must be a live FlatBuffer');
    if (input.length < batch * this.inputSize)
      throw new SizeMismatchError(`Sequential.forward: input holds ${input.length} values, batch x ${this.inputSize} needs ${batch * this.inputSize}`);
    const outputs: FlatBuffer[] = [];
    let current = input;
    for (let i = this.start; i < this.end; i++) {
      const l = this.layers[i]!;
      const width = this.widths[i - this.start + 1]!;
      const out = this.take(batch * width);
      if (l.kind === 'linear') this.linears.get(i)!.forward({ buffer: current }, batch, { buffer: out }, weights);
      else relu({ buffer: out }, { buffer: current }, batch * width);
      outputs.push(out);
      current = out;
    }
    this.slots.set(slot, { input, batch, weights, outputs, layerGrads: undefined });
    return current;
  }

  backward(slot: number, gradOutput: FlatBuffer, options: StageBackwardOptions): FlatBuffer | undefined {
    this.checkLive('backward');
    const ctx = this.slots.get(slot);
    if (!ctx) throw new InvalidArgumentError(`Sequential.backward: slot ${describeValue(slot)} holds no forward pass; run forward first`);
    checkObject(options, 'Sequential.backward(slot, gradOutput, options)');
    const weights = options.weights ?? ctx.weights;
    this.checkLayout(weights, 'backward: weights');
    this.checkLayout(options.grads, 'backward: grads');
    const { batch } = ctx;
    if (!(gradOutput instanceof FlatBuffer) || gradOutput.length < batch * this.outputSize)
      throw new SizeMismatchError(`Sequential.backward: gradOutput must be a FlatBuffer of at least batch x ${this.outputSize} values`);
    const wantInput = options.inputGrad ?? true;
    const doWeights = options.weightGrad ?? true;
    const accumulate = options.accumulate ?? false;
    const layerGrads = doWeights ? undefined : new Map<number, FlatBuffer>();
    // dy: the gradient at the current layer's output. Buffers this part took go back to the pool
    // as soon as they are consumed, except those kept for a later weightGrad().
    let dy = gradOutput;
    let dyOwned = false;
    for (let i = this.end - 1; i >= this.start; i--) {
      const l = this.layers[i]!;
      const j = i - this.start;
      const input = j === 0 ? ctx.input : ctx.outputs[j - 1]!;
      const needDx = i > this.start || wantInput;
      const width = this.widths[j]!;
      let kept = false;
      let dx: FlatBuffer | undefined;
      if (l.kind === 'linear') {
        const linear = this.linears.get(i)!;
        if (doWeights) linear.weightGrad({ buffer: input }, { buffer: dy }, batch, options.grads, accumulate);
        else {
          layerGrads!.set(i, dyOwned ? dy : this.copyOf(dy, batch * l.out));
          kept = dyOwned;
        }
        if (needDx) {
          dx = this.take(batch * width);
          linear.inputGrad({ buffer: dy }, batch, { buffer: dx }, weights);
        }
      } else if (needDx) {
        dx = this.take(batch * width);
        reluGrad({ buffer: dx }, { buffer: ctx.outputs[j]! }, { buffer: dy }, batch * width);
      }
      if (dyOwned && !kept) this.give(dy);
      if (!dx) {
        dyOwned = false;
        break;
      }
      dy = dx;
      dyOwned = true;
    }
    if (doWeights) this.release(slot);
    else ctx.layerGrads = layerGrads;
    return wantInput && dyOwned ? dy : undefined;
  }

  weightGrad(slot: number, options: { grads: FlatBuffer; accumulate?: boolean }): void {
    this.checkLive('weightGrad');
    const ctx = this.slots.get(slot);
    if (!ctx || !ctx.layerGrads) throw new InvalidArgumentError(`Sequential.weightGrad: slot ${describeValue(slot)} has no backward(weightGrad: false) pending`);
    checkObject(options, 'Sequential.weightGrad(slot, options)');
    this.checkLayout(options.grads, 'weightGrad: grads');
    for (const [i, dy] of ctx.layerGrads) {
      const j = i - this.start;
      const input = j === 0 ? ctx.input : ctx.outputs[j - 1]!;
      this.linears.get(i)!.weightGrad({ buffer: input }, { buffer: dy }, ctx.batch, options.grads, options.accumulate ?? false);
    }
    this.release(slot);
  }

  /** Frees what the forward pass of `slot` kept (backward and weightGrad call it). The input buffer passed to forward stays the caller's. */
  release(slot: number): void {
    const ctx = this.slots.get(slot);
    if (!ctx) return;
    this.slots.delete(slot);
    for (const b of ctx.outputs) this.give(b);
    for (const b of ctx.layerGrads?.values() ?? []) this.give(b);
  }

  /** Gives back a buffer returned by backward() (the input gradient) once the caller is done with it. */
  recycle(buffer: FlatBuffer): void {
    if (buffer instanceof FlatBuffer && !buffer.disposed) this.give(buffer);
  }

  dispose(): void {
    if (this.isDisposed) return;
    this.isDisposed = true;
    for (const slot of [...this.slots.keys()]) this.release(slot);
    for (const list of this.pool.values()) for (const b of list) b.dispose();
    this.pool.clear();
    this.params.dispose();
  }

  /** A buffer of `length` elements from the pool. */
  private take(length: number): FlatBuffer {
    const list = this.pool.get(length);
    return list?.pop() ?? FlatBuffer.allocate(length);
  }
  private give(buffer: FlatBuffer): void {
    const list = this.pool.get(buffer.length) ?? [];
    list.push(buffer);
    this.pool.set(buffer.length, list);
  }
  private copyOf(buffer: FlatBuffer, length: number): FlatBuffer {
    const copy = this.take(length);
    copy.array.set(buffer.array.subarray(0, length));
    return copy;
  }

  private checkLayout(buffer: FlatBuffer, what: string): void {
    if (!(buffer instanceof FlatBuffer) || buffer.disposed || buffer.length !== this.params.length)
      throw new SizeMismatchError(`Sequential.${what} must be a live FlatBuffer with the part's ParamSet layout (${this.params.length} elements)`);
  }
  private checkLive(what: string): void {
    if (this.isDisposed) throw new DisposedError(`Sequential.${what}: the model was disposed; build a new one`);
  }
}

/** The [start, end) layer ranges of a cut; throws a typed error for boundaries that do not cut `count` layers into non-empty parts. @category Models */
export function partRanges(count: number, boundaries: readonly number[]): Array<[number, number]> {
  checkInteger(count, 'partRanges(count, boundaries): count', 1, 1 << 24);
  if (!Array.isArray(boundaries)) throw new InvalidArgumentError(`boundaries must be an array of layer indices, got ${describeValue(boundaries)}`);
  const ranges: Array<[number, number]> = [];
  let start = 0;
  for (const [i, b] of boundaries.entries()) {
    if (typeof b !== 'number' || !Number.isInteger(b) || b <= start || b >= count)
      throw new InvalidArgumentError(
        `boundaries[${i}] = ${describeValue(b)}: each boundary must be a layer index greater than the previous one and below the layer count ${count}, so that every part holds at least one layer`,
      );
    ranges.push([start, b]);
    start = b;
  }
  ranges.push([start, count]);
  return ranges;
}

/**
 * Cuts `layers` into `parts` contiguous parts with the most even total cost (the largest part's
 * cost as small as possible, then the parts as even as possible), given a cost per layer, e.g.
 * measured times or parameter counts. Returns the boundaries for {@link Sequential.part}.
 *
 * @category Models
 */
export function balancedBoundaries(costs: readonly number[], parts: number): number[] {
  if (!Array.isArray(costs) || costs.length === 0) throw new InvalidArgumentError('balancedBoundaries(costs, parts): costs must be a non-empty array, one per layer');
  costs.forEach((c, i) => {
    if (typeof c !== 'number' || !Number.isFinite(c) || c < 0) throw new InvalidArgumentError(`balancedBoundaries: costs[${i}] must be a finite number >= 0, got ${describeValue(c)}`);
  });
  const n = costs.length;
  checkInteger(parts, 'balancedBoundaries: parts', 1, n);
  const prefix = [0];
  for (const c of costs) prefix.push(prefix[prefix.length - 1]! + c);
  // best[p][i]: for the first i layers in p parts, the smallest largest-part cost and, among cuts
  // reaching it, the smallest sum of squared part costs (so that the parts not on the critical
  // path are balanced too, instead of any cut that keeps under the largest).
  type Cost = { max: number; squares: number };
  const better = (a: Cost, b: Cost): boolean => a.max < b.max - 1e-12 || (Math.abs(a.max - b.max) <= 1e-12 && a.squares < b.squares - 1e-12);
  const best: Cost[][] = Array.from({ length: parts + 1 }, () => Array.from({ length: n + 1 }, () => ({ max: Infinity, squares: Infinity })));
  const cut: number[][] = Array.from({ length: parts + 1 }, () => new Array<number>(n + 1).fill(0));
  best[0]![0] = { max: 0, squares: 0 };
  for (let p = 1; p <= parts; p++) {
    for (let i = p; i <= n; i++) {
      for (let j = p - 1; j < i; j++) {
        const part = prefix[i]! - prefix[j]!;
        const before = best[p - 1]![j]!;
        const value = { max: Math.max(before.max, part), squares: before.squares + part * part };
        if (better(value, best[p]![i]!)) {
          best[p]![i] = value;
          cut[p]![i] = j;
        }
      }
    }
  }
  const boundaries: number[] = [];
  let i = n;
  for (let p = parts; p > 1; p--) {
    i = cut[p]![i]!;
    boundaries.unshift(i);
  }
  return boundaries;
}
