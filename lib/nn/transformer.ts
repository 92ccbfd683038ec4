/**
 * The GPT layers of {@link Sequential} written against the model-operation table (ops.ts, gemm.ts),
 * so that they run wherever their tensors live (`cpu` or `cuda:N`): the pre-LN GPT-2 transformer
 * block's forward and backward over `batch` samples of `context` positions of `dim` values, and
 * the seeded N(0, std) initialisation GPT-2 uses.
 *
 * The block, per position row (R = batch * context rows of dim values):
 *   u = LN1(x); q, k, v = u Wq^T + bq, u Wk^T + bk, u Wv^T + bv
 *   o = causal multi-head attention(q, k, v); h = x + o Wproj^T + bproj
 *   w = LN2(h); f = w W1^T + b1; g = gelu(f); y = h + g W2^T + b2
 * What the forward keeps for the backward lies in one `saved` tensor (see {@link blockSavedFloats}).
 */
import { denseForward, denseInputGrad, denseWeightGrad } from './linear.js';
import { add, attention, attentionGrad, gelu, geluGrad, layerNorm, layerNormGrad, type Tensor, type TensorView } from './ops.js';

/** The shape of a transformer block's pass. @internal */
export interface BlockShape {
  batch: number;
  context: number;
  dim: number;
  heads: number;
  hidden: number;
}

/** The block's parameter tensors (name suffix and shape) in ParamSet order. @internal */
export function blockParams(dim: number, hidden: number): Array<[string, number[]]> {
  const dense = (name: string, out: number, inF: number): Array<[string, number[]]> => [[`${name}.weight`, [out, inF]], [`${name}.bias`, [out]]];
  return [
    ['ln1.gamma', [dim]],
    ['ln1.beta', [dim]],
    ...dense('q', dim, dim),
    ...dense('k', dim, dim),
    ...dense('v', dim, dim),
    ...dense('proj', dim, dim),
    ['ln2.gamma', [dim]],
    ['ln2.beta', [dim]],
    ...dense('fc1', hidden, dim),
    ...dense('fc2', dim, hidden),
  ];
}

/** GPT-2's initial values: N(0, std) drawn from `next` by Box-Muller (two uniforms a pair). @internal */
export function gaussianInit(out: Float32Array, std: number, next: () => number): void {
  for (let i = 0; i < out.length; i += 2) {
    const r = Math.sqrt(-2 * Math.log(1 - next()));
    const a = 2 * Math.PI * next();
    out[i] = std * r * Math.cos(a);
    if (i + 1 < out.length) out[i + 1] = std * r * Math.sin(a);
  }
}

/** Floats per sample the block's forward keeps: LN1 out, its mean and rstd, q k v, o, lse, h, LN2 out, its mean and rstd, fc1 out, gelu out. @internal */
export function blockSavedFloats(context: number, dim: number, heads: number, hidden: number): number {
  return savedLayout({ batch: 1, context, dim, heads, hidden }).total;
}

/** Offsets of what the forward keeps in `saved` for a pass of `s`, and the floats in all (`total`). */
function savedLayout(s: BlockShape): Record<'ln1' | 'mean1' | 'rstd1' | 'q' | 'k' | 'v' | 'o' | 'lse' | 'h' | 'ln2' | 'mean2' | 'rstd2' | 'f1' | 'g' | 'total', number> {
  const rows = s.batch * s.context;
  const [n, hid] = [rows * s.dim, rows * s.hidden];
  const sizes = [['ln1', n], ['mean1', rows], ['rstd1', rows], ['q', n], ['k', n], ['v', n], ['o', n], ['lse', s.batch * s.heads * s.context], ['h', n], ['ln2', n], ['mean2', rows], ['rstd2', rows], ['f1', hid], ['g', hid]] as const;
  const out = {} as Record<(typeof sizes)[number][0] | 'total', number>;
  let at = 0;
  for (const [name, size] of sizes) {
    out[name] = at;
    at += size;
  }
  out.total = at;
  return out;
}

/**
 * The block's forward: y [R, dim] from x [R, dim], what the backward needs written into `saved`
 * ({@link blockSavedFloats} per sample), the parameters read through `w(name)`. @internal
 */
