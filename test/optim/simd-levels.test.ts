/**
 * One binary carries baseline, AVX2 and AVX-512 kernels and picks one at run time. SAPIPE_SIMD
 * forces a lower level, so every level this CPU supports is checked against the reference here,
 * each in its own process (the level is chosen once per process).
 */
import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import t from 'tap';

import { nativeAddon } from '../../dist/native.js';

const run = promisify(execFile);
const fixture = fileURLToPath(new URL('../fixtures/simd/run-variants.ts', import.meta.url));
const order = ['baseline', 'avx2', 'avx512'] as const;
const supported = nativeAddon().info().simdSupported;
// The TypeScript loader tap runs this file with, so the child can run a .ts fixture too.
const loader = process.execArgv.filter((a) => a.includes('typescript'));

for (const level of order.slice(0, order.indexOf(supported) + 1)) {
  t.test(`SAPIPE_SIMD=${level}`, async (t) => {
    const { stdout } = await run(process.execPath, [...loader, fixture], {
      env: { ...process.env, SAPIPE_SIMD: level, SAPIPE_NUM_THREADS: '2' },
      maxBuffer: 1 << 20,
    });
    const result = JSON.parse(stdout) as { simd: string; worst: Record<string, number> };
    t.equal(result.simd, level, 'the forced level is the one in use');
    for (const [name, worst] of Object.entries(result.worst)) t.ok(worst <= 1, `${name}: worst error ratio ${worst.toFixed(3)}`);
  });
}

t.test('an unsupported or unknown level never raises the level', async (t) => {
  const { stdout } = await run(
    process.execPath,
    ['-e', "console.log(require('node-gyp-build')(process.argv[1]).info().simd)", fileURLToPath(new URL('../..', import.meta.url))],
    { env: { ...process.env, SAPIPE_SIMD: 'sse9000' } },
  );
  t.equal(stdout.trim(), supported);
});
