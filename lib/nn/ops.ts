/**
 * The model operations on tensors in host or device memory: the TypeScript face of the one op
 * table (native/include/sapipe/nn.h) that has a CPU implementation (SIMD SGEMM over the thread
 * pool, plain loops) and a CUDA one (cuBLAS for the products, plugin kernels for the rest).
 *
 * A {@link Tensor} is a FlatBuffer (host) or a DeviceBuffer (`cuda:N`); each operation takes views
 * (a tensor and an element offset) that must all live in the same memory, and dispatches on it:
 * host operands run to completion on the calling thread, device operands are enqueued on the
 * device's current stream (a DeviceStream's inside its run(), else the default stream), in order
 * with DeviceBuffer copies and DeviceParamSet steps there, so nothing waits for the GPU until a
 * result is copied to the host. The addon checks every view against its
 * buffer (ERR_SIZE_MISMATCH), the memory (ERR_INVALID_ARGUMENT for mixed host and device
 * operands) and disposed or busy buffers (ERR_DISPOSED, ERR_BUSY); the functions here add only
 * what the addon cannot see.
 *
 * {@link ModelDevice} bundles the rest a model needs to run on either side: allocating tensors and
 * moving data in and out. Models (MLP) are written once against it.
 */
import { DeviceBuffer, parseDevice, type CudaDevice } from '../device/index.js';
import { AliasingError, InvalidArgumentError } from '../errors.js';
import { callNative, nativeAddon, type NativeConv2dShape, type OperandHandle } from '../native.js';
import { FlatBuffer } from '../tensor.js';
import { describeValue } from '../validate.js';

/** fp32 memory a model operation reads or writes: host (FlatBuffer) or device (DeviceBuffer). @category Models */
export type Tensor = FlatBuffer | DeviceBuffer;

/** Where a model runs: `cpu` or `cuda:N`. @category Models */
export type Device = 'cpu' | CudaDevice;

/** A row-major matrix or vector starting at element `offset` (default 0) of `buffer`. @category Models */
export interface TensorView<T extends Tensor = Tensor> {
  buffer: T;
  offset?: number;
}

function handleOf(view: TensorView, what: string): OperandHandle {
  if (view === null || typeof view !== 'object') throw new InvalidArgumentError(`${what} must be a { buffer, offset? } view`);
  const buffer = view.buffer as unknown;
  if (!(buffer instanceof FlatBuffer) && !(buffer instanceof DeviceBuffer))
    throw new InvalidArgumentError(`${what}.buffer must be a FlatBuffer or a DeviceBuffer, got ${describeValue(buffer)}`);
  return buffer.handle;
}

const offsetOf = (view: TensorView): number => view.offset ?? 0;

/** y[r, j] += bias[j] for `rows` rows of `cols` values. @category Models */
export function biasAdd(y: TensorView, bias: TensorView, rows: number, cols: number): void {
  const [hy, hb] = [handleOf(y, 'biasAdd: y'), handleOf(bias, 'biasAdd: bias')];
  callNative(() => nativeAddon().nnBiasAdd(hy, offsetOf(y), hb, offsetOf(bias), rows, cols));
}

/** db[j] = sum over the rows of dy[r, j] (added to db when `accumulate`). @category Models */
export function biasGrad(db: TensorView, dy: TensorView, rows: number, cols: number, accumulate = false): void {
  const [hd, hy] = [handleOf(db, 'biasGrad: db'), handleOf(dy, 'biasGrad: dy')];
  callNative(() => nativeAddon().nnBiasGrad(hd, offsetOf(db), hy, offsetOf(dy), rows, cols, accumulate === true));
}

/** y = max(0, x) over `count` values (NaN becomes 0); y may be x. @category Models */
export function relu(y: TensorView, x: TensorView, count: number): void {
  const [hy, hx] = [handleOf(y, 'relu: y'), handleOf(x, 'relu: x')];
  callNative(() => nativeAddon().nnRelu(hy, offsetOf(y), hx, offsetOf(x), count));
}

/** dx = dy where the forward output y > 0, else 0; dx may be dy. @category Models */
export function reluGrad(dx: TensorView, y: TensorView, dy: TensorView, count: number): void {
  const [hdx, hy, hdy] = [handleOf(dx, 'reluGrad: dx'), handleOf(y, 'reluGrad: y'), handleOf(dy, 'reluGrad: dy')];
  callNative(() => nativeAddon().nnReluBackward(hdx, offsetOf(dx), hy, offsetOf(y), hdy, offsetOf(dy), count));
}

