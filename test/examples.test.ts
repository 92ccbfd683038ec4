/** The README's example runs as written and trains (the loss falls to the noise level). */
import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import t from 'tap';

const run = promisify(execFile);

t.test('examples/linear-regression.mjs converges', async (t) => {
  const script = fileURLToPath(new URL('../examples/linear-regression.mjs', import.meta.url));
  const { stdout } = await run(process.execPath, [script]);
  const losses = [...stdout.matchAll(/loss ([\d.e+-]+)/g)].map((m) => Number(m[1]));
  t.ok(losses.length >= 3);
  t.ok(losses[0]! > 0.1, `starts high: ${losses[0]}`);
  t.ok(losses.at(-1)! < 1e-4, `ends at the noise level: ${losses.at(-1)}`);
});
