/**
 * The layer operations of the CPU table (GELU, residual add, layer norm, token and position
 * embedding, dropout; native/cpu/nn_ops.cpp through lib/nn/ops.ts) against the plain
 * double-precision reference (test/reference/nn-layers.ts) at odd sizes and offsets; the
 * reference's backward formulas against central finite differences of its forward; and the typed
 * errors at the public boundary.
 */
import t, { type Test } from 'tap';

import { SapipeError } from '../../dist/errors.js';
import { add, attention, attentionGrad, conv2d, conv2dOutputSize, dropout, pool2d, embedding, gelu, layerNorm } from '../../dist/nn/ops.js';
import { FlatBuffer } from '../../dist/tensor.js';
import { addCount, attentionCases, attentionInputs, convCases, convInputs, poolCases, poolInputs, dropoutCase, embeddingCase, embeddingInputs, geluCount, layerNormCase, layerNormInputs, runLayerOps } from '../helpers/layer-ops.js';
import { random, reluInput } from '../helpers/model-ops.js';
import { worstError } from '../helpers/random.js';
import {
  addReference,
  attentionGradReference,
  attentionReference,
  conv2dGradReference,
  conv2dReference,
  pool2dGradReference,
  pool2dReference,
  dropoutReference,
  dropoutUniformReference,
  embeddingGradReference,
  embeddingReference,
  finiteDifferences,
  geluGradReference,
  geluReference,
  layerNormGradReference,
  layerNormReference,
} from '../reference/nn-layers.js';

const f32 = (x: ArrayLike<number>): Float32Array => Float32Array.from(x);
const f64 = (x: ArrayLike<number>): Float64Array => Float64Array.from(x);
const out = runLayerOps('cpu');

/** Within `atol + rtol |want|` where the reference is finite; the same NaN or infinity where it is not. */
function close(t: Test, got: Float32Array, want: ArrayLike<number>, atol: number, rtol: number, what: string): void {
  const special = (a: ArrayLike<number>) => Array.from(a, (v, i) => (Number.isFinite(want[i]!) ? '' : String(v)));
  t.same(special(got), special(want), `${what}: NaN and infinities where the reference has them`);
  const keep = (a: ArrayLike<number>) => f32(Array.from(a).filter((_, i) => Number.isFinite(want[i]!)));
  const e = worstError(keep(got), keep(want), atol, rtol);
  t.ok(e.ratio <= 1, `${what}: worst ${e.ratio.toFixed(3)} of tolerance (${atol} + ${rtol} relative)`);
}

// The finite-difference checks: a random weighting w of the outputs makes the scalar loss
// sum_i w_i y_i, whose gradient the reference's backward gives with dy = w.
const fdTolerance = { atol: 1e-7, rtol: 1e-6 };
function fdCheck(t: Test, analytic: ArrayLike<number>, numeric: ArrayLike<number>, what: string): void {
  let worst = 0;
  for (let i = 0; i < numeric.length; i++)
    worst = Math.max(worst, Math.abs(analytic[i]! - numeric[i]!) / (fdTolerance.atol + fdTolerance.rtol * Math.abs(numeric[i]!)));
  t.ok(worst <= 1, `${what}: the backward equals central differences (h = 1e-5), worst ${worst.toFixed(3)} of 1e-7 + 1e-6 relative`);
}

t.test('GELU (tanh form) and its gradient against the reference (1e-7 and 1e-6 absolute + 1e-6 relative), in place; the gradient against finite differences', async (t) => {
  const x = reluInput(geluCount, 90);
  close(t, out.gelu, geluReference(x), 1e-7, 1e-6, 'gelu');
  t.same(Array.from(out.geluInPlace, String), Array.from(out.gelu, String), 'in place, the same values');
  close(t, out.geluGrad, geluGradReference(x, random(geluCount, 91)), 1e-6, 1e-6, 'gelu gradient (written over dy)');
  t.equal(out.gelu[2], Number.POSITIVE_INFINITY, 'gelu(inf) = inf');
  const xs = f64(random(41, 96, 2));
  const w = f64(random(41, 97));
  fdCheck(t, geluGradReference(xs, w), finiteDifferences(xs, w, geluReference), 'gelu');
});

