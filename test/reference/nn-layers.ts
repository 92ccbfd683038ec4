/**
 * The layer operations of native/include/sapipe/nn.h beyond the MLP's (GELU, residual add, layer
 * norm, token and position embedding, dropout), written out plainly in double precision, forward
 * and backward: what the CPU table is checked against, and what central finite differences check
 * the backward formulas of. Nothing here calls the package.
 */

const SQRT_2_OVER_PI = Math.sqrt(2 / Math.PI);
const GELU_A = 0.044715;

/** GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
export function geluReference(x: ArrayLike<number>): Float64Array {
  return Float64Array.from(x, (v) => 0.5 * v * (1 + Math.tanh(SQRT_2_OVER_PI * (v + GELU_A * v ** 3))));
}

/** dy * d gelu(x) / dx. */
export function geluGradReference(x: ArrayLike<number>, dy: ArrayLike<number>): Float64Array {
  return Float64Array.from(x, (v, i) => {
    const th = Math.tanh(SQRT_2_OVER_PI * (v + GELU_A * v ** 3));
    return dy[i]! * (0.5 * (1 + th) + 0.5 * v * (1 - th * th) * SQRT_2_OVER_PI * (1 + 3 * GELU_A * v * v));
  });
}

export function addReference(a: ArrayLike<number>, b: ArrayLike<number>): Float64Array {
  return Float64Array.from(a, (v, i) => v + b[i]!);
}

/** Layer norm per row with the biased variance; the saved mean and rstd too. */
export function layerNormReference(
  x: ArrayLike<number>,
  gamma: ArrayLike<number>,
  beta: ArrayLike<number>,
  rows: number,
  cols: number,
  eps: number,
): { y: Float64Array; mean: Float64Array; rstd: Float64Array } {
  const y = new Float64Array(rows * cols);
  const mean = new Float64Array(rows);
  const rstd = new Float64Array(rows);
  for (let r = 0; r < rows; r++) {
    let s = 0;
    for (let j = 0; j < cols; j++) s += x[r * cols + j]!;
    const mu = s / cols;
    let q = 0;
    for (let j = 0; j < cols; j++) q += (x[r * cols + j]! - mu) ** 2;
    const rs = 1 / Math.sqrt(q / cols + eps);
    mean[r] = mu;
    rstd[r] = rs;
    for (let j = 0; j < cols; j++) y[r * cols + j] = (x[r * cols + j]! - mu) * rs * gamma[j]! + beta[j]!;
  }
  return { y, mean, rstd };
}

/** The layer norm's gradients at x (mean and rstd recomputed here, in double). */
export function layerNormGradReference(
  dy: ArrayLike<number>,
  x: ArrayLike<number>,
  gamma: ArrayLike<number>,
  rows: number,
  cols: number,
  eps: number,
): { dx: Float64Array; dgamma: Float64Array; dbeta: Float64Array } {
  const { mean, rstd } = layerNormReference(x, gamma, new Float64Array(cols), rows, cols, eps);
  const dx = new Float64Array(rows * cols);
  const dgamma = new Float64Array(cols);
  const dbeta = new Float64Array(cols);
  for (let r = 0; r < rows; r++) {
    const xhat = (j: number): number => (x[r * cols + j]! - mean[r]!) * rstd[r]!;
    let mg = 0;
    let mgx = 0;
    for (let j = 0; j < cols; j++) {
      const g = dy[r * cols + j]! * gamma[j]!;
      mg += g / cols;
      mgx += (g * xhat(j)) / cols;
      dgamma[j]! += dy[r * cols + j]! * xhat(j);
      dbeta[j]! += dy[r * cols + j]!;
    }
    for (let j = 0; j < cols; j++) dx[r * cols + j] = rstd[r]! * (dy[r * cols + j]! * gamma[j]! - mg - xhat(j) * mgx);
  }
  return { dx, dgamma, dbeta };
}

const isToken = (t: number, vocab: number): boolean => Number.isInteger(t) && t >= 0 && t < vocab;

