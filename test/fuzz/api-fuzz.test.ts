/**
 * The API fuzzer: random calls over every public entry (test/fixtures/fuzz/fuzz-batch.mjs), in
 * batches, each batch in a child process so that an abort or a fatal engine error is caught and
 * reported with the seed that reproduces it. Every throw must be a SapipeError with a documented
 * code, and no process may die.
 *
 * Seeds are fixed so CI is repeatable; SAPIPE_FUZZ_SEED=<n> starts from another seed (a nightly or
 * a bug hunt), SAPIPE_FUZZ_BATCHES and SAPIPE_FUZZ_CALLS change the amount. A failing batch prints
 * the command that replays it alone.
 */
import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import t from 'tap';

const fixture = fileURLToPath(new URL('../fixtures/fuzz/fuzz-batch.mjs', import.meta.url));
const firstSeed = Number(process.env.SAPIPE_FUZZ_SEED ?? 1000);
const batches = Number(process.env.SAPIPE_FUZZ_BATCHES ?? 10);
const callsPerBatch = Number(process.env.SAPIPE_FUZZ_CALLS ?? 2500);
const PARALLEL = 2;

interface BatchReport {
  seed: number;
  calls: number;
  ms: number;
  codes: Record<string, number>;
  untyped: { entry: string; callIndex: number; name?: string; message: string; stack: string }[];
  slow: { entry: string; callIndex: number; ms: number }[];
}

interface BatchRun {
  seed: number;
  exitCode: number | null;
  signal: string | null;
  stdout: string;
  stderr: string;
}

function runBatch(seed: number): Promise<BatchRun> {
  return new Promise((resolve) => {
    // A bounded heap: an entry that builds something huge from a user's number must refuse it, not
    // take the machine's memory; past 1 GiB of heap the child dies and the batch fails.
    // In a directory of its own: entries that write files (checkpoints) get random paths.
    const cwd = mkdtempSync(join(tmpdir(), 'sapipe-fuzz-'));
    execFile(process.execPath, ['--max-old-space-size=1024', fixture, String(seed), String(callsPerBatch)], { timeout: 120_000, maxBuffer: 1 << 24, cwd }, (error, stdout, stderr) => {
      rmSync(cwd, { recursive: true, force: true });
      const e = error as (Error & { code?: number | string; signal?: string | null }) | null;
      resolve({ seed, exitCode: e ? (typeof e.code === 'number' ? e.code : null) : 0, signal: e?.signal ?? null, stdout, stderr });
    });
  });
}

t.test(`${batches} batches of ${callsPerBatch} random calls over the public API`, async (t) => {
  const started = Date.now();
  const seeds = Array.from({ length: batches }, (_, i) => firstSeed + i);
  const runs: BatchRun[] = [];
  for (let i = 0; i < seeds.length; i += PARALLEL) runs.push(...(await Promise.all(seeds.slice(i, i + PARALLEL).map(runBatch))));
  let calls = 0;
  const codes: Record<string, number> = {};
  for (const run of runs) {
    const replay = `npm run build && node ${fixture} ${run.seed} ${callsPerBatch}`;
    const ok = run.exitCode === 0 && run.signal === null;
    t.ok(ok, `batch ${run.seed}: the process lived (exit ${run.exitCode}, signal ${run.signal}); replay: ${replay}${ok ? '' : `\n${run.stderr.slice(-2000)}`}`);
    if (!ok) continue;
    const report = JSON.parse(run.stdout.trim().split('\n').pop()!) as BatchReport;
    calls += report.calls;
    for (const [code, n] of Object.entries(report.codes)) codes[code] = (codes[code] ?? 0) + n;
    t.same(report.untyped, [], `batch ${run.seed}: every throw is a SapipeError with a documented code; replay: ${replay}`);
  }
  t.ok(calls >= 20_000 || batches * callsPerBatch < 20_000, `at least 20 000 calls (${calls})`);
  t.comment(`${calls} calls in ${((Date.now() - started) / 1000).toFixed(1)} s; throws by code: ${JSON.stringify(codes)}`);
});