/** @category Models */
export interface SoftmaxXentOutputs {
  /** Per-row loss logsumexp(z) - z[label] (rows values). */
  losses: TensorView;
  /** (softmax(z) - onehot(label)) * gradScale per logit (rows x classes); may be the logits. */
  dlogits?: TensorView;
  /** 1 where the row's first largest logit is at its label, else 0 (rows values). */
  correct?: TensorView;
}

/**
 * Softmax cross-entropy of `rows` rows of `classes` logits against labels held as floats (class
 * numbers); a label that is not a class number gives a NaN loss and a zero gradient row.
 * `gradScale` is 1 / rows for the gradient of the mean loss. @category Models
 */
export function softmaxXent(logits: TensorView, labels: TensorView, rows: number, classes: number, gradScale: number, out: SoftmaxXentOutputs): void {
  if (out === null || typeof out !== 'object') throw new InvalidArgumentError('softmaxXent: out must be { losses, dlogits?, correct? }');
  const hl = handleOf(logits, 'softmaxXent: logits');
  const hlab = handleOf(labels, 'softmaxXent: labels');
  const hloss = handleOf(out.losses, 'softmaxXent: out.losses');
  const hd = out.dlogits === undefined ? null : handleOf(out.dlogits, 'softmaxXent: out.dlogits');
  const hc = out.correct === undefined ? null : handleOf(out.correct, 'softmaxXent: out.correct');
  callNative(() =>
    nativeAddon().nnSoftmaxXent(
      hl,
      offsetOf(logits),
      hlab,
      offsetOf(labels),
      rows,
      classes,
      gradScale,
      hloss,
      offsetOf(out.losses),
      hd,
      out.dlogits === undefined ? 0 : offsetOf(out.dlogits),
      hc,
      out.correct === undefined ? 0 : offsetOf(out.correct),
    ),
  );
}

function checkCount(op: string, name: string, value: unknown): number {
  if (typeof value !== 'number' || !Number.isSafeInteger(value) || value < 0)
    throw new InvalidArgumentError(`${op}: ${name} must be a non-negative integer, got ${describeValue(value)}`);
  return value;
}

/**
 * GELU, tanh form (GPT-2; PyTorch's `approximate='tanh'`): y = 0.5 x (1 + tanh(sqrt(2/pi) (x +
 * 0.044715 x^3))) over `count` values; y may be x. @category Models
 */
export function gelu(y: TensorView, x: TensorView, count: number): void {
  const [hy, hx] = [handleOf(y, 'gelu: y'), handleOf(x, 'gelu: x')];
  checkCount('gelu', 'count', count);
  callNative(() => nativeAddon().nnGelu(hy, offsetOf(y), hx, offsetOf(x), count));
}

/** dx = dy * gelu'(x), with x the forward **input** (not its output); dx may be dy or x. @category Models */
export function geluGrad(dx: TensorView, x: TensorView, dy: TensorView, count: number): void {
  const [hdx, hx, hdy] = [handleOf(dx, 'geluGrad: dx'), handleOf(x, 'geluGrad: x'), handleOf(dy, 'geluGrad: dy')];
  checkCount('geluGrad', 'count', count);
  callNative(() => nativeAddon().nnGeluBackward(hdx, offsetOf(dx), hx, offsetOf(x), hdy, offsetOf(dy), count));
}

/**
 * y = a + b over `count` values: a residual connection (its backward passes dy to both branches;
 * `add(g, g, dy)` adds a branch's gradient into g). y may be a or b. @category Models
 */
export function add(y: TensorView, a: TensorView, b: TensorView, count: number): void {
  const [hy, ha, hb] = [handleOf(y, 'add: y'), handleOf(a, 'add: a'), handleOf(b, 'add: b')];
  checkCount('add', 'count', count);
  callNative(() => nativeAddon().nnAdd(hy, offsetOf(y), ha, offsetOf(a), hb, offsetOf(b), count));
}

/** The outputs of {@link layerNorm}: y [rows, cols], and the per-row mean and rstd [rows] its backward reads. @category Models */
export interface LayerNormOutputs {
  y: TensorView;
  mean: TensorView;
  rstd: TensorView;
}

/**
 * Layer norm over each of `rows` rows of `cols` values: y = (x - mean) / sqrt(var + eps) * gamma +
 * beta, with the biased variance; saves each row's mean and rstd = 1 / sqrt(var + eps) for
 * {@link layerNormGrad}. y may be x. @category Models
 */
