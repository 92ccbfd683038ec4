/**
 * The CPU table of model operations (native/cpu/nn_ops.cpp through lib/nn/ops.ts) against the
 * plain double-precision reference (test/reference/nn-ops.ts), at odd sizes and offsets; and the
 * checks every operation makes before running.
 */
import t from 'tap';

import { SapipeError } from '../../dist/errors.js';
import { biasAdd, modelDevice, relu, softmaxXent } from '../../dist/nn/ops.js';
import { FlatBuffer } from '../../dist/tensor.js';
import { gemmCases, labelsFor, random, reluInput, runOps, softmaxCases } from '../helpers/model-ops.js';
import { worstError } from '../helpers/random.js';
import {
  biasAddReference,
  biasGradReference,
  gemmReference,
  reluGradReference,
  reluReference,
  softmaxXentReference,
} from '../reference/nn-ops.js';

const f32 = (x: Float64Array): Float32Array => Float32Array.from(x);
const out = runOps('cpu');

t.test('gemm: every transpose, beta 0 and not, odd sizes, against the reference (1e-5 relative)', async (t) => {
  gemmCases.forEach((g, i) => {
    const ref = gemmReference(g, random(g.m * g.k, 10 + i), random(g.k * g.n, 20 + i), random(g.m * g.n, 30 + i));
    const e = worstError(out.gemm[i]!, f32(ref), 1e-5, 1e-5);
    t.ok(e.ratio <= 1, `${JSON.stringify(g)}: worst ${e.ratio.toFixed(3)} of tolerance`);
  });
});

t.test('bias add and bias gradient (overwritten, accumulated) equal the reference', async (t) => {
  const [rows, cols] = [33, 19];
  t.ok(worstError(out.biasAdd, f32(biasAddReference(random(rows * cols, 40), random(cols, 41), rows, cols)), 1e-6, 1e-6).ratio <= 1, 'bias add');
  const dy = random(rows * cols, 42);
  t.ok(worstError(out.biasGrad, f32(biasGradReference(random(cols, 43), dy, rows, cols, false)), 1e-5, 1e-5).ratio <= 1, 'bias gradient');
  t.ok(worstError(out.biasGradAccumulated, f32(biasGradReference(random(cols, 43), dy, rows, cols, true)), 1e-5, 1e-5).ratio <= 1, 'accumulated');
});

t.test('relu and its gradient: exact, NaN becomes 0, in place', async (t) => {
  const ref = reluReference(reluInput(1001, 44));
  t.same(Array.from(out.relu), Array.from(ref), 'relu equals the reference exactly (NaN -> 0, -0 -> 0, inf kept)');
  t.same(Array.from(out.reluInPlace), Array.from(ref), 'in place too');
  t.same(Array.from(out.reluGrad), Array.from(f32(reluGradReference(ref, random(1001, 45)))), 'the gradient is masked where the output was 0');
});

t.test('softmax cross-entropy: losses, gradient (also over the logits), hits; a label that is no class gives NaN and a zero row', async (t) => {
  softmaxCases.forEach(({ rows, classes }, i) => {
    const ref = softmaxXentReference(random(rows * classes, 50 + i, 4), labelsFor(rows, classes, 60 + i), rows, classes, 1 / rows);
    const got = out.softmax[i]!;
    const valid = (a: ArrayLike<number>) => Array.from(a).filter((_, r) => r !== 2);
    t.ok(worstError(Float32Array.from(valid(got.losses)), Float32Array.from(valid(ref.losses)), 1e-6, 1e-6).ratio <= 1, `${rows}x${classes}: losses`);
    t.ok(Number.isNaN(got.losses[2]!), `${rows}x${classes}: the bad label's loss is NaN`);
    t.ok(worstError(got.dlogits, f32(ref.dlogits), 1e-7, 1e-6).ratio <= 1, `${rows}x${classes}: gradient`);
    t.same(Array.from(got.inPlace), Array.from(got.dlogits), `${rows}x${classes}: written over the logits, the same gradient`);
    t.same(Array.from(got.correct), Array.from(ref.correct), `${rows}x${classes}: hits`);
    t.ok(got.dlogits.subarray(2 * classes, 3 * classes).every((v) => v === 0), `${rows}x${classes}: the bad label's gradient row is zero`);
  });
});

t.test('bad operands are typed errors before anything runs', async (t) => {
  const code = (fn: () => void): string | undefined => {
    try {
      fn();
    } catch (error) {
      return error instanceof SapipeError ? error.code : `not a SapipeError: ${String(error)}`;
    }
    return undefined;
  };
  const y = FlatBuffer.allocate(12);
  const b = FlatBuffer.allocate(4);
  t.equal(code(() => biasAdd({ buffer: y }, { buffer: b }, 4, 4)), 'ERR_SIZE_MISMATCH', 'a view past its buffer');
  t.equal(code(() => biasAdd({ buffer: y, offset: -1 }, { buffer: b }, 3, 4)), 'ERR_INVALID_ARGUMENT', 'a negative offset');
  t.equal(code(() => relu({ buffer: y }, { buffer: new Float32Array(4) as unknown as FlatBuffer }, 4)), 'ERR_INVALID_ARGUMENT', 'not a tensor');
  t.equal(code(() => softmaxXent({ buffer: y }, { buffer: b }, 2, 6, 0.5, null as never)), 'ERR_INVALID_ARGUMENT', 'no outputs');
  b.dispose();
  t.equal(code(() => biasAdd({ buffer: y }, { buffer: b }, 3, 4)), 'ERR_DISPOSED', 'a disposed operand');
  t.equal(code(() => modelDevice('gpu:0')), 'ERR_INVALID_ARGUMENT', 'an unknown device');
  y.dispose();
});