export function blockForward(y: Tensor, x: Tensor, saved: Tensor, w: (name: string) => TensorView, s: BlockShape): void {
  const rows = s.batch * s.context;
  const n = rows * s.dim;
  const at = savedLayout(s);
  const v = (name: keyof typeof at): TensorView => ({ buffer: saved, offset: at[name] });
  const [xv, yv] = [{ buffer: x }, { buffer: y }];
  layerNorm({ y: v('ln1'), mean: v('mean1'), rstd: v('rstd1') }, xv, w('ln1.gamma'), w('ln1.beta'), rows, s.dim);
  for (const p of ['q', 'k', 'v'] as const) denseForward(v(p), v('ln1'), w(`${p}.weight`), w(`${p}.bias`), rows, s.dim, s.dim);
  attention({ o: v('o'), lse: v('lse') }, v('q'), v('k'), v('v'), { batch: s.batch, seq: s.context, heads: s.heads, headDim: s.dim / s.heads });
  denseForward(yv, v('o'), w('proj.weight'), w('proj.bias'), rows, s.dim, s.dim);
  add(v('h'), xv, yv, n);
  layerNorm({ y: v('ln2'), mean: v('mean2'), rstd: v('rstd2') }, v('h'), w('ln2.gamma'), w('ln2.beta'), rows, s.dim);
  denseForward(v('f1'), v('ln2'), w('fc1.weight'), w('fc1.bias'), rows, s.dim, s.hidden);
  gelu(v('g'), v('f1'), rows * s.hidden);
  denseForward(yv, v('g'), w('fc2.weight'), w('fc2.bias'), rows, s.hidden, s.dim);
  add(yv, yv, v('h'), n);
}

/** Scratch tensors of the memory the block runs in. @internal */
export interface Scratch {
  take(length: number): Tensor;
  give(tensor: Tensor): void;
}

/**
 * The block's backward: dx [R, dim] (overwritten) from dy, the forward's input x and `saved`; the
 * parameter gradients written through `g(name)` (added to when `accumulate`), the weights the
 * forward read through `w(name)`. @internal
 */
export function blockBackward(
  dx: Tensor,
  dy: Tensor,
  x: Tensor,
  saved: Tensor,
  w: (name: string) => TensorView,
  g: (name: string) => TensorView,
  accumulate: boolean,
  s: BlockShape,
  scratch: Scratch,
): void {
  const rows = s.batch * s.context;
  const n = rows * s.dim;
  const at = savedLayout(s);
  const v = (name: keyof typeof at): TensorView => ({ buffer: saved, offset: at[name] });
  const dyv = { buffer: dy };
  // The MLP branch: y = h + fc2(gelu(fc1(LN2(h)))).
  const dg = scratch.take(rows * s.hidden);
  denseWeightGrad(g('fc2.weight'), g('fc2.bias'), v('g'), dyv, rows, s.hidden, s.dim, accumulate);
  denseInputGrad({ buffer: dg }, dyv, w('fc2.weight'), rows, s.hidden, s.dim);
  geluGrad({ buffer: dg }, v('f1'), { buffer: dg }, rows * s.hidden);
  const dln = scratch.take(n);
  denseWeightGrad(g('fc1.weight'), g('fc1.bias'), v('ln2'), { buffer: dg }, rows, s.dim, s.hidden, accumulate);
  denseInputGrad({ buffer: dln }, { buffer: dg }, w('fc1.weight'), rows, s.dim, s.hidden);
  scratch.give(dg);
  const dh = scratch.take(n);
  layerNormGrad({ dx: { buffer: dh }, dgamma: g('ln2.gamma'), dbeta: g('ln2.beta') }, { buffer: dln }, v('h'), { mean: v('mean2'), rstd: v('rstd2') }, w('ln2.gamma'), rows, s.dim, accumulate);
  add({ buffer: dh }, { buffer: dh }, dyv, n);
  // The attention branch: h = x + proj(attention(LN1(x))); dln holds d o, then d LN1(x).
  denseWeightGrad(g('proj.weight'), g('proj.bias'), v('o'), { buffer: dh }, rows, s.dim, s.dim, accumulate);
  denseInputGrad({ buffer: dln }, { buffer: dh }, w('proj.weight'), rows, s.dim, s.dim);
  const dqkv = scratch.take(3 * n);
  const d = (k: number): TensorView => ({ buffer: dqkv, offset: k * n });
  attentionGrad({ dq: d(0), dk: d(1), dv: d(2) }, { buffer: dln }, v('q'), v('k'), v('v'), { o: v('o'), lse: v('lse') }, { batch: s.batch, seq: s.context, heads: s.heads, headDim: s.dim / s.heads });
  (['q', 'k', 'v'] as const).forEach((p, k) => {
    denseWeightGrad(g(`${p}.weight`), g(`${p}.bias`), v('ln1'), d(k), rows, s.dim, s.dim, accumulate);
    denseInputGrad({ buffer: dln }, d(k), w(`${p}.weight`), rows, s.dim, s.dim, k > 0);
  });
  scratch.give(dqkv);
  layerNormGrad({ dx: { buffer: dx }, dgamma: g('ln1.gamma'), dbeta: g('ln1.beta') }, { buffer: dln }, { buffer: x }, { mean: v('mean1'), rstd: v('rstd1') }, w('ln1.gamma'), rows, s.dim, accumulate);
  scratch.give(dln);
  add({ buffer: dx }, { buffer: dx }, { buffer: dh }, n);
  scratch.give(dh);
}
