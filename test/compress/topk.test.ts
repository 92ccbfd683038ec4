/**
 * MSTopK (native/cpu/topk.cpp) against the plain-TypeScript references of test/reference/topk.ts:
 * exactly k elements, in ascending index order, with their values; recall against the exact top-k
 * of at least 0.95 at densities 0.001, 0.01 and 0.05 on Gaussian and heavy-tailed data (1M
 * elements); error feedback conserves every element bit for bit over 100 steps (what is sent plus
 * what stays in the residual is the gradient plus the previous residual, in fp32); the native
 * exact top-k equals the reference; scatter-add equals the reference, and bad input is refused
 * with nothing written.
 */
import t from 'tap';

import { FlatBuffer, mstopk, scatterAdd, topkExact } from '../../dist/index.js';
import { exactTopk, samples, scatterAddRef } from '../reference/topk.js';

function buffer(values: Float32Array): FlatBuffer {
  const b = FlatBuffer.allocate(values.length);
  b.array.set(values);
  return b;
}

const N = 1 << 20;
for (const kind of ['gaussian', 'heavy'] as const) {
  const data = samples(N, kind, kind === 'gaussian' ? 3 : 4);
  for (const density of [0.001, 0.01, 0.05]) {
    t.test(`${kind}, density ${density}: exactly k, ascending, recall >= 0.95 against the exact top-k`, (t) => {
      const grad = buffer(data);
      try {
        const k = Math.round(density * N);
        const sel = mstopk(grad, { density });
        t.equal(sel.indices.length, k, `exactly k = ${k}`);
        t.ok(sel.indices.every((v, i) => i === 0 || v > sel.indices[i - 1]!), 'indices ascending, no repeats');
        t.ok(sel.indices.every((v, i) => Object.is(sel.values[i], data[v])), 'each value is x at its index');
        const exact = new Set(exactTopk(data, k));
        const hits = Array.from(sel.indices).filter((i) => exact.has(i)).length;
        t.ok(hits / k >= 0.95, `recall ${(hits / k).toFixed(4)} (${sel.passes} passes, band ${sel.band})`);
        t.ok(grad.array.every((v, i) => Object.is(v, data[i])), 'without a residual the gradient is only read');
      } finally {
        grad.dispose();
      }
      t.end();
    });
  }
}

t.test('error feedback over 100 steps: sent + residual = gradient + previous residual, bit for bit', (t) => {
  const n = 50_000;
  const grad = FlatBuffer.allocate(n);
  const residual = FlatBuffer.allocate(n);
  residual.array.fill(0);
  let bad = 0;
  let sentTotal = 0;
  for (let step = 0; step < 100; step++) {
    grad.array.set(samples(n, step % 2 ? 'heavy' : 'gaussian', 100 + step));
    const before = Float32Array.from(residual.array);
    const sel = mstopk(grad, { density: 0.01, residual });
    const sent = new Map<number, number>();
    sel.indices.forEach((idx, i) => sent.set(idx, sel.values[i]!));
    sentTotal += sel.indices.length;
    for (let i = 0; i < n; i++) {
      const x = Math.fround(grad.array[i]! + before[i]!);
      const out = sent.has(i) ? sent.get(i)! + residual.array[i]! : residual.array[i]!;
      if (!Object.is(out, x) || (sent.has(i) && residual.array[i] !== 0)) bad++;
    }
  }
  t.equal(bad, 0, `every element of every step conserved (${sentTotal} sent in all)`);
  t.equal(sentTotal, 100 * 500, 'k per step');
  grad.dispose();
  residual.dispose();
  t.end();
});

t.test('the native exact top-k equals the reference; scatter-add equals the reference', (t) => {
  const data = samples(10_000, 'heavy', 9);
  data[17] = data[4000] = 1e6; // a tie: the lower index ranks first
  const x = buffer(data);
  for (const k of [0, 1, 2, 37, 10_000]) {
    const got = topkExact(x, k);
    t.same(Array.from(got.indices), exactTopk(data, k), `k = ${k}: the same indices`);
    t.same(Array.from(got.values), exactTopk(data, k).map((i) => data[i]!), `k = ${k}: and values`);
  }
  const out = FlatBuffer.allocate(10_000);
  out.array.fill(0.5);
  const want = Float32Array.from(out.array);
  const sel = mstopk(x, { k: 300 });
  scatterAdd(out, sel, 0.25);
  scatterAddRef(want, sel.indices, sel.values, 0.25);
  t.same(out.array, want, 'scatter-add');
  const selAll = mstopk(x, { k: 10_000 });
  t.equal(selAll.indices.length, 10_000, 'k = n takes everything');
  t.same(mstopk(x, { k: 0 }).indices.length, 0, 'k = 0 takes nothing');
  x.dispose();
  out.dispose();
  t.end();
});

t.test('bad input is refused with a typed error and nothing written', (t) => {
  const grad = buffer(samples(1000, 'gaussian', 5));
  const residual = FlatBuffer.allocate(1000);
  residual.array.fill(0.125);
  grad.array[10] = NaN;
  t.throws(() => mstopk(grad, { density: 0.1, residual }), { code: 'ERR_INVALID_ARGUMENT', message: /NaN\/Inf.*residual is unchanged/ });
  t.ok(residual.array.every((v) => v === 0.125), 'the residual is unchanged');
  grad.array[10] = 0;
  t.throws(() => mstopk(grad, {}), { code: 'ERR_INVALID_ARGUMENT', message: /density or k/ });
  t.throws(() => mstopk(grad, { k: 1001 }), { code: 'ERR_INVALID_ARGUMENT' });
  t.throws(() => mstopk(grad, { density: 0 }), { code: 'ERR_INVALID_ARGUMENT' });
  t.throws(() => mstopk(grad, { k: 5, residual: FlatBuffer.allocate(999) }), { code: 'ERR_SIZE_MISMATCH' });
  t.throws(() => mstopk(grad, { k: 5, residual: grad }), { code: 'ERR_ALIASING' });
  const out = FlatBuffer.allocate(10);
  out.array.fill(1);
  t.throws(() => scatterAdd(out, { indices: Int32Array.of(3, 10), values: Float32Array.of(1, 1) }), { code: 'ERR_INVALID_ARGUMENT', message: /outside \[0, 10\); nothing was added/ });
  t.ok(out.array.every((v) => v === 1), 'nothing was added');
  t.throws(() => scatterAdd(out, { indices: Int32Array.of(1), values: Float32Array.of(1, 2) }), { code: 'ERR_SIZE_MISMATCH' });
  t.throws(() => scatterAdd(out, { indices: [1] as never, values: Float32Array.of(1) }), { code: 'ERR_INVALID_ARGUMENT', message: /Int32Array/ });
  grad.dispose();
  residual.dispose();
  out.dispose();
  t.end();
});