t.test('residual add: exactly the float sum, in place too; its gradient (dy to both branches) against finite differences', async (t) => {
  const [a, b] = [random(addCount, 92), random(addCount, 93)];
  const want = f32(addReference(a, b));
  t.same(Array.from(out.add), Array.from(want), 'a + b rounded once');
  t.same(Array.from(out.addInPlace), Array.from(want), 'y = a');
  const [xa, xb, w] = [f64(random(23, 98)), f64(random(23, 99)), f64(random(23, 100))];
  fdCheck(t, w, finiteDifferences(xa, w, (v) => addReference(v, xb)), 'add, first branch');
  fdCheck(t, w, finiteDifferences(xb, w, (v) => addReference(xa, v)), 'add, second branch');
});

t.test('layer norm forward and backward against the reference (1e-5 + 1e-5 relative), accumulated and in place; the backward against finite differences', async (t) => {
  const { rows, cols, eps } = layerNormCase;
  const { x, gamma, beta, dy } = layerNormInputs();
  const ref = layerNormReference(x, gamma, beta, rows, cols, eps);
  close(t, out.layerNorm.y, ref.y, 1e-5, 1e-5, 'y');
  close(t, out.layerNorm.mean, ref.mean, 1e-6, 1e-6, 'saved mean');
  close(t, out.layerNorm.rstd, ref.rstd, 1e-6, 1e-6, 'saved rstd');
  t.same(Array.from(out.layerNorm.inPlace), Array.from(out.layerNorm.y), 'y written over x: the same values');
  const g = layerNormGradReference(dy, x, gamma, rows, cols, eps);
  close(t, out.layerNormGrad.dx, g.dx, 1e-5, 1e-5, 'dx');
  close(t, out.layerNormGrad.dgamma, g.dgamma, 1e-5, 1e-5, 'dgamma');
  close(t, out.layerNormGrad.dbeta, g.dbeta, 1e-5, 1e-5, 'dbeta');
  const startG = random(cols, 74);
  const startB = random(cols, 75);
  close(t, out.layerNormGrad.dgammaAccumulated, g.dgamma.map((v, j) => v + startG[j]!), 1e-5, 1e-5, 'dgamma accumulated');
  close(t, out.layerNormGrad.dbetaAccumulated, g.dbeta.map((v, j) => v + startB[j]!), 1e-5, 1e-5, 'dbeta accumulated');
  t.same(Array.from(out.layerNormGrad.dxInPlace), Array.from(out.layerNormGrad.dx), 'dx written over dy: the same values');

  const [r, c] = [3, 7];
  const xs = f64(random(r * c, 101, 2));
  const [gs, bs, w] = [f64(random(c, 102)), f64(random(c, 103)), f64(random(r * c, 104))];
  const an = layerNormGradReference(w, xs, gs, r, c, eps);
  fdCheck(t, an.dx, finiteDifferences(xs, w, (v) => layerNormReference(v, gs, bs, r, c, eps).y), 'layer norm dx');
  fdCheck(t, an.dgamma, finiteDifferences(gs, w, (v) => layerNormReference(xs, v, bs, r, c, eps).y), 'layer norm dgamma');
  fdCheck(t, an.dbeta, finiteDifferences(bs, w, (v) => layerNormReference(xs, gs, v, r, c, eps).y), 'layer norm dbeta');
});