/** y[b, s, :] = tokenTable[t, :] + positionTable[s, :]; NaN rows for tokens that are no token number. */
export function embeddingReference(
  tokens: ArrayLike<number>,
  tokenTable: ArrayLike<number>,
  positionTable: ArrayLike<number>,
  batch: number,
  seq: number,
  vocab: number,
  dim: number,
): Float64Array {
  const y = new Float64Array(batch * seq * dim);
  for (let row = 0; row < batch * seq; row++) {
    const t = tokens[row]!;
    const s = row % seq;
    for (let j = 0; j < dim; j++) y[row * dim + j] = isToken(t, vocab) ? tokenTable[t * dim + j]! + positionTable[s * dim + j]! : Number.NaN;
  }
  return y;
}

export function embeddingGradReference(
  dy: ArrayLike<number>,
  tokens: ArrayLike<number>,
  batch: number,
  seq: number,
  vocab: number,
  dim: number,
): { dtoken: Float64Array; dposition: Float64Array } {
  const dtoken = new Float64Array(vocab * dim);
  const dposition = new Float64Array(seq * dim);
  for (let row = 0; row < batch * seq; row++) {
    const t = tokens[row]!;
    for (let j = 0; j < dim; j++) {
      if (isToken(t, vocab)) dtoken[t * dim + j]! += dy[row * dim + j]!;
      dposition[(row % seq) * dim + j]! += dy[row * dim + j]!;
    }
  }
  return { dtoken, dposition };
}

const MASK64 = (1n << 64n) - 1n;