export function layerNorm(out: LayerNormOutputs, x: TensorView, gamma: TensorView, beta: TensorView, rows: number, cols: number, eps = 1e-5): void {
  if (out === null || typeof out !== 'object') throw new InvalidArgumentError('layerNorm: out must be { y, mean, rstd }');
  const [hy, hm, hr] = [handleOf(out.y, 'layerNorm: out.y'), handleOf(out.mean, 'layerNorm: out.mean'), handleOf(out.rstd, 'layerNorm: out.rstd')];
  const [hx, hg, hb] = [handleOf(x, 'layerNorm: x'), handleOf(gamma, 'layerNorm: gamma'), handleOf(beta, 'layerNorm: beta')];
  checkCount('layerNorm', 'rows', rows);
  if (checkCount('layerNorm', 'cols', cols) === 0 && rows > 0) throw new InvalidArgumentError('layerNorm: cols must be at least 1: a row of no values has no mean');
  if (typeof eps !== 'number' || !Number.isFinite(eps) || eps <= 0)
    throw new InvalidArgumentError(`layerNorm: eps must be a positive finite number (1e-5 is usual), got ${describeValue(eps)}`);
  callNative(() =>
    nativeAddon().nnLayerNorm(hy, offsetOf(out.y), hm, offsetOf(out.mean), hr, offsetOf(out.rstd), hx, offsetOf(x), hg, offsetOf(gamma), hb, offsetOf(beta), rows, cols, eps),
  );
}

/** The gradients {@link layerNormGrad} writes: dx [rows, cols] (may be dy), dgamma and dbeta [cols]. @category Models */
export interface LayerNormGrads {
  dx: TensorView;
  dgamma: TensorView;
  dbeta: TensorView;
}

/**
 * The layer norm's backward from its forward input x and the saved mean and rstd: dx, and dgamma,
 * dbeta summed over the rows in order (added to them when `accumulate`). @category Models
 */
export function layerNormGrad(
  grads: LayerNormGrads,
  dy: TensorView,
  x: TensorView,
  saved: { mean: TensorView; rstd: TensorView },
  gamma: TensorView,
  rows: number,
  cols: number,
  accumulate = false,
): void {
  if (grads === null || typeof grads !== 'object') throw new InvalidArgumentError('layerNormGrad: grads must be { dx, dgamma, dbeta }');
  if (saved === null || typeof saved !== 'object') throw new InvalidArgumentError('layerNormGrad: saved must be { mean, rstd } from layerNorm');
  const hdx = handleOf(grads.dx, 'layerNormGrad: grads.dx');
  const hdg = handleOf(grads.dgamma, 'layerNormGrad: grads.dgamma');
  const hdb = handleOf(grads.dbeta, 'layerNormGrad: grads.dbeta');
  const [hdy, hx, hg] = [handleOf(dy, 'layerNormGrad: dy'), handleOf(x, 'layerNormGrad: x'), handleOf(gamma, 'layerNormGrad: gamma')];
  const [hm, hr] = [handleOf(saved.mean, 'layerNormGrad: saved.mean'), handleOf(saved.rstd, 'layerNormGrad: saved.rstd')];
  checkCount('layerNormGrad', 'rows', rows);
  checkCount('layerNormGrad', 'cols', cols);
  callNative(() =>
    nativeAddon().nnLayerNormBackward(
      hdx,
      offsetOf(grads.dx),
      hdg,
      offsetOf(grads.dgamma),
      hdb,
      offsetOf(grads.dbeta),
      hdy,
      offsetOf(dy),
      hx,
      offsetOf(x),
      hm,
      offsetOf(saved.mean),
      hr,
      offsetOf(saved.rstd),
      hg,
      offsetOf(gamma),
      rows,
      cols,
      accumulate === true,
    ),
  );
}

/** The shape of a token and position embedding: `batch` sequences of `seq` tokens, `vocab` tokens, `dim` values each. @category Models */
export interface EmbeddingShape {
  batch: number;
  seq: number;
  vocab: number;
  dim: number;
}

function checkEmbeddingShape(op: string, shape: EmbeddingShape): void {
  if (shape === null || typeof shape !== 'object') throw new InvalidArgumentError(`${op}: shape must be { batch, seq, vocab, dim }`);
  for (const key of ['batch', 'seq', 'vocab', 'dim'] as const) checkCount(op, `shape.${key}`, shape[key]);
  if (shape.vocab === 0 && shape.batch * shape.seq > 0) throw new InvalidArgumentError(`${op}: shape.vocab must be at least 1 to embed any token`);
}

/**
 * Token and position embedding: y[b, s, :] = tokenTable[tokens[b, s], :] + positionTable[s, :],
 * tokens held as floats ([batch, seq]), tables [vocab, dim] and [seq (or more), dim]. A token
 * that is not an integer below vocab gives a NaN row (a device cannot throw; check tokens before
 * copying them in). @category Models
 */
