/**
 * The native SGEMM against a double-precision triple loop (test/nn/gemm-reference.ts states the
 * tolerance), at every SIMD level this CPU supports (one child process per level: the level is
 * chosen once per process), and its argument checks.
 */
import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import t from 'tap';

import { sgemm } from '../../dist/nn/gemm.js';
import { nativeAddon } from '../../dist/native.js';
import { FlatBuffer } from '../../dist/tensor.js';

const run = promisify(execFile);
const fixture = fileURLToPath(new URL('./fixtures/gemm-levels.ts', import.meta.url));
const order = ['baseline', 'avx2', 'avx512'] as const;
const supported = nativeAddon().info().simdSupported;
const loader = process.execArgv.filter((a) => a.includes('typescript'));

for (const level of order.slice(0, order.indexOf(supported) + 1)) {
  t.test(`SAPIPE_SIMD=${level}: odd sizes, every transpose, alpha/beta, threaded shapes`, async (t) => {
    const { stdout } = await run(process.execPath, [...loader, fixture], {
      env: { ...process.env, SAPIPE_SIMD: level, SAPIPE_NUM_THREADS: '2' },
      maxBuffer: 1 << 20,
    });
    const result = JSON.parse(stdout) as { simd: string; worst: number | string; where: string };
    t.equal(result.simd, level, 'the forced level is the one in use');
    t.ok(typeof result.worst === 'number' && result.worst <= 1, `worst error ratio ${String(result.worst)} at ${result.where}`);
  });
}

t.test('a hand-computed product with both transposes', (t) => {
  // op(A) = [[1, 2], [3, 4]] stored transposed, op(B) = [[5, 6], [7, 8]] stored transposed.
  const a = FlatBuffer.from([1, 3, 2, 4]);
  const b = FlatBuffer.from([5, 7, 6, 8]);
  const c = FlatBuffer.from([1, 1, 1, 1]);
  sgemm({ transA: true, transB: true, m: 2, n: 2, k: 2, alpha: 2, beta: 10, a, b, c });
  t.same([...c.array], [2 * 19 + 10, 2 * 22 + 10, 2 * 43 + 10, 2 * 50 + 10]);
  sgemm({ m: 2, n: 2, k: 0, beta: 0.5, a, b, c });
  t.same([...c.array], [24, 27, 48, 55], 'k = 0 scales C by beta');
  t.end();
});

t.test('argument checks', (t) => {
  const a = FlatBuffer.allocate(12);
  const b = FlatBuffer.allocate(12);
  const c = FlatBuffer.allocate(9);
  t.throws(() => sgemm({ m: 3, n: 3, k: 5, a, b, c }), { code: 'ERR_SIZE_MISMATCH' }, 'A too short for m x k');
  t.throws(() => sgemm({ m: 3, n: 3, k: 4, a, b, c, cOffset: 1 }), { code: 'ERR_SIZE_MISMATCH' }, 'C too short from its offset');
  t.throws(() => sgemm({ m: 3, n: 3, k: 4, a, b, c, alpha: Number.NaN }), { code: 'ERR_INVALID_ARGUMENT' });
  t.throws(() => sgemm({ m: -1, n: 3, k: 4, a, b, c }), { code: 'ERR_INVALID_ARGUMENT' });
  t.throws(() => sgemm({ m: 1.5, n: 3, k: 4, a, b, c }), { code: 'ERR_INVALID_ARGUMENT' });
  t.throws(() => sgemm({ m: 3, n: 3, k: 4, a, b, c, aOffset: -2 }), { code: 'ERR_INVALID_ARGUMENT' });
  t.throws(() => sgemm({ m: 3, n: 3, k: 4, a: new Float32Array(12) as unknown as FlatBuffer, b, c }), { code: 'ERR_INVALID_ARGUMENT' });
  const shared = FlatBuffer.allocate(30);
  t.throws(() => sgemm({ m: 2, n: 2, k: 2, a: shared, b, c: shared, cOffset: 2 }), { code: 'ERR_ALIASING' }, 'C overlapping A');
  sgemm({ m: 2, n: 2, k: 2, a: shared, b, c: shared, cOffset: 4 });
  // The native binding checks extents on its own too.
  t.throws(() => nativeAddon().sgemm({ m: 3, n: 3, k: 5, a: a.handle, b: b.handle, c: c.handle }), { code: 'ERR_SIZE_MISMATCH' });
  t.throws(() => nativeAddon().sgemm({ m: 2, n: 2, k: 2, a: shared.handle, b: b.handle, c: shared.handle, cOffset: 1 }), {
    code: 'ERR_ALIASING',
  });
  a.dispose();
  t.throws(() => sgemm({ m: 3, n: 3, k: 4, a, b, c }), { code: 'ERR_DISPOSED' });
  t.throws(() => nativeAddon().sgemm({ m: 3, n: 3, k: 4, a: a.handle, b: b.handle, c: c.handle }), { code: 'ERR_DISPOSED' });
  t.end();
});
