/**
 * A sequential model of `lib/nn` layers that can be cut into pipeline stages. The model is
 * described by data (a list of {@link LayerSpec}s and a seed), so that every stage worker builds
 * its own part from the same description: part k of a cut holds exactly the layers, and the
 * initial weights, that the unpartitioned model holds for them.
 *
 * Each part owns one ParamSet (tensors `layer{i}.weight` / `layer{i}.bias`, layer norm's
 * `layer{i}.gamma` / `layer{i}.beta`, an embedding's `layer{i}.tokens` / `layer{i}.positions`, a
 * transformer block's `layer{i}.ln1.gamma`, `layer{i}.q.weight` ..., with `i` the layer's index in
 * the whole model) and implements
 * {@link StageModel}: the forward pass of a micro-batch
 * keeps what its backward needs under the micro-batch's slot until the backward releases it, so a
 * stage can hold several micro-batches in flight (1F1B, PipeDream) and read a different weight
 * buffer in each pass (stashed or predicted versions).
 */
import { DisposedError, InvalidArgumentError, SizeMismatchError } from '../errors.js';
import { seededRandom } from '../data/seeded-random.js';
import { FlatBuffer, ParamSet } from '../tensor.js';
import { checkInteger, checkKnownKeys, checkObject, checkOptions, describeValue, optionKeys } from '../validate.js';
import { biasUniform, kaimingUniform } from './init.js';
import { Linear } from './linear.js';
import { add, conv2d, conv2dGrad, embedding, embeddingGrad, gelu, geluGrad, layerNorm, layerNormGrad, MAX_HEAD_DIM, modelDevice, pool2d, pool2dGrad, relu, reluGrad, type Conv2dShape, type Device, type EmbeddingShape, type ModelDevice, type Pool2dShape, type Tensor, type TensorView } from './ops.js';
import { blockBackward, blockForward, blockParams, blockSavedFloats, gaussianInit, type BlockShape } from './transformer.js';
import type { StageBackwardOptions, StageModel } from './stage-model.js';
import type { GradientListener, ReportsGradients } from './gradient-listener.js';

/**
 * One layer of a {@link Sequential} model. Samples are rows of features; an image is its C*H*W
 * values in NCHW order, so a convolution or pooling reads the row as [channels, height, width] and
 * a linear layer after them reads it flattened.
 *
 * - `linear`: weight [out, in] and bias [out]; with `rows` (default 1) a sample is `rows` rows of
 *   `in` values, each mapped alone (`rows * in` features in, `rows * out` out): a language model's
 *   output head is `{ kind: 'linear', in: dim, out: vocab, rows: context }`;
 * - `conv2d`: weight [outChannels, inChannels, kernel, kernel] and bias [outChannels]; stride
 *   (default 1) and zero padding (default 0) on both axes; outChannels * outH * outW features out;
 * - `maxPool` / `avgPool`: kernel x kernel windows at `stride` (default: the kernel), no parameters;
 * - `relu`, `gelu` (tanh form): no parameters, as many features out as in;
 * - `layerNorm`: normalises each sample's `features` values (biased variance, eps 1e-5), then
 *   scales by gamma [features] (initially 1) and shifts by beta (initially 0); with `rows`
 *   (default 1) a sample is `rows` rows of `features` values, each normalised alone (`rows *
 *   features` features in and out): a transformer's final layer norm over each position is
 *   `{ kind: 'layerNorm', features: dim, rows: context }`;
 * - `embedding`: a sample is `context` token ids held as floats (integers below `vocab`), out
 *   `context * dim` values: each position's row of `tokens` [vocab, dim] plus its row of
 *   `positions` [context, dim] (both initially N(0, 0.02), GPT-2's). Only as the first layer (token
 *   ids have no gradient: a part that starts with it returns no input gradient); an id that is
 *   not an integer below vocab gives a NaN row (the op runs on a device too, where it cannot throw);
 * - `transformerBlock`: a pre-LN GPT-2 block over `context` positions of `dim` values (`context *
 *   dim` features in and out): x + proj(attention(LN1(x))), then + fc2(gelu(fc1(LN2(x)))), with
 *   causal attention of `heads` heads (dim a multiple of heads, dim / heads at most 256) and fc1 of
 *   `hidden` units (default 4 * dim). Parameters `ln1.gamma`, `ln1.beta`, `q`, `k`, `v`, `proj`,
 *   `ln2.gamma`, `ln2.beta`, `fc1`, `fc2` (each of those a `.weight` [out, in] and `.bias`); weights
 *   N(0, 0.02), biases 0, layer norms 1 and 0. {@link gptLayers} builds a GPT of them.
 *
 * @category Models
 */
export type LayerSpec =
  | { readonly kind: 'linear'; readonly in: number; readonly out: number; readonly rows?: number }
  | { readonly kind: 'relu' }
  | { readonly kind: 'gelu' }
  | {
      readonly kind: 'conv2d';
      readonly inChannels: number;
      readonly height: number;
      readonly width: number;
      readonly outChannels: number;
      readonly kernel: number;
      readonly stride?: number;
      readonly padding?: number;
    }
  | PoolLayerSpec<'maxPool'>
  | PoolLayerSpec<'avgPool'>
  | { readonly kind: 'layerNorm'; readonly features: number; readonly rows?: number }
  | { readonly kind: 'embedding'; readonly vocab: number; readonly dim: number; readonly context: number }
  | TransformerBlockSpec;

