/**
 * Terminating worker threads that have native work in flight must leave the process running.
 * Each variant runs test/fixtures/native/terminate-stress.mjs in a child process (a crash is then
 * an exit signal, not the end of tap), which starts and terminates workers 40 times.
 *
 * It used to crash about one run in three with SIGSEGV: the addon was unloaded (dlclose) when the
 * last worker that loaded it ended, under threads of the addon still running (the global thread
 * pool's workers); and a queue's worker thread could call the environment's thread-safe function
 * after the environment had deleted it. The `comm` variant then still crashed about one run in
 * six (heap-use-after-free under AddressSanitizer): a local rank woken from a collective's arrival
 * barrier could start reading its peers' buffers after a peer that failed the departure barrier
 * had found nobody working and released them; ranks now count as working from their arrival.
 */
import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import t from 'tap';

const script = fileURLToPath(new URL('../fixtures/native/terminate-stress.mjs', import.meta.url));
const ROUNDS = 40;

function runStress(variant: string): Promise<{ code: number | null; signal: string | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(process.execPath, [script, variant, String(ROUNDS)], { timeout: 240_000 }, (error, stdout, stderr) => {
      const e = error as (Error & { code?: number | string; signal?: string | null }) | null;
      resolve({
        code: e ? (typeof e.code === 'number' ? e.code : null) : 0,
        signal: e?.signal ?? null,
        stdout,
        stderr,
      });
    });
  });
}

const VARIANTS: [string, string][] = [
  ['update', 'queued optimizer updates on two queues'],
  ['kernels', 'synchronous thread-pool kernels with updates queued'],
  ['comm', 'a two-rank local group in one worker: allreduce, send and recv queued'],
  ['comm-split', 'a two-rank local group across two workers, terminated one after the other'],
  ['main-loaded', 'queued updates while the main thread has loaded the addon too'],
];

for (const [variant, what] of VARIANTS) {
  t.test(`terminating workers mid-operation (${what}) leaves the process running`, async (t) => {
    const r = await runStress(variant);
    t.equal(r.signal, null, `no signal (stderr: ${r.stderr.slice(-2000)})`);
    t.equal(r.code, 0, `exit code 0 (stderr: ${r.stderr.slice(-2000)})`);
    t.match(r.stdout, `ok ${ROUNDS}`, `all ${ROUNDS} rounds ran`);
  });
}