export function embedding(y: TensorView, tokens: TensorView, tokenTable: TensorView, positionTable: TensorView, shape: EmbeddingShape): void {
  const [hy, ht] = [handleOf(y, 'embedding: y'), handleOf(tokens, 'embedding: tokens')];
  const [htt, hpt] = [handleOf(tokenTable, 'embedding: tokenTable'), handleOf(positionTable, 'embedding: positionTable')];
  checkEmbeddingShape('embedding', shape);
  const { batch, seq, vocab, dim } = shape;
  callNative(() =>
    nativeAddon().nnEmbedding(hy, offsetOf(y), ht, offsetOf(tokens), htt, offsetOf(tokenTable), hpt, offsetOf(positionTable), batch, seq, vocab, dim),
  );
}

/** The gradients {@link embeddingGrad} writes: the token table's [vocab, dim] and, when given, the position table's [seq, dim]. @category Models */
export interface EmbeddingGrads {
  dtokenTable: TensorView;
  dpositionTable?: TensorView;
}

/**
 * The embedding's backward, a scatter-add: dtokenTable[tokens[b, s], :] += dy[b, s, :] and
 * dpositionTable[s, :] += dy[b, s, :], in (b, s) order; both are zeroed first unless
 * `accumulate`. Tokens that are not integers below vocab add nothing. @category Models
 */
export function embeddingGrad(grads: EmbeddingGrads, dy: TensorView, tokens: TensorView, shape: EmbeddingShape, accumulate = false): void {
  if (grads === null || typeof grads !== 'object') throw new InvalidArgumentError('embeddingGrad: grads must be { dtokenTable, dpositionTable? }');
  const hdt = handleOf(grads.dtokenTable, 'embeddingGrad: grads.dtokenTable');
  const hdp = grads.dpositionTable === undefined ? null : handleOf(grads.dpositionTable, 'embeddingGrad: grads.dpositionTable');
  const [hdy, ht] = [handleOf(dy, 'embeddingGrad: dy'), handleOf(tokens, 'embeddingGrad: tokens')];
  checkEmbeddingShape('embeddingGrad', shape);
  const { batch, seq, vocab, dim } = shape;
  const dpOffset = grads.dpositionTable === undefined ? 0 : offsetOf(grads.dpositionTable);
  callNative(() =>
    nativeAddon().nnEmbeddingBackward(hdt, offsetOf(grads.dtokenTable), hdp, dpOffset, hdy, offsetOf(dy), ht, offsetOf(tokens), batch, seq, vocab, dim, accumulate === true),
  );
}

/** The mask of {@link dropout}: drop probability `p` in [0, 1), and the counter stream (seed, offset) it is drawn from. @category Models */
export interface DropoutOptions {
  p: number;
  /** A non-negative integer (below 2^53): the same seed and offset draw the same mask on the CPU and on a device. */
  seed: number;
  /** The counter of the first value (default 0): give each tensor drawn from one seed its own range. */
  offset?: number;
}

/**
 * Inverted dropout over `count` values: value i is kept when the uniform draw u(seed, offset + i)
 * (SplitMix64 of the counter, docs/ALGORITHMS.md) is at least p, and scaled by 1 / (1 - p); else
 * 0. The backward is the same call on dy with the same options. y may be x. @category Models
 */
export function dropout(y: TensorView, x: TensorView, count: number, options: DropoutOptions): void {
  const [hy, hx] = [handleOf(y, 'dropout: y'), handleOf(x, 'dropout: x')];
  checkCount('dropout', 'count', count);
  if (options === null || typeof options !== 'object') throw new InvalidArgumentError('dropout: options must be { p, seed, offset? }');
  const { p, seed, offset = 0 } = options;
  if (typeof p !== 'number' || !(p >= 0 && p < 1)) throw new InvalidArgumentError(`dropout: p must be in [0, 1), got ${describeValue(p)}`);
  checkCount('dropout', 'seed', seed);
  checkCount('dropout', 'offset', offset);
  callNative(() => nativeAddon().nnDropout(hy, offsetOf(y), hx, offsetOf(x), count, p, seed, offset));
}

/** The shape of {@link attention}: `batch` sequences of `seq` positions, `heads` heads of `headDim` values (1 to 256). @category Models */
export interface AttentionShape {
  batch: number;
  seq: number;
  heads: number;
  headDim: number;
}

/** The largest head dimension the attention takes (a device keeps a row in one warp's registers). @category Models */
export const MAX_HEAD_DIM = 256;

function checkAttention(op: string, shape: AttentionShape, scale: number | undefined): number {
  if (shape === null || typeof shape !== 'object') throw new InvalidArgumentError(`${op}: shape must be { batch, seq, heads, headDim }`);
  for (const key of ['batch', 'seq', 'heads', 'headDim'] as const) checkCount(op, `shape.${key}`, shape[key]);
  if (shape.headDim < 1 || shape.headDim > MAX_HEAD_DIM)
    throw new InvalidArgumentError(`${op}: shape.headDim must be in [1, ${MAX_HEAD_DIM}], got ${shape.headDim}; split the model width over more heads`);
  const s = scale ?? 1 / Math.sqrt(shape.headDim);
  if (typeof s !== 'number' || !Number.isFinite(s)) throw new InvalidArgumentError(`${op}: scale must be a finite number (default 1 / sqrt(headDim)), got ${describeValue(scale)}`);
  return s;
}