/** The transformer block of {@link LayerSpec}. @category Models */
export interface TransformerBlockSpec {
  readonly kind: 'transformerBlock';
  /** Values per position (the model width); a multiple of `heads`. */
  readonly dim: number;
  readonly heads: number;
  /** Positions per sample. */
  readonly context: number;
  /** Units of the MLP's hidden layer (default 4 * dim). */
  readonly hidden?: number;
}

/** A max- or average-pooling layer of {@link LayerSpec}. @category Models */
export interface PoolLayerSpec<K extends 'maxPool' | 'avgPool' = 'maxPool' | 'avgPool'> {
  readonly kind: K;
  readonly channels: number;
  readonly height: number;
  readonly width: number;
  readonly kernel: number;
  readonly stride?: number;
}

type Spec<K extends LayerSpec['kind']> = Extract<LayerSpec, { kind: K }>;
const MAX_SIZE = 1 << 24;
const MAX_VOCAB = 1 << 24;
/** The standard deviation of GPT-2's initial weights and embeddings. */
const GPT2_STD = 0.02;

/** What a layer kind is: its fields, sizes, parameters and initial values (the one list of kinds). */
interface LayerKind<K extends LayerSpec['kind']> {
  /** The spec's keys besides `kind`. */
  readonly keys: readonly string[];
  /** Checks the fields; returns the features in (undefined: as many as the layer before gives) and out. */
  check(layer: Spec<K>, what: string, before: number | undefined): { in: number | undefined; out: number };
  /** Parameter tensors: name suffix and shape, in ParamSet order. */
  params(layer: Spec<K>): Array<[string, number[]]>;
  /** Initial values of the parameters, drawn from `next` in order (none drawn for fixed values). */
  init(layer: Spec<K>, next: () => number): Float32Array[];
  /** Floats per sample the forward keeps besides the layer's output (layer norm's mean and rstd). */
  saved(layer: Spec<K>): number;
}

const size = (value: unknown, what: string, lo = 1): number => checkInteger(value, what, lo, MAX_SIZE);

function checkConv(l: Spec<'conv2d'>, what: string): { outH: number; outW: number } {
  for (const key of ['inChannels', 'height', 'width', 'outChannels', 'kernel'] as const) size(l[key], `${what}.${key}`);
  const stride = size(l.stride ?? 1, `${what}.stride`);
  const pad = size(l.padding ?? 0, `${what}.padding`, 0);
  if (l.height + 2 * pad < l.kernel || l.width + 2 * pad < l.kernel)
    throw new InvalidArgumentError(`${what}: the padded image (${l.height + 2 * pad} x ${l.width + 2 * pad}) is smaller than the ${l.kernel} x ${l.kernel} kernel; pad it or use a smaller kernel`);
  return { outH: Math.floor((l.height + 2 * pad - l.kernel) / stride) + 1, outW: Math.floor((l.width + 2 * pad - l.kernel) / stride) + 1 };
}

function checkPool(l: PoolLayerSpec, what: string): { outH: number; outW: number } {
  for (const key of ['channels', 'height', 'width', 'kernel'] as const) size(l[key], `${what}.${key}`);
  const stride = size(l.stride ?? l.kernel, `${what}.stride`);
  if (l.height < l.kernel || l.width < l.kernel)
    throw new InvalidArgumentError(`${what}: the image (${l.height} x ${l.width}) is smaller than the ${l.kernel} x ${l.kernel} window; use a smaller kernel`);
  return { outH: Math.floor((l.height - l.kernel) / stride) + 1, outW: Math.floor((l.width - l.kernel) / stride) + 1 };
}

const noParams = { params: () => [], init: () => [], saved: () => 0 };
const elementwise = { ...noParams, keys: [], check: (_: LayerSpec, what: string, before: number | undefined) => {
  if (before === undefined) throw new InvalidArgumentError(`${what}: an activation cannot be the first layer; start with a layer that fixes the input size (${FIRST_KINDS})`);
  return { in: before, out: before };
} };
const pool = <K extends 'maxPool' | 'avgPool'>(): LayerKind<K> => ({
  ...noParams,
  keys: ['channels', 'height', 'width', 'kernel', 'stride'],
  check: (l: PoolLayerSpec, what: string) => {
    const { outH, outW } = checkPool(l, what);
    return { in: l.channels * l.height * l.width, out: l.channels * outH * outW };
  },
});