t.test('token and position embedding: the gather exactly, NaN rows for a bad token; the scatter-add (1e-6 + 1e-6 relative), accumulated; against finite differences', async (t) => {
  const { batch, seq, vocab, dim } = embeddingCase;
  const ei = embeddingInputs();
  const want = f32(embeddingReference(ei.tokens, ei.tokenTable, ei.positionTable, batch, seq, vocab, dim));
  t.same(Array.from(out.embedding, String), Array.from(want, String), 'table rows added, rounded once; NaN at the token that is none');
  t.ok(out.embedding.subarray(2 * dim, 3 * dim).every(Number.isNaN), 'the bad token gives a NaN row');
  const g = embeddingGradReference(ei.dy, ei.tokens, batch, seq, vocab, dim);
  close(t, out.embeddingGrad.dtoken, g.dtoken, 1e-6, 1e-6, 'token table gradient (overwritten)');
  close(t, out.embeddingGrad.dposition, g.dposition, 1e-6, 1e-6, 'position table gradient (overwritten)');
  close(t, out.embeddingGrad.dtokenAccumulated, g.dtoken.map((v, i) => v + ei.dtokenStart[i]!), 1e-6, 1e-6, 'token table gradient, accumulated');
  close(t, out.embeddingGrad.dpositionAccumulated, g.dposition.map((v, i) => v + ei.dpositionStart[i]!), 1e-6, 1e-6, 'position table gradient, accumulated');

  const tokens = ei.tokens.map((v) => (v >= vocab ? 0 : v));
  const w = f64(random(batch * seq * dim, 105));
  const an = embeddingGradReference(w, tokens, batch, seq, vocab, dim);
  const [tt, pt] = [f64(ei.tokenTable), f64(ei.positionTable)];
  fdCheck(t, an.dtoken, finiteDifferences(tt, w, (v) => embeddingReference(tokens, v, pt, batch, seq, vocab, dim)), 'embedding, token table');
  fdCheck(t, an.dposition, finiteDifferences(pt, w, (v) => embeddingReference(tokens, tt, v, batch, seq, vocab, dim)), 'embedding, position table');
});

t.test('dropout: the reference mask from (seed, offset), kept values scaled (2.5e-7 relative: x times the float 1 / (1 - p)), in place, from an offset; its backward against finite differences', async (t) => {
  const { count, p, seed, offset } = dropoutCase;
  const x = reluInput(count, 95);
  const want = dropoutReference(x, p, seed, offset);
  close(t, out.dropout, want, 1e-30, 2.5e-7, 'dropout');
  t.same(Array.from(out.dropoutInPlace, String), Array.from(out.dropout, String), 'in place, the same values');
  const half = Math.floor(count / 2);
  t.same(Array.from(out.dropoutShifted, String), Array.from(out.dropout.subarray(half), String), 'a range drawn from offset + half: the same mask');
  const kept = Array.from({ length: count }, (_, i) => (dropoutUniformReference(seed, offset + i) >= p ? 1 : 0)).reduce<number>((s, k) => s + k, 0);
  t.ok(Math.abs(kept / count - (1 - p)) < 0.05, `about 1 - p kept (${kept} of ${count})`);
  t.equal(dropoutUniformReference(0, 0), 0, 'u(0, 0) = 0: the finaliser of 0 is 0');
  const xs = f64(random(31, 106));
  const w = f64(random(31, 107));
  fdCheck(t, dropoutReference(w, p, seed, 5), finiteDifferences(xs, w, (v) => dropoutReference(v, p, seed, 5)), 'dropout (backward = the same mask on dy)');
  const y = FlatBuffer.allocate(9);
  const src = FlatBuffer.from(random(9, 108));
  dropout({ buffer: y }, { buffer: src }, 9, { p: 0, seed: 1 });
  t.same(Array.from(y.array), Array.from(src.array), 'p = 0 copies');
  y.dispose();
  src.dispose();
});