/** The dropout's uniform draw in [0, 1): SplitMix64's finaliser of seed * 0x9E3779B97F4A7C15 + index (mod 2^64), top 24 bits. */
export function dropoutUniformReference(seed: number, index: number): number {
  let z = (BigInt(seed) * 0x9e3779b97f4a7c15n + BigInt(index)) & MASK64;
  z = ((z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n) & MASK64;
  z = ((z ^ (z >> 27n)) * 0x94d049bb133111ebn) & MASK64;
  z ^= z >> 31n;
  return Number(z >> 40n) / 2 ** 24;
}

/** Inverted dropout: x / (1 - p) where the draw is at least p, else 0. */
export function dropoutReference(x: ArrayLike<number>, p: number, seed: number, offset: number): Float64Array {
  return Float64Array.from(x, (v, i) => (dropoutUniformReference(seed, offset + i) >= p ? v / (1 - p) : 0));
}

/**
 * Central finite differences of the scalar loss(x) = sum_i w_i f(x)_i at every element of x:
 * (loss(x + h e_i) - loss(x - h e_i)) / 2h, in double.
 */
export function finiteDifferences(x: Float64Array, w: ArrayLike<number>, f: (x: Float64Array) => ArrayLike<number>, h = 1e-5): Float64Array {
  const loss = (v: Float64Array): number => {
    const y = f(v);
    let s = 0;
    for (let i = 0; i < y.length; i++) s += w[i]! * y[i]!;
    return s;
  };
  return Float64Array.from(x, (v, i) => {
    const up = Float64Array.from(x);
    const down = Float64Array.from(x);
    up[i] = v + h;
    down[i] = v - h;
    return (loss(up) - loss(down)) / (2 * h);
  });
}

/** The attention's shape: q, k, v, o are [batch, seq, heads * dim], lse [batch, heads, seq]. */
export interface AttentionShapeRef {
  batch: number;
  seq: number;
  heads: number;
  headDim: number;
}

/** Causal multi-head self-attention, the score row materialised: o and the per-row logsumexp. */
export function attentionReference(
  q: ArrayLike<number>,
  k: ArrayLike<number>,
  v: ArrayLike<number>,
  shape: AttentionShapeRef,
  scale: number,
): { o: Float64Array; lse: Float64Array } {
  const { batch, seq, heads, headDim: dim } = shape;
  const width = heads * dim;
  const at = (b: number, h: number, i: number): number => (b * seq + i) * width + h * dim;
  const o = new Float64Array(batch * seq * width);
  const lse = new Float64Array(batch * heads * seq);
  for (let b = 0; b < batch; b++)
    for (let h = 0; h < heads; h++)
      for (let i = 0; i < seq; i++) {
        const scores: number[] = [];
        for (let j = 0; j <= i; j++) {
          let s = 0;
          for (let d = 0; d < dim; d++) s += q[at(b, h, i) + d]! * k[at(b, h, j) + d]!;
          scores.push(scale * s);
        }
        const max = Math.max(...scores);
        const total = scores.reduce((s, x) => s + Math.exp(x - max), 0);
        lse[(b * heads + h) * seq + i] = max + Math.log(total);
        for (let j = 0; j <= i; j++) {
          const p = Math.exp(scores[j]! - max) / total;
          for (let d = 0; d < dim; d++) o[at(b, h, i) + d]! += p * v[at(b, h, j) + d]!;
        }
      }
  return { o, lse };
}

/**
 * The attention's gradients by the chain rule through the materialised softmax: dP = dout V^T,
 * dS = P * (dP - rowsum(dP * P)), dQ = scale dS K, dK = scale dS^T Q, dV = P^T dout.
 */
export function attentionGradReference(
  dout: ArrayLike<number>,
  q: ArrayLike<number>,
  k: ArrayLike<number>,
  v: ArrayLike<number>,
  shape: AttentionShapeRef,
  scale: number,
): { dq: Float64Array; dk: Float64Array; dv: Float64Array } {
  const { batch, seq, heads, headDim: dim } = shape;
  const width = heads * dim;
  const at = (b: number, h: number, i: number): number => (b * seq + i) * width + h * dim;
  const n = batch * seq * width;
  const [dq, dk, dv] = [new Float64Array(n), new Float64Array(n), new Float64Array(n)];
  const { lse } = attentionReference(q, k, v, shape, scale);
  for (let b = 0; b < batch; b++)
    for (let h = 0; h < heads; h++)
      for (let i = 0; i < seq; i++) {
        const p: number[] = [];
        const dp: number[] = [];
        for (let j = 0; j <= i; j++) {
          let s = 0;
          let g = 0;
          for (let d = 0; d < dim; d++) {
            s += q[at(b, h, i) + d]! * k[at(b, h, j) + d]!;
            g += dout[at(b, h, i) + d]! * v[at(b, h, j) + d]!;
          }
          p.push(Math.exp(scale * s - lse[(b * heads + h) * seq + i]!));
          dp.push(g);
        }
        const rowsum = p.reduce((s, pj, j) => s + pj * dp[j]!, 0);
        for (let j = 0; j <= i; j++) {
          const ds = p[j]! * (dp[j]! - rowsum);
          for (let d = 0; d < dim; d++) {
            dq[at(b, h, i) + d]! += scale * ds * k[at(b, h, j) + d]!;
            dk[at(b, h, j) + d]! += scale * ds * q[at(b, h, i) + d]!;
            dv[at(b, h, j) + d]! += p[j]! * dout[at(b, h, i) + d]!;
          }
        }
      }
  return { dq, dk, dv };
}

/** A convolution's shape with every field given (strides and padding too). */
export interface ConvShapeRef {
  batch: number;
  inChannels: number;
  height: number;
  width: number;
  outChannels: number;
  kernelH: number;
  kernelW: number;
  strideH: number;
  strideW: number;
  padH: number;
  padW: number;
}

export const convOut = (s: ConvShapeRef): [number, number] => [
  Math.floor((s.height + 2 * s.padH - s.kernelH) / s.strideH) + 1,
  Math.floor((s.width + 2 * s.padW - s.kernelW) / s.strideW) + 1,
];

/** Calls visit(yIndex, wIndex, xIndex, k) for every product of the convolution whose input is inside the image. */
function eachConvTerm(s: ConvShapeRef, visit: (yIndex: number, wIndex: number, xIndex: number, k: number) => void): void {
  const [oh, ow] = convOut(s);
  for (let n = 0; n < s.batch; n++)
    for (let k = 0; k < s.outChannels; k++)
      for (let oy = 0; oy < oh; oy++)
        for (let ox = 0; ox < ow; ox++)
          for (let c = 0; c < s.inChannels; c++)
            for (let r = 0; r < s.kernelH; r++)
              for (let q = 0; q < s.kernelW; q++) {
                const iy = oy * s.strideH - s.padH + r;
                const ix = ox * s.strideW - s.padW + q;
                if (iy < 0 || iy >= s.height || ix < 0 || ix >= s.width) continue;
                visit(((n * s.outChannels + k) * oh + oy) * ow + ox, ((k * s.inChannels + c) * s.kernelH + r) * s.kernelW + q, ((n * s.inChannels + c) * s.height + iy) * s.width + ix, k);
              }
}

/** The convolution (cross-correlation) with zero padding, directly: y = bias + sum of w x. */
export function conv2dReference(x: ArrayLike<number>, w: ArrayLike<number>, bias: ArrayLike<number> | null, s: ConvShapeRef): Float64Array {
  const [oh, ow] = convOut(s);
  const y = new Float64Array(s.batch * s.outChannels * oh * ow);
  if (bias !== null) for (let i = 0; i < y.length; i++) y[i] = bias[Math.floor(i / (oh * ow)) % s.outChannels]!;
  eachConvTerm(s, (yi, wi, xi) => {
    y[yi]! += w[wi]! * x[xi]!;
  });
  return y;
}

/** Each product w x contributes dy w to dx, dy x to dw; db sums dy per channel. */
export function conv2dGradReference(dy: ArrayLike<number>, x: ArrayLike<number>, w: ArrayLike<number>, s: ConvShapeRef): { dx: Float64Array; dw: Float64Array; db: Float64Array } {
  const [oh, ow] = convOut(s);
  const dx = new Float64Array(s.batch * s.inChannels * s.height * s.width);
  const dw = new Float64Array(s.outChannels * s.inChannels * s.kernelH * s.kernelW);
  const db = new Float64Array(s.outChannels);
  for (let i = 0; i < s.batch * s.outChannels * oh * ow; i++) db[Math.floor(i / (oh * ow)) % s.outChannels]! += dy[i]!;
  eachConvTerm(s, (yi, wi, xi) => {
    dx[xi]! += dy[yi]! * w[wi]!;
    dw[wi]! += dy[yi]! * x[xi]!;
  });
  return { dx, dw, db };
}

/** A pooling's shape with every field given. */
export interface PoolShapeRef {
  batch: number;
  channels: number;
  height: number;
  width: number;
  kernelH: number;
  kernelW: number;
  strideH: number;
  strideW: number;
  padH: number;
  padW: number;
}

/** Calls visit(outIndex, inputIndices) with the in-image input indices of every window, row by row. */
function eachWindow(s: PoolShapeRef, visit: (o: number, inside: number[]) => void): void {
  const oh = Math.floor((s.height + 2 * s.padH - s.kernelH) / s.strideH) + 1;
  const ow = Math.floor((s.width + 2 * s.padW - s.kernelW) / s.strideW) + 1;
  for (let p = 0; p < s.batch * s.channels; p++)
    for (let oy = 0; oy < oh; oy++)
      for (let ox = 0; ox < ow; ox++) {
        const inside: number[] = [];
        for (let r = 0; r < s.kernelH; r++)
          for (let c = 0; c < s.kernelW; c++) {
            const [iy, ix] = [oy * s.strideH - s.padH + r, ox * s.strideW - s.padW + c];
            if (iy >= 0 && iy < s.height && ix >= 0 && ix < s.width) inside.push((p * s.height + iy) * s.width + ix);
          }
        visit((p * oh + oy) * ow + ox, inside);
      }
}

/** The window's first largest value, NaN skipped (a window of NaN only: NaN). */
const argmaxOf = (x: ArrayLike<number>, inside: number[]): number => {
  let best = -1;
  for (const i of inside) if (!Number.isNaN(x[i]!) && (best < 0 || x[i]! > x[best]!)) best = i;
  return best;
};

export function pool2dReference(x: ArrayLike<number>, s: PoolShapeRef, mode: 'max' | 'avg'): Float64Array {
  const out: number[] = [];
  eachWindow(s, (o, inside) => {
    if (mode === 'max') {
      const at = argmaxOf(x, inside);
      out[o] = at < 0 ? Number.NaN : x[at]!;
    } else out[o] = inside.reduce((sum, i) => sum + x[i]!, 0) / (s.kernelH * s.kernelW);
  });
  return Float64Array.from(out);
}

export function pool2dGradReference(dy: ArrayLike<number>, x: ArrayLike<number>, s: PoolShapeRef, mode: 'max' | 'avg'): Float64Array {
  const dx = new Float64Array(s.batch * s.channels * s.height * s.width);
  eachWindow(s, (o, inside) => {
    if (mode === 'max') {
      const at = argmaxOf(x, inside);
      if (at >= 0) dx[at]! += dy[o]!;
    } else for (const i of inside) dx[i]! += dy[o]! / (s.kernelH * s.kernelW);
  });
  return dx;
}