const LAYER_KINDS: { readonly [K in LayerSpec['kind']]: LayerKind<K> } = {
  linear: {
    keys: ['in', 'out', 'rows'],
    check: (l, what) => {
      const rows = size(l.rows ?? 1, `${what}.rows`);
      return { in: rows * size(l.in, `${what}.in`), out: rows * size(l.out, `${what}.out`) };
    },
    params: (l) => [['weight', [l.out, l.in]], ['bias', [l.out]]],
    init: (l, next) => {
      const [weight, bias] = [new Float32Array(l.out * l.in), new Float32Array(l.out)];
      kaimingUniform(weight, l.in, next);
      biasUniform(bias, l.in, next);
      return [weight, bias];
    },
    saved: () => 0,
  },
  conv2d: {
    keys: ['inChannels', 'height', 'width', 'outChannels', 'kernel', 'stride', 'padding'],
    check: (l, what) => {
      const { outH, outW } = checkConv(l, what);
      return { in: l.inChannels * l.height * l.width, out: l.outChannels * outH * outW };
    },
    params: (l) => [['weight', [l.outChannels, l.inChannels, l.kernel, l.kernel]], ['bias', [l.outChannels]]],
    init: (l, next) => {
      const fanIn = l.inChannels * l.kernel * l.kernel;
      const [weight, bias] = [new Float32Array(l.outChannels * fanIn), new Float32Array(l.outChannels)];
      kaimingUniform(weight, fanIn, next);
      biasUniform(bias, fanIn, next);
      return [weight, bias];
    },
    saved: () => 0,
  },
  maxPool: pool(),
  avgPool: pool(),
  relu: elementwise,
  gelu: elementwise,
  layerNorm: {
    keys: ['features', 'rows'],
    check: (l, what) => {
      const f = size(l.features, `${what}.features`) * size(l.rows ?? 1, `${what}.rows`);
      return { in: f, out: f };
    },
    params: (l) => [['gamma', [l.features]], ['beta', [l.features]]],
    init: (l) => [new Float32Array(l.features).fill(1), new Float32Array(l.features)],
    saved: (l) => 2 * (l.rows ?? 1),
  },
  embedding: {
    keys: ['vocab', 'dim', 'context'],
    check: (l, what, before) => {
      const [vocab, dim, context] = [size(l.vocab, `${what}.vocab`), size(l.dim, `${what}.dim`), size(l.context, `${what}.context`)];
      if (vocab > MAX_VOCAB) throw new InvalidArgumentError(`${what}.vocab must be at most ${MAX_VOCAB} (token ids are held as floats, exact up to 2^24), got ${vocab}`);
      if (before !== undefined) throw new InvalidArgumentError(`${what}: an embedding reads token ids, which only the model's input holds; make it the first layer`);
      return { in: context, out: context * dim };
    },
    params: (l) => [['tokens', [l.vocab, l.dim]], ['positions', [l.context, l.dim]]],
    init: (l, next) => [l.vocab * l.dim, l.context * l.dim].map((n) => {
      const table = new Float32Array(n);
      gaussianInit(table, GPT2_STD, next);
      return table;
    }),
    saved: () => 0,
  },
  transformerBlock: {
    keys: ['dim', 'heads', 'context', 'hidden'],
    check: (l, what) => {
      const [dim, heads, context] = [size(l.dim, `${what}.dim`), size(l.heads, `${what}.heads`), size(l.context, `${what}.context`)];
      size(l.hidden ?? 4 * dim, `${what}.hidden`);
      if (dim % heads !== 0) throw new InvalidArgumentError(`${what}: dim ${dim} must be a multiple of heads ${heads} (each head takes dim / heads values); change dim or heads`);
      if (dim / heads > MAX_HEAD_DIM) throw new InvalidArgumentError(`${what}: dim / heads = ${dim / heads} is above ${MAX_HEAD_DIM}, the largest head the attention takes; use more heads`);
      return { in: context * dim, out: context * dim };
    },
    params: (l) => blockParams(l.dim, l.hidden ?? 4 * l.dim),
    init: (l, next) => blockParams(l.dim, l.hidden ?? 4 * l.dim).map(([name, shape]) => {
      const values = new Float32Array(shape.reduce((a, b) => a * b, 1));
      if (name.endsWith('.weight')) gaussianInit(values, GPT2_STD, next);
      else if (name.endsWith('.gamma')) values.fill(1);
      return values;
    }),
    saved: (l) => blockSavedFloats(l.context, l.dim, l.heads, l.hidden ?? 4 * l.dim),
  },
};
const KIND_NAMES = Object.keys(LAYER_KINDS) as Array<LayerSpec['kind']>;
const FIRST_KINDS = KIND_NAMES.filter((k) => LAYER_KINDS[k] !== elementwise).join(', ');
const kindOf = <K extends LayerSpec['kind']>(layer: Spec<K>): LayerKind<K> => LAYER_KINDS[layer.kind] as unknown as LayerKind<K>;

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

/** @category Models */
export interface CnnLayersOptions {
  /** Square kernel of every convolution (default 3; padded by kernel >> 1 to keep the size). */
  kernel?: number;
  /** Max-pooling window after each convolution's ReLU (default 2; 1 for none). */
  pool?: number;
}

