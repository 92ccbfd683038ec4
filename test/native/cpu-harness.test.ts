/**
 * The C++ harness that runs without Node or a GPU (native/tests/cpu_check.cpp): every CPU kernel
 * against a scalar reference written from ALGORITHMS.md, at every SIMD level this CPU has, and
 * the plugin and NCCL loaders' failure paths against the fake libraries. Built by
 * `npm run build:native`.
 */
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import t from 'tap';

const run = promisify(execFile);
const binary = fileURLToPath(new URL('../../build/Release/sapipe_cpu_check', import.meta.url));

t.test('the harness is built', async (t) => {
  t.ok(existsSync(binary), `${binary} exists (npm run build:native builds it)`);
});

for (const simd of ['baseline', 'avx2', 'avx512'])
  t.test(`CPU kernels against the scalar reference, SAPIPE_SIMD=${simd}`, { skip: !existsSync(binary) }, async (t) => {
    const { stdout } = await run(binary, [], { env: { ...process.env, SAPIPE_SIMD: simd }, maxBuffer: 1 << 24 });
    const summary = /sapipe_cpu_check: (\d+) passed, (\d+) failed/.exec(stdout);
    t.ok(summary, 'prints a summary');
    t.equal(summary?.[2], '0', `no failed checks\n${stdout.slice(0, 4000)}`);
    t.ok(Number(summary?.[1]) > 3000, 'every variant, size and step was checked');
  });

t.test('the harness fails when a check fails', { skip: !existsSync(binary) }, async (t) => {
  // Pointing it at a folder without the fake libraries makes the loader checks fail: the exit
  // status must say so (a harness that always passes would prove nothing).
  const failed = await run(binary, ['--fakes', '/nonexistent'], { maxBuffer: 1 << 24 }).then(
    () => undefined,
    (error: { code?: number; stdout?: string }) => error,
  );
  t.equal(failed?.code, 1);
  t.match(failed?.stdout, /not ok - a plugin without its entry point names the symbol/);
});
