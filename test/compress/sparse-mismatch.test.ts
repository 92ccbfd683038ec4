/**
 * Ranks that disagree on the gradient's length get SizeMismatchError on every rank, before any
 * gradient is written, as the dense all-reduce does: 1000 elements on one rank and 1001 on the
 * other (the same k: the exchange itself cannot tell), and 1000 against 2000 (k differ: the
 * exchange's sizes differ). The gradients stay bit for bit; each residual holds what it held up to
 * the rounding of one add and one subtract (relative 1e-6 of the gradient's scale).
 */
import t from 'tap';

import { FlatBuffer, LocalCommunicator, sparseAllreduce } from '../../dist/index.js';

function values(n: number, seed: number): Float32Array {
  let s = seed >>> 0;
  return Float32Array.from({ length: n }, () => ((s = (Math.imul(s, 1664525) + 1013904223) >>> 0) / 2 ** 32) * 2 - 1);
}

for (const [la, lb] of [
  [1000, 1001],
  [1000, 2000],
] as const) {
  t.test(`lengths ${la} and ${lb}: SizeMismatchError on both ranks, nothing written`, async (t) => {
    const group = `sparse-mismatch-${la}-${lb}-${process.pid}`;
    const comms = await Promise.all([0, 1].map((rank) => LocalCommunicator.create({ group, rank, size: 2, timeoutMs: 10_000 })));
    const grads = [FlatBuffer.from(values(la, 1)), FlatBuffer.from(values(lb, 2))];
    // A large value at the extra index: before, the rank with the shorter gradient threw while
    // writing it, after zeroing its gradient, and the other rank succeeded.
    grads[1]!.array[lb - 1] = 50;
    const residuals = [FlatBuffer.from(values(la, 3)), FlatBuffer.from(values(lb, 4))];
    const gradsBefore = grads.map((g) => Float32Array.from(g.array));
    const residualsBefore = residuals.map((r) => Float32Array.from(r.array));
    const results = await Promise.allSettled(comms.map((c, r) => sparseAllreduce(c, grads[r]!, { density: 0.01, residual: residuals[r]! })));
    for (let r = 0; r < 2; r++) {
      const result = results[r]!;
      t.equal(result.status, 'rejected', `rank ${r} fails`);
      if (result.status === 'rejected') t.equal((result.reason as { code?: string }).code, 'ERR_SIZE_MISMATCH', `rank ${r}: ${String(result.reason)}`);
      t.same([...grads[r]!.array], [...gradsBefore[r]!], `rank ${r}: the gradient is untouched`);
      let worst = 0;
      residuals[r]!.array.forEach((v, i) => (worst = Math.max(worst, Math.abs(v - residualsBefore[r]![i]!))));
      t.ok(worst <= 1e-6 * 50, `rank ${r}: the residual holds what it held (max diff ${worst})`);
    }
    await Promise.all(comms.map((c) => c.destroy()));
  });
}

t.test('agreeing ranks after a mismatch go on as before', async (t) => {
  const group = `sparse-after-${process.pid}`;
  const comms = await Promise.all([0, 1].map((rank) => LocalCommunicator.create({ group, rank, size: 2, timeoutMs: 10_000 })));
  const grads = [FlatBuffer.from(values(64, 5)), FlatBuffer.from(values(64, 6))];
  const expected = new Float32Array(64);
  const results = await Promise.all(comms.map((c, r) => sparseAllreduce(c, grads[r]!, { density: 1 })));
  for (let i = 0; i < 64; i++) expected[i] = Math.fround((values(64, 5)[i]! + values(64, 6)[i]!) / 2);
  t.same(results.map((r) => r.k), [64, 64]);
  let worst = 0;
  grads[0]!.array.forEach((v, i) => (worst = Math.max(worst, Math.abs(v - expected[i]!))));
  t.ok(worst < 1e-6, `density 1 is the mean (max diff ${worst})`);
  await Promise.all(comms.map((c) => c.destroy()));
});