/**
 * The layers of a small CNN over `channels` x `height` x `width` images: per entry of
 * `convChannels` a same-size convolution, ReLU and max-pooling, then a linear layer to `classes`.
 * `cnnLayers({ channels: 1, height: 28, width: 28 }, [8, 16], 10)` is conv(1->8, k3, p1), ReLU,
 * max-pool 2, conv(8->16, k3, p1), ReLU, max-pool 2, linear(16*7*7 -> 10): a Fashion-MNIST CNN.
 *
 * @category Models
 */
export function cnnLayers(image: { channels: number; height: number; width: number }, convChannels: readonly number[], classes: number, options: CnnLayersOptions = {}): LayerSpec[] {
  checkObject(image, 'cnnLayers(image, convChannels, classes): image');
  checkOptions(options, ['kernel', 'pool'], 'cnnLayers(image, convChannels, classes, options)');
  if (!Array.isArray(convChannels)) throw new InvalidArgumentError(`cnnLayers: convChannels must be an array of channel counts, e.g. [8, 16], got ${describeValue(convChannels)}`);
  const kernel = size(options.kernel ?? 3, 'cnnLayers: options.kernel');
  const window = size(options.pool ?? 2, 'cnnLayers: options.pool');
  let [c, h, w] = [size(image.channels, 'cnnLayers: image.channels'), size(image.height, 'cnnLayers: image.height'), size(image.width, 'cnnLayers: image.width')];
  const layers: LayerSpec[] = [];
  convChannels.forEach((out, i) => {
    size(out, `cnnLayers: convChannels[${i}]`);
    layers.push({ kind: 'conv2d', inChannels: c, height: h, width: w, outChannels: out, kernel, padding: kernel >> 1 }, { kind: 'relu' });
    h = h + 2 * (kernel >> 1) - kernel + 1;
    w = w + 2 * (kernel >> 1) - kernel + 1;
    c = out;
    if (window > 1) {
      if (h < window || w < window) throw new InvalidArgumentError(`cnnLayers: after convolution ${i} the image is ${h} x ${w}, smaller than the pooling window ${window}; use fewer convolutions or a smaller pool`);
      layers.push({ kind: 'maxPool', channels: c, height: h, width: w, kernel: window });
      h = Math.floor(h / window);
      w = Math.floor(w / window);
    }
  });
  layers.push({ kind: 'linear', in: c * h * w, out: size(classes, 'cnnLayers: classes') });
  checkLayers(layers, 'cnnLayers');
  return layers;
}

/**
 * @category Models Checks a layer list: known kinds and their fields, each layer's input the
 * previous output, no activation first. Returns the feature counts between layers.
 */
export function checkLayers(layers: readonly LayerSpec[], label: string = 'layers'): number[] {
  const what = typeof label === 'string' ? label : 'layers';
  if (!Array.isArray(layers) || layers.length === 0) throw new InvalidArgumentError(`${what} must be a non-empty array of layers, e.g. mlpLayers([784, 256, 10])`);
  const widths: number[] = [];
  layers.forEach((layer: LayerSpec, i) => {
    const at = `${what}[${i}]`;
    checkObject(layer, at);
    const kind = (layer as { kind?: unknown }).kind;
    if (typeof kind !== 'string' || !Object.hasOwn(LAYER_KINDS, kind)) throw new InvalidArgumentError(`${at}.kind must be one of ${KIND_NAMES.map((k) => `'${k}'`).join(', ')}, got ${describeValue(kind)}`);
    const entry = kindOf(layer);
    checkKnownKeys(layer, ['kind', ...entry.keys], at);
    const before = widths.length > 0 ? widths[widths.length - 1]! : undefined;
    const { in: inF, out } = entry.check(layer, at, before);
    if (before !== undefined && inF !== undefined && inF !== before)
      throw new SizeMismatchError(`${at} is ${layer.kind} with ${inF} input features, but the layer before outputs ${before}; make them agree (a convolution or pooling takes channels * height * width, a per-position layer rows * features, a transformer block context * dim)`);
    if (widths.length === 0) widths.push(inF!);
    widths.push(out);
  });
  return widths;
}

/** The parameter count of each layer (0 for those without parameters). @category Models */
export function layerParams(layers: readonly LayerSpec[]): number[] {
  checkLayers(layers);
  return layers.map((l) => kindOf(l).params(l).reduce((sum, [, shape]) => sum + shape.reduce((a, b) => a * b, 1), 0));
}

/** The names and shapes of a layer's parameter tensors: `layer{i}.weight`/`.bias`, `layer{i}.gamma`/`.beta`. */
function paramSpec(layer: LayerSpec, i: number): Array<[string, number[]]> {
  return kindOf(layer).params(layer).map(([name, shape]) => [`layer${i}.${name}`, shape]);
}

/**
 * The initial parameters of every layer of the whole model, drawn from one seeded stream in layer
 * order (a linear layer's weights then bias, as {@link MLP} draws them), so a part's weights do not
 * depend on how the model is cut.
 */
function initialWeights(layers: readonly LayerSpec[], seed: number): Map<number, Float32Array[]> {
  const next = seededRandom(seed);
  const out = new Map<number, Float32Array[]>();
  layers.forEach((l, i) => out.set(i, kindOf(l).init(l, next)));
  return out;
}

