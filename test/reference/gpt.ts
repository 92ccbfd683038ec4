/**
 * A GPT's forward in double precision, written out plainly from the layer references of
 * nn-layers.ts (embedding, layer norm, causal attention, GELU): the token and position embedding,
 * the pre-LN GPT-2 block, a layer norm over each position and a linear map of each position, with
 * the parameters by name as the package's Sequential names them. Nothing here calls the package.
 */
import { attentionReference, embeddingReference, geluReference, layerNormReference } from './nn-layers.js';

/** The GPT layer kinds this reference runs (the shapes of the package's LayerSpec). */
export type GptLayerRef =
  | { kind: 'embedding'; vocab: number; dim: number; context: number }
  | { kind: 'transformerBlock'; dim: number; heads: number; context: number; hidden?: number }
  | { kind: 'layerNorm'; features: number; rows?: number }
  | { kind: 'linear'; in: number; out: number; rows?: number };

/** y[r, o] = b[o] + sum_k w[o, k] x[r, k] over `rows` rows. */
export function denseReference(x: ArrayLike<number>, w: ArrayLike<number>, b: ArrayLike<number>, rows: number, inF: number, outF: number): Float64Array {
  const y = new Float64Array(rows * outF);
  for (let r = 0; r < rows; r++)
    for (let o = 0; o < outF; o++) {
      let s = b[o]!;
      for (let k = 0; k < inF; k++) s += w[o * inF + k]! * x[r * inF + k]!;
      y[r * outF + o] = s;
    }
  return y;
}

const plus = (a: ArrayLike<number>, b: ArrayLike<number>): Float64Array => Float64Array.from(a, (v, i) => v + b[i]!);

/** One pre-LN block over `rows` = batch * context rows of dim: x + proj(attn(LN1 x)), then + fc2(gelu(fc1(LN2 h))). */
export function blockReference(x: ArrayLike<number>, p: (name: string) => Float64Array, batch: number, l: { dim: number; heads: number; context: number; hidden?: number }): Float64Array {
  const { dim, heads, context } = l;
  const hidden = l.hidden ?? 4 * dim;
  const rows = batch * context;
  const u = layerNormReference(x, p('ln1.gamma'), p('ln1.beta'), rows, dim, 1e-5).y;
  const [q, k, v] = ['q', 'k', 'v'].map((n) => denseReference(u, p(`${n}.weight`), p(`${n}.bias`), rows, dim, dim));
  const o = attentionReference(q!, k!, v!, { batch, seq: context, heads, headDim: dim / heads }, 1 / Math.sqrt(dim / heads)).o;
  const h = plus(x, denseReference(o, p('proj.weight'), p('proj.bias'), rows, dim, dim));
  const w = layerNormReference(h, p('ln2.gamma'), p('ln2.beta'), rows, dim, 1e-5).y;
  const g = geluReference(denseReference(w, p('fc1.weight'), p('fc1.bias'), rows, dim, hidden));
  return plus(h, denseReference(g, p('fc2.weight'), p('fc2.bias'), rows, hidden, dim));
}

/**
 * The forward of `layers` (from the model's layer `first`) on `batch` samples, the parameters by
 * name (`layer{i}.tokens`, `layer{i}.ln1.gamma`, ...).
 */
export function gptForwardReference(layers: readonly GptLayerRef[], params: Map<string, Float64Array>, x: ArrayLike<number>, batch: number, first = 0): Float64Array {
  let h: Float64Array = Float64Array.from(x);
  layers.forEach((l, j) => {
    const i = first + j;
    const p = (name: string): Float64Array => {
      const v = params.get(`layer${i}.${name}`);
      if (!v) throw new Error(`no parameter layer${i}.${name}`);
      return v;
    };
    switch (l.kind) {
      case 'embedding':
        h = embeddingReference(h, p('tokens'), p('positions'), batch, l.context, l.vocab, l.dim);
        break;
      case 'transformerBlock':
        h = blockReference(h, p, batch, l);
        break;
      case 'layerNorm':
        h = layerNormReference(h, p('gamma'), p('beta'), batch * (l.rows ?? 1), l.features, 1e-5).y;
        break;
      case 'linear':
        h = denseReference(h, p('weight'), p('bias'), batch * (l.rows ?? 1), l.in, l.out);
        break;
    }
  });
  return h;
}
