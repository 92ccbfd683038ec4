/**
 * The layer operations (GELU, residual add, layer norm, token and position embedding, dropout;
 * lib/nn/ops.ts) run once at odd sizes in one memory (`cpu` or `cuda:N`), from the same seeded
 * inputs, each operand at an odd offset inside a larger buffer, with the outputs copied back: the
 * CPU's are checked against test/reference/nn-layers.ts (test/nn/layers.test.ts), a device's
 * against the CPU's (test/cuda/model-ops.test.ts).
 */
import { add, attention, attentionGrad, conv2d, conv2dGrad, dropout, pool2d, pool2dGrad, embedding, embeddingGrad, gelu, geluGrad, layerNorm, layerNormGrad, modelDevice, type Device, type Tensor } from '../../dist/nn/ops.js';
import { random, reluInput } from './model-ops.js';
import { rng } from './random.js';

export const geluCount = 1001;
export const addCount = 777;
export const layerNormCase = { rows: 37, cols: 67, eps: 1e-5 };
/** Token 2 of the first sequence is not a token number (a NaN row, no gradient). */
export const embeddingCase = { batch: 3, seq: 13, vocab: 11, dim: 29 };
export const dropoutCase = { count: 1001, p: 0.3, seed: 2024, offset: 17 };
/** Odd sizes; a head of fewer values than a warp's lanes, and one of more than two rounds of them. */
export const attentionCases = [
  { batch: 2, seq: 13, heads: 3, headDim: 19 },
  { batch: 1, seq: 6, heads: 2, headDim: 67 },
  // Past the CPU kernel's 32-query tiles: two whole tiles and a partial one.
  { batch: 2, seq: 77, heads: 2, headDim: 8 },
];

/** Padded 3x3 at stride 1; an oblong kernel at strides 2 and 3 with padding on one axis; a kernel the size of the image. */
export const convCases = [
  { batch: 2, inChannels: 3, height: 11, width: 9, outChannels: 5, kernelH: 3, kernelW: 3, strideH: 1, strideW: 1, padH: 1, padW: 1 },
  { batch: 1, inChannels: 2, height: 13, width: 10, outChannels: 4, kernelH: 4, kernelW: 3, strideH: 2, strideW: 3, padH: 1, padW: 0 },
  { batch: 3, inChannels: 1, height: 7, width: 7, outChannels: 2, kernelH: 7, kernelW: 7, strideH: 1, strideW: 1, padH: 0, padW: 0 },
];

export const convInputs = (i: number) => {
  const s = convCases[i]!;
  const oh = Math.floor((s.height + 2 * s.padH - s.kernelH) / s.strideH) + 1;
  const ow = Math.floor((s.width + 2 * s.padW - s.kernelW) / s.strideW) + 1;
  const wlen = s.outChannels * s.inChannels * s.kernelH * s.kernelW;
  return {
    x: random(s.batch * s.inChannels * s.height * s.width, 170 + i),
    w: random(wlen, 180 + i, 0.5),
    bias: random(s.outChannels, 190 + i),
    dy: random(s.batch * s.outChannels * oh * ow, 200 + i),
    dwStart: random(wlen, 210 + i),
    dbStart: random(s.outChannels, 220 + i),
    ylen: s.batch * s.outChannels * oh * ow,
  };
};

/** Windows side by side (the default stride); overlapping windows with padding; a window of the whole plane. */
export const poolCases = [
  { batch: 2, channels: 3, height: 10, width: 8, kernelH: 2, kernelW: 2, strideH: 2, strideW: 2, padH: 0, padW: 0 },
  { batch: 1, channels: 2, height: 9, width: 11, kernelH: 3, kernelW: 2, strideH: 2, strideW: 1, padH: 1, padW: 1 },
  { batch: 3, channels: 1, height: 5, width: 7, kernelH: 5, kernelW: 7, strideH: 1, strideW: 1, padH: 0, padW: 0 },
];

