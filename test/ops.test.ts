/**
 * Elastic averaging and the reductions against plain TypeScript, on sizes with vector tails and
 * sizes split across threads. Tolerance: 1e-6 relative + 1e-7 absolute (sums of k inputs round
 * differently when the kernel folds the scale into the last addition).
 */
import t from 'tap';

import { FlatBuffer, axpy, clipByNorm, countNonFinite, elasticAverage, scale, squaredNorm, sum } from '../dist/index.js';
import { referenceElasticAverage } from './reference/optimizer.js';
import { fillNormal, rng, worstError } from './helpers/random.js';

const SIZES = [1, 7, 1023, (1 << 16) + 5];

function buffer(n: number, next: () => number): FlatBuffer {
  return FlatBuffer.from(fillNormal(new Float32Array(n), next));
}

t.test('elastic averaging over 100 rounds matches the reference; x + c is conserved', async (t) => {
  for (const n of SIZES) {
    const next = rng(n);
    const x = buffer(n, next);
    const c = buffer(n, next);
    const rx = x.array.slice();
    const rc = c.array.slice();
    for (let round = 0; round < 100; round++) {
      // the worker drifts between exchanges, as a worker's training does
      for (let i = 0; i < n; i++) x.array[i] = x.array[i]! + 0.01 * (next() - 0.5);
      rx.set(x.array);
      elasticAverage(x, c, 0.9 / 4);
      referenceElasticAverage(rx, rc, 0.9 / 4);
    }
    t.ok(worstError(x.array, rx, 1e-7, 1e-6).ratio <= 1, `worker, n=${n}`);
    t.ok(worstError(c.array, rc, 1e-7, 1e-6).ratio <= 1, `center, n=${n}`);
  }
  const x = FlatBuffer.from([1, 2]);
  const c = FlatBuffer.from([3, 2]);
  elasticAverage(x, c, 0.25); // d = 0.25*(1 - 3) = -0.5
  t.same([...x.array, ...c.array], [1.5, 2, 2.5, 2]);
});

t.test('sum and average of k buffers, in place or not, with the non-finite count', async (t) => {
  for (const n of SIZES) {
    for (const k of [1, 2, 3, 4]) {
      const next = rng(n * 10 + k);
      const inputs = Array.from({ length: k }, () => buffer(n, next));
      const expected = new Float32Array(n);
      for (let i = 0; i < n; i++) expected[i] = inputs.reduce((s, b) => s + b.array[i]!, 0) / k;
      const out = FlatBuffer.allocate(n);
      t.equal(sum(out, inputs, { average: true }).nonFiniteCount, 0);
      t.ok(worstError(out.array, expected, 1e-7, 1e-6).ratio <= 1, `average of ${k}, n=${n}`);
      sum(inputs[0]!, inputs, { scale: 2 });
      for (let i = 0; i < n; i++) expected[i] = expected[i]! * k * 2;
      t.ok(worstError(inputs[0]!.array, expected, 1e-6, 1e-6).ratio <= 1, `in-place scaled sum of ${k}, n=${n}`);
    }
  }
  const a = FlatBuffer.from([1, NaN, 3, Infinity]);
  const b = FlatBuffer.from([1, 1, 1, 1]);
  const out = FlatBuffer.allocate(4);
  t.equal(sum(out, [a, b]).nonFiniteCount, 2);
});

t.test('scale, axpy, squared norm, count, clip', async (t) => {
  for (const n of SIZES) {
    const next = rng(n + 99);
    const x = buffer(n, next);
    const y = buffer(n, next);
    const ex = x.array.slice();
    const ey = y.array.slice();
    axpy(y, -0.5, x);
    for (let i = 0; i < n; i++) ey[i] = ey[i]! - 0.5 * ex[i]!;
    t.ok(worstError(y.array, ey, 1e-7, 1e-6).ratio <= 1, `axpy n=${n}`);
    scale(x, 3);
    for (let i = 0; i < n; i++) ex[i] = ex[i]! * 3;
    t.ok(worstError(x.array, ex, 0, 1e-7).ratio <= 1, `scale n=${n}`);
    let sq = 0;
    for (let i = 0; i < n; i++) sq += ex[i]! * ex[i]!;
    t.ok(Math.abs(squaredNorm(x) - sq) <= 1e-6 * sq, `squared norm n=${n}`);
    t.equal(countNonFinite(x), 0);
    x.array[n - 1] = NaN;
    t.equal(countNonFinite(x), 1, `count finds the last element, n=${n}`);
  }
  const g = FlatBuffer.from([3, 4]);
  t.equal(clipByNorm(g, 1), 5);
  t.ok(Math.abs(g.array[0]! - 0.6) < 1e-7 && Math.abs(g.array[1]! - 0.8) < 1e-7);
  t.ok(Math.abs(clipByNorm(g, 10) - 1) < 1e-6, 'below the limit: the norm is reported');
  t.ok(Math.abs(g.array[0]! - 0.6) < 1e-7, 'and nothing is scaled');
});