/** Refuses outputs that overlap inputs in the same buffer (the kernels read the inputs while writing). */
function checkDisjoint(op: string, outputs: [string, TensorView, number][], inputs: [string, TensorView, number][]): void {
  for (const [on, ov, olen] of outputs)
    for (const [inName, iv, ilen] of [...inputs, ...outputs.filter(([n]) => n !== on)]) {
      if (ov.buffer !== iv.buffer || olen === 0 || ilen === 0) continue;
      const [a, b] = [offsetOf(ov), offsetOf(iv)];
      if (a < b + ilen && b < a + olen) throw new AliasingError(`${op}: ${on} overlaps ${inName}; give it its own tensor (or a disjoint range of the buffer)`);
    }
}

/** The outputs of {@link attention}: o [batch, seq, heads * headDim] and the per-row logsumexp lse [batch, heads, seq] its backward reads. @category Models */
export interface AttentionOutputs {
  o: TensorView;
  lse: TensorView;
}

/**
 * Causal multi-head self-attention over q, k, v laid out [batch, seq, heads * headDim] (head h in
 * columns h headDim to (h + 1) headDim): for query i and keys j <= i, s_ij = scale q_i . k_j,
 * o_i = softmax_j(s_i) v, and lse_i = log sum_j exp(s_ij) saved for {@link attentionGrad}. The
 * seq x seq score matrix is never stored: on a GPU the softmax runs online, a row at a time
 * (flash-attention style); on the CPU, 32 query rows at a time as matrix products. `scale`
 * defaults to 1 / sqrt(headDim); o and lse must not overlap q, k or v. @category Models
 */
export function attention(out: AttentionOutputs, q: TensorView, k: TensorView, v: TensorView, shape: AttentionShape, scale?: number): void {
  if (out === null || typeof out !== 'object') throw new InvalidArgumentError('attention: out must be { o, lse }');
  const [ho, hl] = [handleOf(out.o, 'attention: out.o'), handleOf(out.lse, 'attention: out.lse')];
  const [hq, hk, hv] = [handleOf(q, 'attention: q'), handleOf(k, 'attention: k'), handleOf(v, 'attention: v')];
  const s = checkAttention('attention', shape, scale);
  const { batch, seq, heads, headDim } = shape;
  const [n, rows] = [batch * seq * heads * headDim, batch * heads * seq];
  checkDisjoint('attention', [['out.o', out.o, n], ['out.lse', out.lse, rows]], [['q', q, n], ['k', k, n], ['v', v, n]]);
  callNative(() => nativeAddon().nnAttention(ho, offsetOf(out.o), hl, offsetOf(out.lse), hq, offsetOf(q), hk, offsetOf(k), hv, offsetOf(v), batch, seq, heads, headDim, s));
}

/** The gradients {@link attentionGrad} writes (each overwritten), laid out like q, k and v. @category Models */
export interface AttentionGrads {
  dq: TensorView;
  dk: TensorView;
  dv: TensorView;
}

/**
 * The attention's backward from dout and the forward's inputs, o and lse: recomputes each score
 * from lse (nothing of size seq x seq is stored) and writes dq, dk and dv, which must not overlap
 * any input or each other. `scale` must be the forward's. @category Models
 */