/** Rounded values (ties, so the first largest counts) and one NaN. */
export const poolInputs = (i: number) => {
  const s = poolCases[i]!;
  const x = random(s.batch * s.channels * s.height * s.width, 250 + i, 2).map(Math.round);
  x[4] = Number.NaN;
  const oh = Math.floor((s.height + 2 * s.padH - s.kernelH) / s.strideH) + 1;
  const ow = Math.floor((s.width + 2 * s.padW - s.kernelW) / s.strideW) + 1;
  return { x, dy: random(s.batch * s.channels * oh * ow, 260 + i) };
};

export const attentionInputs = (i: number) => {
  const { batch, seq, heads, headDim } = attentionCases[i]!;
  const n = batch * seq * heads * headDim;
  return { q: random(n, 110 + i), k: random(n, 120 + i), v: random(n, 130 + i), dout: random(n, 140 + i) };
};

/** Inputs of the layer norm: rows with a common offset (mean far from 0) so the centring matters. */
export const layerNormInputs = () => {
  const { rows, cols } = layerNormCase;
  const x = random(rows * cols, 70, 2);
  for (let i = 0; i < x.length; i++) x[i]! += 3;
  return { x, gamma: random(cols, 71), beta: random(cols, 72), dy: random(rows * cols, 73) };
};

export function embeddingTokens(): Float32Array {
  const { batch, seq, vocab } = embeddingCase;
  const next = rng(80);
  const tokens = Float32Array.from({ length: batch * seq }, () => Math.floor(next() * vocab));
  tokens[2] = vocab; // no token
  tokens[5] = tokens[6]!; // a repeated token within a sequence
  return tokens;
}

export const embeddingInputs = () => {
  const { batch, seq, vocab, dim } = embeddingCase;
  return {
    tokens: embeddingTokens(),
    tokenTable: random(vocab * dim, 81),
    positionTable: random(seq * dim, 82),
    dy: random(batch * seq * dim, 83),
    dtokenStart: random(vocab * dim, 84),
    dpositionStart: random(seq * dim, 85),
  };
};

export interface LayerOutputs {
  gelu: Float32Array;
  geluInPlace: Float32Array;
  geluGrad: Float32Array;
  add: Float32Array;
  addInPlace: Float32Array;
  layerNorm: { y: Float32Array; mean: Float32Array; rstd: Float32Array; inPlace: Float32Array };
  layerNormGrad: { dx: Float32Array; dgamma: Float32Array; dbeta: Float32Array; dgammaAccumulated: Float32Array; dbetaAccumulated: Float32Array; dxInPlace: Float32Array };
  embedding: Float32Array;
  embeddingGrad: { dtoken: Float32Array; dposition: Float32Array; dtokenAccumulated: Float32Array; dpositionAccumulated: Float32Array };
  dropout: Float32Array;
  dropoutInPlace: Float32Array;
  dropoutShifted: Float32Array;
  attention: { o: Float32Array; lse: Float32Array; dq: Float32Array; dk: Float32Array; dv: Float32Array }[];
  pool: { max: Float32Array; avg: Float32Array; maxGrad: Float32Array; avgGrad: Float32Array }[];
  conv: { y: Float32Array; yNoBias: Float32Array; dx: Float32Array; dw: Float32Array; db: Float32Array; dwAccumulated: Float32Array; dbAccumulated: Float32Array }[];
}

