/**
 * End-to-end accuracy: 4 local workers (the local backend, worker threads) train the demo's MLP
 * on MNIST for 8 epochs in sync and in sapipe-wp with its default estimate, and each must reach a
 * stated test accuracy. Seeds 1 to 3 gave 92.9-94.8% for both modes (deterministic per seed); the floor
 * of 90% leaves about two points for platform differences while failing if staleness-1 training
 * or the all-reduce were broken. About 10 s on 2 cores.
 */
import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import t from 'tap';

const run = promisify(execFile);
const bin = fileURLToPath(new URL('../../bin/sapipe.js', import.meta.url));

const FLOOR = 0.9;

t.test('4 workers reach the stated test accuracy in sync and sapipe-wp', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'sapipe-demo-acc-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const { stdout } = await run(
    process.execPath,
    [bin, 'demo', '--workers', '4', '--epochs', '8', '--modes', 'sync,sapipe-wp', '--seed', '1', '--json', '--report', join(dir, 'r.html')],
    { maxBuffer: 1 << 22, timeout: 120_000 },
  );
  const result = JSON.parse(stdout) as { config: { workers: number }; modes: { mode: string; finalAccuracy: number; epochAccuracy: number[] }[] };
  t.equal(result.config.workers, 4);
  t.same(result.modes.map((m) => m.mode), ['sync', 'sapipe-wp']);
  for (const m of result.modes) {
    t.equal(m.epochAccuracy.length, 8, `${m.mode}: one accuracy per epoch`);
    t.ok(m.finalAccuracy >= FLOOR, `${m.mode}: test accuracy ${(m.finalAccuracy * 100).toFixed(2)}% >= ${FLOOR * 100}%`);
  }
});