export function attentionGrad(
  grads: AttentionGrads,
  dout: TensorView,
  q: TensorView,
  k: TensorView,
  v: TensorView,
  saved: AttentionOutputs,
  shape: AttentionShape,
  scale?: number,
): void {
  if (grads === null || typeof grads !== 'object') throw new InvalidArgumentError('attentionGrad: grads must be { dq, dk, dv }');
  if (saved === null || typeof saved !== 'object') throw new InvalidArgumentError('attentionGrad: saved must be { o, lse } from attention');
  const [hdq, hdk, hdv] = [handleOf(grads.dq, 'attentionGrad: grads.dq'), handleOf(grads.dk, 'attentionGrad: grads.dk'), handleOf(grads.dv, 'attentionGrad: grads.dv')];
  const [hdo, hq, hk, hv] = [handleOf(dout, 'attentionGrad: dout'), handleOf(q, 'attentionGrad: q'), handleOf(k, 'attentionGrad: k'), handleOf(v, 'attentionGrad: v')];
  const [ho, hl] = [handleOf(saved.o, 'attentionGrad: saved.o'), handleOf(saved.lse, 'attentionGrad: saved.lse')];
  const s = checkAttention('attentionGrad', shape, scale);
  const { batch, seq, heads, headDim } = shape;
  const [n, rows] = [batch * seq * heads * headDim, batch * heads * seq];
  checkDisjoint(
    'attentionGrad',
    [['grads.dq', grads.dq, n], ['grads.dk', grads.dk, n], ['grads.dv', grads.dv, n]],
    [['dout', dout, n], ['q', q, n], ['k', k, n], ['v', v, n], ['saved.o', saved.o, n], ['saved.lse', saved.lse, rows]],
  );
  callNative(() =>
    nativeAddon().nnAttentionBackward(
      hdq,
      offsetOf(grads.dq),
      hdk,
      offsetOf(grads.dk),
      hdv,
      offsetOf(grads.dv),
      hdo,
      offsetOf(dout),
      hq,
      offsetOf(q),
      hk,
      offsetOf(k),
      hv,
      offsetOf(v),
      ho,
      offsetOf(saved.o),
      hl,
      offsetOf(saved.lse),
      batch,
      seq,
      heads,
      headDim,
      s,
    ),
  );
}

/**
 * A 2-D convolution's shape, NCHW: input [batch, inChannels, height, width], weights [outChannels,
 * inChannels, kernelH, kernelW], output [batch, outChannels, outH, outW] with out = floor((in + 2
 * pad - kernel) / stride) + 1 (see {@link conv2dOutputSize}). Strides default to 1, padding
 * (zeros) to 0. @category Models
 */
export interface Conv2dShape extends Omit<NativeConv2dShape, ConvDefaults>, Partial<Pick<NativeConv2dShape, ConvDefaults>> {}

/** The fields of a convolution's or a pooling's shape that have defaults. */
type ConvDefaults = 'strideH' | 'strideW' | 'padH' | 'padW';

function nativeConvShape(op: string, shape: Conv2dShape): NativeConv2dShape & { outH: number; outW: number } {
  if (shape === null || typeof shape !== 'object') throw new InvalidArgumentError(`${op}: shape must be { batch, inChannels, height, width, outChannels, kernelH, kernelW, strideH?, strideW?, padH?, padW? }`);
  const full = { strideH: 1, strideW: 1, padH: 0, padW: 0, ...shape };
  for (const key of ['batch', 'inChannels', 'height', 'width', 'outChannels', 'kernelH', 'kernelW', 'strideH', 'strideW', 'padH', 'padW'] as const)
    checkCount(op, `shape.${key}`, full[key]);
  for (const key of ['kernelH', 'kernelW', 'strideH', 'strideW'] as const) if (full[key] < 1) throw new InvalidArgumentError(`${op}: shape.${key} must be at least 1`);
  if (full.height + 2 * full.padH < full.kernelH || full.width + 2 * full.padW < full.kernelW)
    throw new InvalidArgumentError(`${op}: the padded input (${full.height + 2 * full.padH} x ${full.width + 2 * full.padW}) is smaller than the kernel (${full.kernelH} x ${full.kernelW}); pad it or use a smaller kernel`);
  return { ...full, outH: Math.floor((full.height + 2 * full.padH - full.kernelH) / full.strideH) + 1, outW: Math.floor((full.width + 2 * full.padW - full.kernelW) / full.strideW) + 1 };
}

/** The output's height and width of a convolution (or pooling) of `shape`. @category Models */
export function conv2dOutputSize(shape: Conv2dShape): { height: number; width: number } {
  const s = nativeConvShape('conv2dOutputSize', shape);
  return { height: s.outH, width: s.outW };
}

/**
 * 2-D convolution, NCHW (cross-correlation, as PyTorch's Conv2d): y[n, k, oy, ox] = bias[k] +
 * sum over c, r, s of w[k, c, r, s] x[n, c, oy strideH - padH + r, ox strideW - padW + s], zeros
 * outside the image. `bias` may be omitted. The CPU runs im2col and the SIMD SGEMM, a device a
 * direct kernel. y must not overlap x or w. A flatten after it is no operation: [batch, C, H, W]
 * row-major is [batch, C H W]. @category Models
 */
export function conv2d(y: TensorView, x: TensorView, w: TensorView, bias: TensorView | undefined, shape: Conv2dShape): void {
  const [hy, hx, hw] = [handleOf(y, 'conv2d: y'), handleOf(x, 'conv2d: x'), handleOf(w, 'conv2d: w')];
  const hb = bias === undefined ? null : handleOf(bias, 'conv2d: bias');
  const s = nativeConvShape('conv2d', shape);
  const ylen = s.batch * s.outChannels * s.outH * s.outW;
  checkDisjoint('conv2d', [['y', y, ylen]], [['x', x, s.batch * s.inChannels * s.height * s.width], ['w', w, s.outChannels * s.inChannels * s.kernelH * s.kernelW]]);
  callNative(() => nativeAddon().nnConv2d(hy, offsetOf(y), hx, offsetOf(x), hw, offsetOf(w), hb, bias === undefined ? 0 : offsetOf(bias), s));
}