t.test('causal self-attention forward (o, lse) and backward (dq, dk, dv) against the reference (1e-6 + 1e-5 relative); the backward against finite differences', async (t) => {
  attentionCases.forEach((shape, i) => {
    const { q, k, v, dout } = attentionInputs(i);
    const scale = 1 / Math.sqrt(shape.headDim);
    const ref = attentionReference(q, k, v, shape, scale);
    const got = out.attention[i]!;
    const name = `${shape.batch}x${shape.seq}, ${shape.heads} heads of ${shape.headDim}`;
    close(t, got.o, ref.o, 1e-6, 1e-5, `${name}: o`);
    close(t, got.lse, ref.lse, 1e-6, 1e-5, `${name}: lse`);
    const g = attentionGradReference(dout, q, k, v, shape, scale);
    close(t, got.dq, g.dq, 1e-6, 1e-5, `${name}: dq`);
    close(t, got.dk, g.dk, 1e-6, 1e-5, `${name}: dk`);
    close(t, got.dv, g.dv, 1e-6, 1e-5, `${name}: dv`);
  });
  const shape = { batch: 2, seq: 4, heads: 2, headDim: 3 };
  const n = shape.batch * shape.seq * shape.heads * shape.headDim;
  const [q, k, v, w] = [f64(random(n, 160)), f64(random(n, 161)), f64(random(n, 162)), f64(random(n, 163))];
  const scale = 0.7;
  const an = attentionGradReference(w, q, k, v, shape, scale);
  fdCheck(t, an.dq, finiteDifferences(q, w, (x) => attentionReference(x, k, v, shape, scale).o), 'attention dq');
  fdCheck(t, an.dk, finiteDifferences(k, w, (x) => attentionReference(q, x, v, shape, scale).o), 'attention dk');
  fdCheck(t, an.dv, finiteDifferences(v, w, (x) => attentionReference(q, k, x, shape, scale).o), 'attention dv');
  // The first query attends to itself only: its output is v_0 exactly, whatever the scores.
  const o = attentionReference(q, k, v, shape, scale).o;
  t.same(Array.from(o.subarray(0, 3)), Array.from(v.subarray(0, 3)), 'causal: query 0 sees key 0 only');
});

t.test('conv2d forward (with and without bias) and backward (dx, dw, db, accumulated) against the reference (1e-5 + 1e-5 relative); the backward against finite differences', async (t) => {
  convCases.forEach((shape, i) => {
    const ci = convInputs(i);
    const got = out.conv[i]!;
    const name = `${shape.batch}x${shape.inChannels}x${shape.height}x${shape.width} -> ${shape.outChannels}, kernel ${shape.kernelH}x${shape.kernelW}, stride ${shape.strideH},${shape.strideW}, pad ${shape.padH},${shape.padW}`;
    close(t, got.y, conv2dReference(ci.x, ci.w, ci.bias, shape), 1e-5, 1e-5, `${name}: y`);
    close(t, got.yNoBias, conv2dReference(ci.x, ci.w, null, shape), 1e-5, 1e-5, `${name}: y without bias`);
    const g = conv2dGradReference(ci.dy, ci.x, ci.w, shape);
    close(t, got.dx, g.dx, 1e-5, 1e-5, `${name}: dx`);
    close(t, got.dw, g.dw, 1e-5, 1e-5, `${name}: dw`);
    close(t, got.db, g.db, 1e-5, 1e-5, `${name}: db`);
    close(t, got.dwAccumulated, g.dw.map((v, j) => v + ci.dwStart[j]!), 1e-5, 1e-5, `${name}: dw accumulated`);
    close(t, got.dbAccumulated, g.db.map((v, j) => v + ci.dbStart[j]!), 1e-5, 1e-5, `${name}: db accumulated`);
  });
  const s = { batch: 2, inChannels: 2, height: 5, width: 4, outChannels: 3, kernelH: 3, kernelW: 2, strideH: 2, strideW: 1, padH: 1, padW: 1 };
  const { height: oh, width: ow } = conv2dOutputSize(s);
  t.same([oh, ow], [3, 5], 'the output size: floor((in + 2 pad - kernel) / stride) + 1');
  const [x, w, b] = [f64(random(2 * 2 * 5 * 4, 240)), f64(random(3 * 2 * 3 * 2, 241)), f64(random(3, 242))];
  const dyw = f64(random(2 * 3 * oh * ow, 243));
  const an = conv2dGradReference(dyw, x, w, s);
  fdCheck(t, an.dx, finiteDifferences(x, dyw, (v) => conv2dReference(v, w, b, s)), 'conv2d dx');
  fdCheck(t, an.dw, finiteDifferences(w, dyw, (v) => conv2dReference(x, v, b, s)), 'conv2d dw');
  fdCheck(t, an.db, finiteDifferences(b, dyw, (v) => conv2dReference(x, w, v, s)), 'conv2d db');
});

