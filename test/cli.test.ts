/**
 * The CLI as a user runs it: a real `node bin/sapipe.js` process (dist/ is built by `npm test`).
 */
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import t from 'tap';

const run = promisify(execFile);
const bin = fileURLToPath(new URL('../bin/sapipe.js', import.meta.url));
const sapipe = (...args: string[]) => run(process.execPath, [bin, ...args], { maxBuffer: 1 << 22 });

t.test('info --json reports the version, SIMD level, threads and backends', async (t) => {
  const { stdout } = await sapipe('info', '--json');
  const info = JSON.parse(stdout) as { version: string; simd: string; threads: number; backends: { name: string; available: boolean; reason?: string }[] };
  t.match(info.version, /^\d+\.\d+\.\d+/);
  t.ok(['baseline', 'avx2', 'avx512'].includes(info.simd));
  t.ok(info.threads >= 1);
  t.equal(info.backends.find((b) => b.name === 'cpu')?.available, true);
  for (const b of info.backends) if (!b.available) t.ok(b.reason, `${b.name} says why it is unavailable`);
});

t.test('bench kernels --json: every variant with bytes, time, bandwidth and triad ratios', async (t) => {
  const { stdout } = await sapipe('bench', 'kernels', '--size', '4K', '--reps', '2', '--warmup', '1', '--filter', 'adamw', '--json');
  const result = JSON.parse(stdout) as {
    elements: number;
    triad: { gbps: number };
    rows: { name: string; bytesPerElement: number; medianMs: number; gbps: number; ratioToTriad: number; guardedRatioToTriad: number }[];
  };
  t.equal(result.elements, 4096);
  t.ok(result.triad.gbps > 0);
  t.ok(result.rows.length >= 3);
  for (const r of result.rows) {
    t.ok(r.name.includes('adamw'));
    t.ok(r.bytesPerElement >= 28);
    t.ok(r.medianMs > 0 && r.gbps > 0 && r.ratioToTriad > 0 && r.guardedRatioToTriad > 0, r.name);
  }
});

t.test('bench kernels prints a table; --threads is honoured', async (t) => {
  const { stdout } = await sapipe('bench', 'kernels', '--size', '1K', '--reps', '1', '--warmup', '1', '--filter', 'sgd-nesterov', '--threads', '1');
  t.match(stdout, /1 thread\(s\)/);
  t.match(stdout, /sgd-nesterov/);
  t.match(stdout, /lowest ratio to triad/);
});

t.test('bench step-overhead --json', async (t) => {
  const { stdout } = await sapipe('bench', 'step-overhead', '--size', '64K', '--reps', '5', '--json');
  const r = JSON.parse(stdout) as { syncMs: number; asyncMs: number; overhead: number };
  t.ok(r.syncMs > 0 && r.asyncMs > 0 && Number.isFinite(r.overhead));
});

t.test('bench checkpoint --json: the snapshot against a copy, the save against the disk, and the files are removed', async (t) => {
  const { stdout } = await sapipe('bench', 'checkpoint', '--size', '64K', '--reps', '2', '--json');
  const r = JSON.parse(stdout) as { snapshotBytes: number; snapshotRatio: number; saveRatio: number; fileBytes: number; dir: string };
  t.equal(r.snapshotBytes, 2 * 4 * 65536, 'weights and momentum');
  t.ok(Number.isFinite(r.snapshotRatio) && r.snapshotRatio > 0 && Number.isFinite(r.saveRatio) && r.saveRatio > 0);
  t.ok(r.fileBytes > r.snapshotBytes, 'the file holds both and a header');
  t.notOk(existsSync(r.dir), 'its temporary directory is gone');
});

t.test('bench topk --json: MSTopK beside the exact top-k, with its recall', async (t) => {
  const { stdout } = await sapipe('bench', 'topk', '--size', '64K', '--densities', '0.01', '--reps', '1', '--json');
  const r = JSON.parse(stdout) as { rows: { k: number; speedup: number; recall: number; ofCopy: number }[] };
  t.equal(r.rows.length, 1);
  t.equal(r.rows[0]!.k, Math.round(0.01 * 65536));
  t.ok(r.rows[0]!.recall >= 0.95 && r.rows[0]!.speedup > 0 && r.rows[0]!.ofCopy > 0);
});

t.test('bad arguments exit non-zero with a message that says what is expected', async (t) => {
  const failure = async (...args: string[]): Promise<{ code?: number; stderr?: string }> => {
    try {
      await sapipe(...args);
    } catch (error) {
      return error as { code?: number; stderr?: string };
    }
    throw new Error(`sapipe ${args.join(' ')} succeeded`);
  };
  const badSize = await failure('bench', 'kernels', '--size', 'lots');
  t.not(badSize.code, 0);
  t.match(badSize.stderr, /expected a count like/);
  const unknown = await failure('frobnicate');
  t.not(unknown.code, 0);
  t.match(unknown.stderr, /unknown command/);
  const { stdout } = await sapipe('bench', 'kernels', '--help');
  t.match(stdout, /--size/);
});