/** The gradients {@link conv2dGrad} writes: dx (overwritten; omit it for a first layer), dw and db (omit for no bias). @category Models */
export interface Conv2dGrads {
  dx?: TensorView;
  dw: TensorView;
  db?: TensorView;
}

/**
 * The convolution's backward: dx (the transposed convolution of dy with w), dw (sum over the
 * batch and output positions of dy times the input patch) and db (the sum of dy per channel);
 * dw and db are added to when `accumulate`. No gradient may overlap an input. @category Models
 */
export function conv2dGrad(grads: Conv2dGrads, dy: TensorView, x: TensorView, w: TensorView, shape: Conv2dShape, accumulate = false): void {
  if (grads === null || typeof grads !== 'object') throw new InvalidArgumentError('conv2dGrad: grads must be { dx?, dw, db? }');
  const hdx = grads.dx === undefined ? null : handleOf(grads.dx, 'conv2dGrad: grads.dx');
  const hdw = handleOf(grads.dw, 'conv2dGrad: grads.dw');
  const hdb = grads.db === undefined ? null : handleOf(grads.db, 'conv2dGrad: grads.db');
  const [hdy, hx, hw] = [handleOf(dy, 'conv2dGrad: dy'), handleOf(x, 'conv2dGrad: x'), handleOf(w, 'conv2dGrad: w')];
  const s = nativeConvShape('conv2dGrad', shape);
  const [xlen, wlen, ylen] = [s.batch * s.inChannels * s.height * s.width, s.outChannels * s.inChannels * s.kernelH * s.kernelW, s.batch * s.outChannels * s.outH * s.outW];
  const outputs: [string, TensorView, number][] = [['grads.dw', grads.dw, wlen]];
  if (grads.dx !== undefined) outputs.push(['grads.dx', grads.dx, xlen]);
  if (grads.db !== undefined) outputs.push(['grads.db', grads.db, s.outChannels]);
  checkDisjoint('conv2dGrad', outputs, [['dy', dy, ylen], ['x', x, xlen], ['w', w, wlen]]);
  callNative(() =>
    nativeAddon().nnConv2dBackward(
      hdx,
      grads.dx === undefined ? 0 : offsetOf(grads.dx),
      hdw,
      offsetOf(grads.dw),
      hdb,
      grads.db === undefined ? 0 : offsetOf(grads.db),
      hdy,
      offsetOf(dy),
      hx,
      offsetOf(x),
      hw,
      offsetOf(w),
      s,
      accumulate === true,
    ),
  );
}

/**
 * A 2-D pooling's shape, NCHW: input [batch, channels, height, width], windows kernelH x kernelW
 * at the strides (default: the kernel, windows side by side), padding (default 0) at most half the
 * kernel; output [batch, channels, outH, outW] sized as a convolution's. @category Models
 */
export interface Pool2dShape extends Omit<Conv2dShape, 'inChannels' | 'outChannels'> {
  channels: number;
}

/** `max` (the window's first largest value; NaN never wins) or `avg` (the window's sum over its full area, padding counting as zeros). @category Models */
export type PoolMode = 'max' | 'avg';

function nativePoolShape(op: string, shape: Pool2dShape, mode: unknown): { s: NativeConv2dShape & { outH: number; outW: number }; mode: number } {
  if (mode !== 'max' && mode !== 'avg') throw new InvalidArgumentError(`${op}: mode must be "max" or "avg", got ${describeValue(mode)}`);
  if (shape === null || typeof shape !== 'object') throw new InvalidArgumentError(`${op}: shape must be { batch, channels, height, width, kernelH, kernelW, strideH?, strideW?, padH?, padW? }`);
  checkCount(op, 'shape.channels', shape.channels);
  const s = nativeConvShape(op, {
    ...shape,
    inChannels: shape.channels,
    outChannels: shape.channels,
    strideH: shape.strideH ?? shape.kernelH,
    strideW: shape.strideW ?? shape.kernelW,
  });
  if (2 * s.padH > s.kernelH || 2 * s.padW > s.kernelW) throw new InvalidArgumentError(`${op}: padding must be at most half the kernel (padH ${s.padH}, padW ${s.padW} for a ${s.kernelH} x ${s.kernelW} kernel)`);
  return { s, mode: mode === 'max' ? 0 : 1 };
}