t.test('max and average pooling forward and backward against the reference (max exact, average 1e-6 + 1e-6 relative), ties and NaN included; the backward against finite differences', async (t) => {
  poolCases.forEach((shape, i) => {
    const { x, dy } = poolInputs(i);
    const got = out.pool[i]!;
    const name = `${shape.batch}x${shape.channels}x${shape.height}x${shape.width}, window ${shape.kernelH}x${shape.kernelW}, stride ${shape.strideH},${shape.strideW}, pad ${shape.padH},${shape.padW}`;
    t.same(Array.from(got.max, String), Array.from(f32(pool2dReference(x, shape, 'max')), String), `${name}: max exactly`);
    close(t, got.maxGrad, pool2dGradReference(dy, x, shape, 'max'), 1e-6, 1e-6, `${name}: max gradient (to the first largest)`);
    close(t, got.avg, pool2dReference(x, shape, 'avg'), 1e-6, 1e-6, `${name}: average`);
    close(t, got.avgGrad, pool2dGradReference(dy, x, shape, 'avg'), 1e-6, 1e-6, `${name}: average gradient`);
  });
  const s = { batch: 1, channels: 2, height: 5, width: 6, kernelH: 3, kernelW: 2, strideH: 2, strideW: 1, padH: 1, padW: 1 };
  const x = f64(random(60, 280));
  const oh = Math.floor((5 + 2 - 3) / 2) + 1;
  const ow = Math.floor((6 + 2 - 2) / 1) + 1;
  const w = f64(random(2 * oh * ow, 281));
  for (const mode of ['max', 'avg'] as const)
    fdCheck(t, pool2dGradReference(w, x, s, mode), finiteDifferences(x, w, (v) => pool2dReference(v, s, mode)), `${mode} pooling`);
});