/** What the forward pass of one micro-batch keeps for its backward. */
interface SlotContext {
  input: Tensor;
  batch: number;
  weights: Tensor;
  /** Output of each layer of the part. */
  outputs: Tensor[];
  /** What a layer keeps besides its output (layer norm: mean then rstd, batch values each). */
  saved: Map<number, Tensor>;
  /** Gradient at each linear layer's output, kept by backward(weightGrad: false) for weightGrad(). */
  layerGrads: Map<number, Tensor> | undefined;
  /**
   * The parameter gradients of the layers whose native backward gives them with the input
   * gradient in one call (conv2d, layer norm): computed by backward(weightGrad: false), laid out as
   * the layer's tensors one after another, and written into the gradients by weightGrad().
   */
  paramGrads: Map<number, Tensor> | undefined;
}

/** @category Models */
export interface SequentialOptions {
  /** Seed of the initial weights (default 0). */
  seed?: number;
  /** The part of the model this object holds: layers [start, end) (default: all of them). */
  range?: readonly [number, number];
  /**
   * Where forward and backward run: `cpu` (default) or `cuda:N`. On a device, the input, weights
   * and gradients passed in are DeviceBuffers there (a DeviceParamSet's weights and grads), and so
   * are the activations and the input gradient returned; `params` stays the host copy (layout,
   * initial values, checkpoints).
   */
  device?: Device;
}
const SEQUENTIAL_OPTION_KEYS = optionKeys<SequentialOptions>({ seed: true, range: true, device: true });

/**
 * A sequential model (or one contiguous part of it) of the {@link LayerSpec} layers (linear,
 * conv2d, max and average pooling, ReLU, GELU, layer norm, token embedding, transformer block) on
 * one ParamSet,
 * usable alone (forward, loss, backward like {@link MLP}) and as a pipeline stage
 * ({@link StageModel}). Build the parts of a pipeline with {@link Sequential.part}.
 *
 * @category Models
 */
export class Sequential<T extends Tensor = FlatBuffer> implements StageModel<T>, ReportsGradients {
  readonly layers: readonly LayerSpec[];
  /** Index in the whole model of this part's first layer, and one past its last. */
  readonly start: number;
  readonly end: number;
  readonly params: ParamSet;
  readonly inputSize: number;
  readonly outputSize: number;
  readonly device: Device;
  private readonly memory: ModelDevice;
  private readonly linears = new Map<number, Linear>();
  private readonly widths: number[];
  private readonly slots = new Map<number, SlotContext>();
  private readonly pool = new Map<number, Tensor[]>();
  private isDisposed = false;