/**
 * 2-D max or average pooling, NCHW (PyTorch's MaxPool2d, and AvgPool2d with count_include_pad).
 * y must not overlap x. @category Models
 */
export function pool2d(y: TensorView, x: TensorView, shape: Pool2dShape, mode: PoolMode): void {
  const [hy, hx] = [handleOf(y, 'pool2d: y'), handleOf(x, 'pool2d: x')];
  const { s, mode: m } = nativePoolShape('pool2d', shape, mode);
  checkDisjoint('pool2d', [['y', y, s.batch * s.inChannels * s.outH * s.outW]], [['x', x, s.batch * s.inChannels * s.height * s.width]]);
  callNative(() => nativeAddon().nnPool2d(hy, offsetOf(y), hx, offsetOf(x), s, m));
}

/**
 * The pooling's backward, dx overwritten: max hands each dy to its window's first largest value
 * (found again from x), avg dy / (kernelH kernelW) to every value inside the window; overlapping
 * windows add up. dx must not overlap dy or x. @category Models
 */
export function pool2dGrad(dx: TensorView, dy: TensorView, x: TensorView, shape: Pool2dShape, mode: PoolMode): void {
  const [hdx, hdy, hx] = [handleOf(dx, 'pool2dGrad: dx'), handleOf(dy, 'pool2dGrad: dy'), handleOf(x, 'pool2dGrad: x')];
  const { s, mode: m } = nativePoolShape('pool2dGrad', shape, mode);
  const xlen = s.batch * s.inChannels * s.height * s.width;
  checkDisjoint('pool2dGrad', [['dx', dx, xlen]], [['dy', dy, s.batch * s.inChannels * s.outH * s.outW], ['x', x, xlen]]);
  callNative(() => nativeAddon().nnPool2dBackward(hdx, offsetOf(dx), hdy, offsetOf(dy), hx, offsetOf(x), s, m));
}

/**
 * What a model needs of the memory it runs in beyond the operations: tensors, and data moved in
 * and out. {@link modelDevice} returns the one for `cpu` or `cuda:N`.
 *
 * @category Models
 */
export interface ModelDevice {
  readonly device: Device;
  /** A zero-filled tensor of `length` floats. */
  allocate(length: number): Tensor;
  /** tensor[offset, offset + values.length) = values. */
  write(tensor: Tensor, values: Float32Array, offset?: number): void;
  /** The values tensor[offset, offset + count), copied to the host (waits for the device's pending work). */
  read(tensor: Tensor, count: number, offset?: number): Float32Array;
  /** dst[dstOffset, +count) = src[srcOffset, +count), both in this memory (in order with its operations). */
  copy(dst: Tensor, src: Tensor, count: number, dstOffset?: number, srcOffset?: number): void;
  /** Whether `tensor` lives in this memory. */
  holds(tensor: unknown): tensor is Tensor;
}

const hostDevice: ModelDevice = {
  device: 'cpu',
  allocate: (length) => FlatBuffer.allocate(length),
  write: (tensor, values, offset = 0) => (tensor as FlatBuffer).array.set(values, offset),
  read: (tensor, count, offset = 0) => (tensor as FlatBuffer).array.slice(offset, offset + count),
  copy: (dst, src, count, dstOffset = 0, srcOffset = 0) => (dst as FlatBuffer).array.set((src as FlatBuffer).array.subarray(srcOffset, srcOffset + count), dstOffset),
  holds: (tensor): tensor is Tensor => tensor instanceof FlatBuffer,
};

function cudaModelDevice(device: CudaDevice, index: number): ModelDevice {
  return {
    device,
    allocate: (length) => DeviceBuffer.allocate(length, { device }),
    write: (tensor, values, offset = 0) => (tensor as DeviceBuffer).copyFromHost(values, offset),
    read: (tensor, count, offset = 0) => (tensor as DeviceBuffer).copyToHost(new Float32Array(count), offset),
    copy: (dst, src, count, dstOffset = 0, srcOffset = 0) => callNative(() => (dst as DeviceBuffer).handle.copyFromDevice((src as DeviceBuffer).handle, srcOffset, dstOffset, count)),
    holds: (tensor): tensor is Tensor => tensor instanceof DeviceBuffer && tensor.deviceIndex === index,
  };
}

/** The {@link ModelDevice} of `cpu` or `cuda:N` (`cuda` is `cuda:0`). @category Models */
export function modelDevice(device: Device | string = 'cpu'): ModelDevice {
  if (typeof device !== 'string') throw new InvalidArgumentError(`device must be "cpu" or "cuda:N", got ${describeValue(device)}`);
  const parsed = parseDevice(device);
  if (parsed.kind === 'cpu') return hostDevice;
  return cudaModelDevice(`cuda:${parsed.index}`, parsed.index);
}