t.test('bad arguments are typed errors that say what to pass, before anything runs', async (t) => {
  const code = (fn: () => void): string => {
    try {
      fn();
    } catch (error) {
      return error instanceof SapipeError ? `${error.code}: ${error.message}` : `not a SapipeError: ${String(error)}`;
    }
    return 'ran';
  };
  const [a, b, c] = [FlatBuffer.allocate(12), FlatBuffer.allocate(4), FlatBuffer.allocate(4)];
  t.match(code(() => gelu({ buffer: a }, { buffer: a }, 13)), /^ERR_SIZE_MISMATCH: nnGelu: y needs 13/, 'a view past its buffer');
  t.match(code(() => gelu({ buffer: a }, { buffer: a }, 1.5)), /^ERR_INVALID_ARGUMENT: gelu: count must be a non-negative integer/, 'a fractional count');
  t.match(code(() => add({ buffer: a }, { buffer: a }, { buffer: b }, 12)), /^ERR_SIZE_MISMATCH: nnAdd: b needs 12/, 'a short operand');
  const ln = { y: { buffer: a }, mean: { buffer: b }, rstd: { buffer: c } };
  t.match(code(() => layerNorm(ln, { buffer: a }, { buffer: b }, { buffer: c }, 3, 4, 0)), /^ERR_INVALID_ARGUMENT: layerNorm: eps must be a positive finite number/, 'eps 0');
  t.match(code(() => layerNorm(ln, { buffer: a }, { buffer: b }, { buffer: c }, 3, 0)), /^ERR_INVALID_ARGUMENT: layerNorm: cols must be at least 1/, 'no columns');
  t.match(code(() => layerNorm(null as never, { buffer: a }, { buffer: b }, { buffer: c }, 3, 4)), /^ERR_INVALID_ARGUMENT: layerNorm: out must be/, 'no outputs');
  t.match(code(() => embedding({ buffer: a }, { buffer: b }, { buffer: a }, { buffer: a }, { batch: 1, seq: 4, vocab: 0, dim: 3 })), /^ERR_INVALID_ARGUMENT: embedding: shape.vocab must be at least 1/, 'no vocabulary');
  t.match(code(() => embedding({ buffer: a }, { buffer: b }, { buffer: a }, { buffer: a }, { batch: 1, seq: 4, vocab: 2 } as never)), /^ERR_INVALID_ARGUMENT: embedding: shape.dim must be a non-negative integer/, 'a shape without dim');
  t.match(code(() => dropout({ buffer: a }, { buffer: a }, 12, { p: 1, seed: 1 })), /^ERR_INVALID_ARGUMENT: dropout: p must be in \[0, 1\)/, 'p = 1');
  t.match(code(() => dropout({ buffer: a }, { buffer: a }, 12, { p: 0.5, seed: -1 })), /^ERR_INVALID_ARGUMENT: dropout: seed must be a non-negative integer/, 'a negative seed');
  t.match(code(() => dropout({ buffer: a }, { buffer: new Float32Array(3) as never }, 3, { p: 0.5, seed: 1 })), /^ERR_INVALID_ARGUMENT: dropout: x.buffer must be a FlatBuffer or a DeviceBuffer/, 'not a tensor');
  const shape = { batch: 1, seq: 2, heads: 2, headDim: 3 };
  const att = { o: { buffer: a }, lse: { buffer: b } };
  t.match(code(() => attention(att, { buffer: c }, { buffer: c }, { buffer: c }, { ...shape, headDim: 257 })), /^ERR_INVALID_ARGUMENT: attention: shape.headDim must be in \[1, 256\]/, 'a head of 257');
  t.match(code(() => attention(att, { buffer: c }, { buffer: c }, { buffer: c }, shape, Number.NaN)), /^ERR_INVALID_ARGUMENT: attention: scale must be a finite number/, 'a NaN scale');
  t.match(code(() => attention(att, { buffer: a }, { buffer: a }, { buffer: a }, shape)), /^ERR_ALIASING: attention: out.o overlaps q/, 'o over q');
  t.match(code(() => attention(att, { buffer: c }, { buffer: c }, { buffer: c }, shape)), /^ERR_SIZE_MISMATCH: nnAttention: q needs 12/, 'q too short');
  t.match(
    code(() => attentionGrad({ dq: { buffer: a }, dk: { buffer: a }, dv: { buffer: a } }, { buffer: c }, { buffer: c }, { buffer: c }, { buffer: c }, att, shape)),
    /^ERR_ALIASING: attentionGrad: grads.dq overlaps/,
    'gradients over each other',
  );
  const conv = { batch: 1, inChannels: 1, height: 3, width: 4, outChannels: 1, kernelH: 2, kernelW: 2 };
  t.match(code(() => conv2d({ buffer: b }, { buffer: a }, { buffer: c }, undefined, { ...conv, kernelH: 5 })), /^ERR_INVALID_ARGUMENT: conv2d: the padded input \(3 x 4\) is smaller than the kernel \(5 x 2\)/, 'a kernel larger than the input');
  t.match(code(() => conv2d({ buffer: b }, { buffer: a }, { buffer: c }, undefined, { ...conv, strideW: 0 })), /^ERR_INVALID_ARGUMENT: conv2d: shape.strideW must be at least 1/, 'stride 0');
  t.match(code(() => conv2d({ buffer: a }, { buffer: a }, { buffer: c }, undefined, conv)), /^ERR_ALIASING: conv2d: y overlaps x/, 'y over x');
  t.match(code(() => conv2d({ buffer: b }, { buffer: a }, { buffer: c }, undefined, conv)), /^ERR_SIZE_MISMATCH: nnConv2d: y needs 6/, 'y too short for the output');
  const pool = { batch: 1, channels: 1, height: 3, width: 4, kernelH: 2, kernelW: 2 };
  t.match(code(() => pool2d({ buffer: b }, { buffer: a }, pool, 'min' as never)), /^ERR_INVALID_ARGUMENT: pool2d: mode must be "max" or "avg"/, 'an unknown mode');
  t.match(code(() => pool2d({ buffer: b }, { buffer: a }, { ...pool, padH: 2 }, 'max')), /^ERR_INVALID_ARGUMENT: pool2d: padding must be at most half the kernel/, 'padding over half the kernel');
  t.match(code(() => pool2d({ buffer: a }, { buffer: a }, pool, 'avg')), /^ERR_ALIASING: pool2d: y overlaps x/, 'y over x');
  for (const buffer of [a, b, c]) buffer.dispose();
});