export function runLayerOps(device: Device): LayerOutputs {
  const memory = modelDevice(device);
  const made: Tensor[] = [];
  const at = 3;
  const put = (values: Float32Array): Tensor => {
    const t = memory.allocate(values.length + at + 5);
    made.push(t);
    memory.write(t, values, at);
    return t;
  };
  const zeros = (n: number): Tensor => put(new Float32Array(n));
  const get = (t: Tensor, n: number): Float32Array => memory.read(t, n, at);
  const v = (buffer: Tensor) => ({ buffer, offset: at });
  try {
    const n = geluCount;
    const gx = put(reluInput(n, 90));
    const gy = zeros(n);
    gelu(v(gy), v(gx), n);
    const gIn = put(reluInput(n, 90));
    gelu(v(gIn), v(gIn), n);
    const gdy = put(random(n, 91));
    geluGrad(v(gdy), v(gx), v(gdy), n);

    const a = put(random(addCount, 92));
    const b = put(random(addCount, 93));
    const ay = zeros(addCount);
    add(v(ay), v(a), v(b), addCount);
    add(v(a), v(a), v(b), addCount);

    const { rows, cols, eps } = layerNormCase;
    const li = layerNormInputs();
    const lx = put(li.x);
    const [gamma, beta] = [put(li.gamma), put(li.beta)];
    const [ly, mean, rstd] = [zeros(rows * cols), zeros(rows), zeros(rows)];
    layerNorm({ y: v(ly), mean: v(mean), rstd: v(rstd) }, v(lx), v(gamma), v(beta), rows, cols, eps);
    const lIn = put(li.x);
    layerNorm({ y: v(lIn), mean: v(zeros(rows)), rstd: v(zeros(rows)) }, v(lIn), v(gamma), v(beta), rows, cols, eps);
    const ldy = put(li.dy);
    const [ldx, dgamma, dbeta] = [zeros(rows * cols), put(random(cols, 74)), put(random(cols, 75))];
    layerNormGrad({ dx: v(ldx), dgamma: v(dgamma), dbeta: v(dbeta) }, v(ldy), v(lx), { mean: v(mean), rstd: v(rstd) }, v(gamma), rows, cols);
    const [dgammaAcc, dbetaAcc] = [put(random(cols, 74)), put(random(cols, 75))];
    const ldyIn = put(li.dy);
    layerNormGrad({ dx: v(ldyIn), dgamma: v(dgammaAcc), dbeta: v(dbetaAcc) }, v(ldyIn), v(lx), { mean: v(mean), rstd: v(rstd) }, v(gamma), rows, cols, true);

    const e = embeddingCase;
    const ei = embeddingInputs();
    const tokens = put(ei.tokens);
    const ey = zeros(e.batch * e.seq * e.dim);
    embedding(v(ey), v(tokens), v(put(ei.tokenTable)), v(put(ei.positionTable)), e);
    const edy = put(ei.dy);
    const [dtoken, dposition] = [put(ei.dtokenStart), put(ei.dpositionStart)];
    embeddingGrad({ dtokenTable: v(dtoken), dpositionTable: v(dposition) }, v(edy), v(tokens), e);
    const [dtokenAcc, dpositionAcc] = [put(ei.dtokenStart), put(ei.dpositionStart)];
    embeddingGrad({ dtokenTable: v(dtokenAcc), dpositionTable: v(dpositionAcc) }, v(edy), v(tokens), e, true);

    const d = dropoutCase;
    const dx = put(reluInput(d.count, 95));
    const dy = zeros(d.count);
    dropout(v(dy), v(dx), d.count, d);
    const dIn = put(reluInput(d.count, 95));
    dropout(v(dIn), v(dIn), d.count, d);
    // The second half of the same values, drawn from offset + half: the same mask as the whole's second half.
    const half = Math.floor(d.count / 2);
    const shifted = zeros(d.count - half);
    dropout(v(shifted), { buffer: dx, offset: at + half }, d.count - half, { ...d, offset: d.offset + half });

    const attn = attentionCases.map((shape, i) => {
      const ai = attentionInputs(i);
      const size = ai.q.length;
      const rowsCount = shape.batch * shape.heads * shape.seq;
      const [q, k, vv, dout] = [put(ai.q), put(ai.k), put(ai.v), put(ai.dout)];
      const [o, lse] = [zeros(size), zeros(rowsCount)];
      attention({ o: v(o), lse: v(lse) }, v(q), v(k), v(vv), shape);
      const [dq, dk, dv] = [put(random(size, 150)), put(random(size, 151)), put(random(size, 152))];
      attentionGrad({ dq: v(dq), dk: v(dk), dv: v(dv) }, v(dout), v(q), v(k), v(vv), { o: v(o), lse: v(lse) }, shape);
      return { o: get(o, size), lse: get(lse, rowsCount), dq: get(dq, size), dk: get(dk, size), dv: get(dv, size) };
    });

    const conv = convCases.map((shape, i) => {
      const ci = convInputs(i);
      const [x, w] = [put(ci.x), put(ci.w)];
      const [y, y2] = [put(random(ci.ylen, 230)), put(random(ci.ylen, 231))];
      conv2d(v(y), v(x), v(w), v(put(ci.bias)), shape);
      conv2d(v(y2), v(x), v(w), undefined, shape);
      const dy = put(ci.dy);
      const [dx, dw, db] = [put(random(ci.x.length, 232)), put(random(ci.w.length, 233)), put(random(shape.outChannels, 234))];
      conv2dGrad({ dx: v(dx), dw: v(dw), db: v(db) }, v(dy), v(x), v(w), shape);
      const [dwAcc, dbAcc] = [put(ci.dwStart), put(ci.dbStart)];
      conv2dGrad({ dw: v(dwAcc), db: v(dbAcc) }, v(dy), v(x), v(w), shape, true);
      return {
        y: get(y, ci.ylen),
        yNoBias: get(y2, ci.ylen),
        dx: get(dx, ci.x.length),
        dw: get(dw, ci.w.length),
        db: get(db, shape.outChannels),
        dwAccumulated: get(dwAcc, ci.w.length),
        dbAccumulated: get(dbAcc, shape.outChannels),
      };
    });

    const pool = poolCases.map((shape, i) => {
      const pi = poolInputs(i);
      const x = put(pi.x);
      const dy = put(pi.dy);
      const run = (mode: 'max' | 'avg') => {
        const y = put(random(pi.dy.length, 270));
        pool2d(v(y), v(x), shape, mode);
        const dx = put(random(pi.x.length, 271));
        pool2dGrad(v(dx), v(dy), v(x), shape, mode);
        return [get(y, pi.dy.length), get(dx, pi.x.length)] as const;
      };
      const [max, maxGrad] = run('max');
      const [avg, avgGrad] = run('avg');
      return { max, avg, maxGrad, avgGrad };
    });

    return {
      pool,
      conv,
      attention: attn,
      gelu: get(gy, n),
      geluInPlace: get(gIn, n),
      geluGrad: get(gdy, n),
      add: get(ay, addCount),
      addInPlace: get(a, addCount),
      layerNorm: { y: get(ly, rows * cols), mean: get(mean, rows), rstd: get(rstd, rows), inPlace: get(lIn, rows * cols) },
      layerNormGrad: {
        dx: get(ldx, rows * cols),
        dgamma: get(dgamma, cols),
        dbeta: get(dbeta, cols),
        dgammaAccumulated: get(dgammaAcc, cols),
        dbetaAccumulated: get(dbetaAcc, cols),
        dxInPlace: get(ldyIn, rows * cols),
      },
      embedding: get(ey, e.batch * e.seq * e.dim),
      embeddingGrad: {
        dtoken: get(dtoken, e.vocab * e.dim),
        dposition: get(dposition, e.seq * e.dim),
        dtokenAccumulated: get(dtokenAcc, e.vocab * e.dim),
        dpositionAccumulated: get(dpositionAcc, e.seq * e.dim),
      },
      dropout: get(dy, d.count),
      dropoutInPlace: get(dIn, d.count),
      dropoutShifted: get(shifted, d.count - half),
    };
  } finally {
    for (const t of made) t.dispose();
  }
}