  private gradientListener: GradientListener | undefined;

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
    this.memory = modelDevice(options.device ?? 'cpu');
    this.device = this.memory.device;
    this.layers = Object.freeze(layers.map((l) => Object.freeze({ ...l })));
    this.start = start;
    this.end = end;
    this.widths = widths.slice(start, end + 1);
    this.inputSize = this.widths[0]!;
    this.outputSize = this.widths[this.widths.length - 1]!;
    const spec: Array<[string, number[]]> = [];
    for (let i = start; i < end; i++) spec.push(...paramSpec(this.layers[i]!, i));
    // A part without parameters (only activations and pooling) still gets a ParamSet of one
    // element, so that every stage has weights and an optimizer and the runtime needs no special case.
    this.params = new ParamSet(spec.length > 0 ? spec : [['unused', [1]]]);
    const init = initialWeights(this.layers, seed);
    for (let i = start; i < end; i++) {
      const l = this.layers[i]!;
      paramSpec(l, i).forEach(([name], k) => this.params.view(this.params.weights, name).set(init.get(i)![k]!));
      if (l.kind === 'linear') this.linears.set(i, new Linear(this.params, `layer${i}.weight`, `layer${i}.bias`));
    }
  }

  /**
   * Part `index` of the model cut at `boundaries` (the first layer of every part but the first, in
   * increasing order: [2, 4] cuts 6 layers into [0, 2), [2, 4), [4, 6)).
   */
  static part<T extends Tensor = FlatBuffer>(layers: readonly LayerSpec[], boundaries: readonly number[], index: number, options: Pick<SequentialOptions, 'seed' | 'device'> = {}): Sequential<T> {
    checkOptions(options, ['seed', 'device'], 'Sequential.part(layers, boundaries, index, options)');
    checkLayers(layers, 'Sequential.part: layers');
    const ranges = partRanges(layers.length, boundaries);
    checkInteger(index, 'Sequential.part: index', 0, ranges.length - 1);
    return new Sequential<T>(layers, { ...options, range: ranges[index]! });
  }

  get disposed(): boolean {
    return this.isDisposed;
  }

  /**
   * Calls `listener` after each layer's parameter gradients are written into the `grads` a
   * backward (or, for a split backward, weightGrad) writes (on a device: enqueued), from the last
   * layer to the first, once per tensor with its range. The data-parallel trainer listens to
   * reduce the gradient bucket by bucket while the backward runs. Undefined stops.
   */
  setGradientListener(listener: GradientListener | undefined): void {
    if (listener !== undefined && typeof listener !== 'function')
      throw new InvalidArgumentError(`Sequential.setGradientListener: listener must be a function or undefined, got ${describeValue(listener)}`);
    this.gradientListener = listener;
  }

  /** Tells the listener that layer `i`'s parameter gradients are in `grads`. */
  private reportLayer(grads: Tensor, i: number): void {
    if (!this.gradientListener) return;
    for (const [name] of paramSpec(this.layers[i]!, i)) {
      const { offset, size } = this.params.layout(name);
      this.gradientListener(grads, offset, size);
    }
  }
  /** Micro-batches whose forward ran and whose backward has not released them. */
  get liveSlots(): number {
    return this.slots.size;
  }

  /** The input, every layer's output and what layers keep besides (layer norm's mean and rstd) of `batch` samples: what a forward keeps for its backward. */
  activationFloats(batch: number): number {
    checkInteger(batch, 'Sequential.activationFloats: batch', 1, 1 << 24);
    let saved = 0;
    for (let i = this.start; i < this.end; i++) saved += kindOf(this.layers[i]!).saved(this.layers[i]!);
    return batch * (this.widths.reduce((a, b) => a + b, 0) + saved);
  }

  forward(slot: number, input: T, batch: number, weights: T = this.params.weights as T): T {
    this.checkLive('forward');
    checkInteger(slot, 'Sequential.forward: slot', 0, Number.MAX_SAFE_INTEGER);
    checkInteger(batch, 'Sequential.forward: batch', 1, 1 << 24);
    if (this.slots.has(slot)) throw new InvalidArgumentError(`Sequential.forward: slot ${slot} already holds a micro-batch; release it first`);
    this.checkLayout(weights, 'forward: weights');
    if (!this.memory.holds(input) || input.disposed) throw new InvalidArgumentError(`Sequential.forward: input must be a live ${this.tensorKind}`);
    if (input.length < batch * this.inputSize)
      throw new SizeMismatchError(`Sequential.forward: input holds ${input.length} values, batch x ${this.inputSize} needs ${batch * this.inputSize}`);
    const outputs: Tensor[] = [];
    const saved = new Map<number, Tensor>();
    let current: Tensor = input;
    for (let i = this.start; i < this.end; i++) {
      const l = this.layers[i]!;
      const width = this.widths[i - this.start + 1]!;
      const out = this.take(batch * width);
      const [x, y] = [{ buffer: current }, { buffer: out }];
      switch (l.kind) {
        case 'linear':
          this.linears.get(i)!.forward(x, batch * (l.rows ?? 1), y, weights);
          break;
        case 'relu':
          relu(y, x, batch * width);
          break;
        case 'gelu':
          gelu(y, x, batch * width);
          break;
        case 'conv2d':
          conv2d(y, x, this.paramView(weights, i, 'weight'), this.paramView(weights, i, 'bias'), convShape(l, batch));
          break;
        case 'maxPool':
        case 'avgPool':
          pool2d(y, x, poolShape(l, batch), l.kind === 'maxPool' ? 'max' : 'avg');
          break;
        case 'layerNorm': {
          const rows = batch * (l.rows ?? 1);
          const stats = this.take(2 * rows);
          saved.set(i, stats);
          layerNorm({ y, mean: { buffer: stats }, rstd: { buffer: stats, offset: rows } }, x, this.paramView(weights, i, 'gamma'), this.paramView(weights, i, 'beta'), rows, l.features);
          break;
        }
        case 'embedding':
          embedding(y, x, this.paramView(weights, i, 'tokens'), this.paramView(weights, i, 'positions'), embeddingShape(l, batch));
          break;
        case 'transformerBlock': {
          const kept = this.take(batch * kindOf(l).saved(l));
          saved.set(i, kept);
          blockForward(out, current, kept, (name) => this.paramView(weights, i, name), blockShape(l, batch));
          break;
        }
      }
      outputs.push(out);
      current = out;
    }
    this.slots.set(slot, { input, batch, weights, outputs, saved, layerGrads: undefined, paramGrads: undefined });
    return current as T;
  }

  /**
   * The backward of the micro-batch in `slot` (see {@link StageModel.backward}). With `weightGrad:
   * false` the linear layers' parameter gradients wait for {@link Sequential.weightGrad}; a
   * convolution's and a layer norm's are computed here (their native backward gives them with the
   * input gradient in one call), kept, and written into the gradients by weightGrad.
   */
  backward(slot: number, gradOutput: T, options: StageBackwardOptions): T | undefined {
    this.checkLive('backward');
    const ctx = this.slots.get(slot);
    if (!ctx) throw new InvalidArgumentError(`Sequential.backward: slot ${describeValue(slot)} holds no forward pass; run forward first`);
    checkObject(options, 'Sequential.backward(slot, gradOutput, options)');
    const weights = options.weights ?? ctx.weights;
    this.checkLayout(weights, 'backward: weights');
    this.checkLayout(options.grads, 'backward: grads');
    const { batch } = ctx;
    if (!this.memory.holds(gradOutput) || gradOutput.length < batch * this.outputSize)
      throw new SizeMismatchError(`Sequential.backward: gradOutput must be a ${this.tensorKind} of at least batch x ${this.outputSize} values`);
    const wantInput = options.inputGrad ?? true;
    const doWeights = options.weightGrad ?? true;
    const accumulate = options.accumulate ?? false;
    const layerGrads = doWeights ? undefined : new Map<number, Tensor>();
    const paramGrads = doWeights ? undefined : new Map<number, Tensor>();
    // dy: the gradient at the current layer's output. Buffers this part took go back to the pool
    // as soon as they are consumed, except those kept for a later weightGrad().
    let dy: Tensor = gradOutput;
    let dyOwned = false;
    for (let i = this.end - 1; i >= this.start; i--) {
      const l = this.layers[i]!;
      const j = i - this.start;
      const input = j === 0 ? ctx.input : ctx.outputs[j - 1]!;
      const needDx = i > this.start || wantInput;
      const width = this.widths[j]!;
      let kept = false;
      let dx: Tensor | undefined;
      if (l.kind === 'linear') {
        const linear = this.linears.get(i)!;
        const rows = batch * (l.rows ?? 1);
        if (doWeights) {
          linear.weightGrad({ buffer: input }, { buffer: dy }, rows, options.grads, accumulate);
          this.reportLayer(options.grads, i);
        } else {
          layerGrads!.set(i, dyOwned ? dy : this.copyOf(dy, rows * l.out));
          kept = dyOwned;
        }
        if (needDx) {
          dx = this.take(batch * width);
          linear.inputGrad({ buffer: dy }, rows, { buffer: dx }, weights);
        }
      } else if (l.kind === 'conv2d' || l.kind === 'layerNorm' || l.kind === 'embedding' || l.kind === 'transformerBlock') {
        // The input and the parameter gradients come out of one pass (one native call, or the
        // block's chain of them): a split backward computes them now into a buffer of its own,
        // which weightGrad() writes in.
        const { at: grad, acc } = this.gradTarget(i, options.grads, doWeights, accumulate, paramGrads);
        const param = (name: string): TensorView => this.paramView(weights, i, name);
        if (l.kind === 'conv2d') {
          if (needDx) dx = this.take(batch * width);
          conv2dGrad({ dx: dx && { buffer: dx }, dw: grad('weight'), db: grad('bias') }, { buffer: dy }, { buffer: input }, param('weight'), convShape(l, batch), acc);
        } else if (l.kind === 'embedding') {
          // Token ids have no gradient: dx stays undefined.
          embeddingGrad({ dtokenTable: grad('tokens'), dpositionTable: grad('positions') }, { buffer: dy }, { buffer: input }, embeddingShape(l, batch), acc);
        } else {
          // Layer norm and the block always write dx; a first layer's goes back to the pool.
          dx = this.take(batch * width);
          const stats = ctx.saved.get(i)!;
          if (l.kind === 'layerNorm') {
            const rows = batch * (l.rows ?? 1);
            const saved = { mean: { buffer: stats }, rstd: { buffer: stats, offset: rows } };
            layerNormGrad({ dx: { buffer: dx }, dgamma: grad('gamma'), dbeta: grad('beta') }, { buffer: dy }, { buffer: input }, saved, param('gamma'), rows, l.features, acc);
          } else blockBackward(dx, dy, input, stats, param, grad, acc, blockShape(l, batch), { take: (n) => this.take(n), give: (b) => this.give(b) });
          if (!needDx) {
            this.give(dx);
            dx = undefined;
          }
        }
        if (doWeights) this.reportLayer(options.grads, i);
      } else if (needDx) {
        dx = this.take(batch * width);
        const [gx, gy] = [{ buffer: dx }, { buffer: dy }];
        if (l.kind === 'relu') reluGrad(gx, { buffer: ctx.outputs[j]! }, gy, batch * width);
        else if (l.kind === 'gelu') geluGrad(gx, { buffer: input }, gy, batch * width);
        else pool2dGrad(gx, gy, { buffer: input }, poolShape(l, batch), l.kind === 'maxPool' ? 'max' : 'avg');
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
    else [ctx.layerGrads, ctx.paramGrads] = [layerGrads, paramGrads];
    return wantInput && dyOwned ? (dy as T) : undefined;
  }

  weightGrad(slot: number, options: { grads: Tensor; accumulate?: boolean }): void {
    this.checkLive('weightGrad');
    const ctx = this.slots.get(slot);
    if (!ctx || !ctx.layerGrads) throw new InvalidArgumentError(`Sequential.weightGrad: slot ${describeValue(slot)} has no backward(weightGrad: false) pending`);
    checkObject(options, 'Sequential.weightGrad(slot, options)');
    this.checkLayout(options.grads, 'weightGrad: grads');
    for (const [i, dy] of ctx.layerGrads) {
      const j = i - this.start;
      const input = j === 0 ? ctx.input : ctx.outputs[j - 1]!;
      const rows = ctx.batch * ((this.layers[i] as Spec<'linear'>).rows ?? 1);
      this.linears.get(i)!.weightGrad({ buffer: input }, { buffer: dy }, rows, options.grads, options.accumulate ?? false);
      this.reportLayer(options.grads, i);
    }
    for (const [i, computed] of ctx.paramGrads ?? []) {
      let at = 0;
      for (const [name] of paramSpec(this.layers[i]!, i)) {
        const { offset, size: count } = this.params.layout(name);
        const into = { buffer: options.grads, offset };
        if (options.accumulate ?? false) add(into, into, { buffer: computed, offset: at }, count);
        else this.memory.copy(options.grads, computed, count, offset, at);
        at += count;
      }
      this.reportLayer(options.grads, i);
    }
    this.release(slot);
  }

  /** Frees what the forward pass of `slot` kept (backward and weightGrad call it). The input buffer passed to forward stays the caller's. */
  release(slot: number): void {
    const ctx = this.slots.get(slot);
    if (!ctx) return;
    this.slots.delete(slot);
    for (const b of ctx.outputs) this.give(b);
    for (const b of ctx.saved.values()) this.give(b);
    for (const b of ctx.layerGrads?.values() ?? []) this.give(b);
    for (const b of ctx.paramGrads?.values() ?? []) this.give(b);
  }

  /** Gives back a buffer returned by backward() (the input gradient) once the caller is done with it. */
  recycle(buffer: T): void {
    if (this.memory.holds(buffer) && !buffer.disposed) this.give(buffer);
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
  private take(length: number): Tensor {
    const list = this.pool.get(length);
    return list?.pop() ?? this.memory.allocate(length);
  }
  private give(buffer: Tensor): void {
    const list = this.pool.get(buffer.length) ?? [];
    list.push(buffer);
    this.pool.set(buffer.length, list);
  }
  /**
   * Where the backward writes layer `i`'s parameter gradients: into `grads` at the ParamSet's
   * offsets (added to when `accumulate`); or, for a split backward, overwriting a buffer of the
   * layer's own (its tensors one after another, as weightGrad() reads it) kept in `paramGrads`.
   */
  private gradTarget(i: number, grads: Tensor, doWeights: boolean, accumulate: boolean, paramGrads: Map<number, Tensor> | undefined): { at: (name: string) => TensorView; acc: boolean } {
    if (doWeights) return { at: (name) => this.paramView(grads, i, name), acc: accumulate };
    const local = new Map<string, number>();
    let total = 0;
    for (const [name, shape] of kindOf(this.layers[i]!).params(this.layers[i]!)) {
      local.set(name, total);
      total += shape.reduce((a, b) => a * b, 1);
    }
    const into = this.take(total);
    paramGrads!.set(i, into);
    return { at: (name) => ({ buffer: into, offset: local.get(name)! }), acc: false };
  }
  /** The view of layer `i`'s tensor `name` (weight, bias, gamma, beta) in a buffer of the ParamSet's layout. */
  private paramView(buffer: Tensor, i: number, name: string): TensorView {
    return { buffer, offset: this.params.layout(`layer${i}.${name}`).offset };
  }
  private copyOf(buffer: Tensor, length: number): Tensor {
    const copy = this.take(length);
    this.memory.copy(copy, buffer, length);
    return copy;
  }

  /** What the model's tensors are, for messages. */
  private get tensorKind(): string {
    return this.device === 'cpu' ? 'FlatBuffer' : `DeviceBuffer on ${this.device}`;
  }
  private checkLayout(buffer: Tensor, what: string): void {
    // A DeviceParamSet's buffers may be padded past the ParamSet (for sharding): at least its length there.
    const fits = this.memory.holds(buffer) && !buffer.disposed && (buffer instanceof FlatBuffer ? buffer.length === this.params.length : buffer.length >= this.params.length);
    if (!fits)
      throw new SizeMismatchError(`Sequential.${what} must be a live ${this.tensorKind} with the part's ParamSet layout (${this.params.length} elements${this.device === 'cpu' ? '' : ': a DeviceParamSet\'s weights or grads'})`);
  }
  private checkLive(what: string): void {
    if (this.isDisposed) throw new DisposedError(`Sequential.${what}: the model was disposed; build a new one`);
  }
}

function convShape(l: Spec<'conv2d'>, batch: number): Conv2dShape {
  const [stride, pad] = [l.stride ?? 1, l.padding ?? 0];
  return { batch, inChannels: l.inChannels, height: l.height, width: l.width, outChannels: l.outChannels, kernelH: l.kernel, kernelW: l.kernel, strideH: stride, strideW: stride, padH: pad, padW: pad };
}
function embeddingShape(l: Spec<'embedding'>, batch: number): EmbeddingShape {
  return { batch, seq: l.context, vocab: l.vocab, dim: l.dim };
}
function blockShape(l: TransformerBlockSpec, batch: number): BlockShape {
  return { batch, context: l.context, dim: l.dim, heads: l.heads, hidden: l.hidden ?? 4 * l.dim };
}
function poolShape(l: PoolLayerSpec, batch: number): Pool2dShape {
  const stride = l.stride ?? l.kernel;
  return { batch, channels: l.channels, height: l.height, width: l.width, kernelH: l.kernel, kernelW: l.kernel, strideH: stride, strideW: stride };
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
