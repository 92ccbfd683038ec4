/**
 * Resume is exact: 2 data-parallel ranks train N = 7 steps, save a checkpoint and are SIGKILLed
 * (the process, right after the save is on disk); a new process loads it and trains M = 6 more
 * steps; the weights, the weights the next forward reads and the weights after flush() equal those
 * of N + M uninterrupted steps bit for bit, in every data-parallel mode (the staleness-1 ones with
 * their gradient or update in flight at the save), with SGD-momentum, Adam and AdamW, delay
 * compensation and each weight-prediction estimate, overlapped update on and off.
 */
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import t from 'tap';

const FIXTURE = fileURLToPath(new URL('../fixtures/checkpoint/train.mjs', import.meta.url));
const N = 7;
const M = 6;

interface Result {
  code: number | null;
  signal: NodeJS.Signals | null;
  result?: { weights: number[][]; forward: number[][]; flushed: number[][] };
  stderr: string;
}

function run(job: Record<string, unknown>): Promise<Result> {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [FIXTURE, JSON.stringify(job)], { env: { ...process.env, NODE_OPTIONS: '' }, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    child.stdout.on('data', (c: Buffer) => (out += c.toString()));
    child.stderr.on('data', (c: Buffer) => (err += c.toString()));
    child.on('close', (code, signal) => {
      const line = out.split('\n').find((l) => l.startsWith('RESULT '));
      resolve({ code, signal, ...(line ? { result: JSON.parse(line.slice('RESULT '.length)) } : {}), stderr: err });
    });
  });
}

const sgdm = { kind: 'sgd', lr: 0.05, momentum: 0.9 };
const cases: [string, Record<string, unknown>][] = [
  ['sync, SGD-momentum', { mode: 'sync', optimizer: sgdm }],
  ['sync, AdamW', { mode: 'sync', optimizer: { kind: 'adamw', lr: 0.01, weightDecay: 0.01 } }],
  ['pipe-sgd, SGD-momentum (update overlapped)', { mode: 'pipe-sgd', optimizer: sgdm }],
  ['pipe-sgd, Adam, overlapUpdate off', { mode: 'pipe-sgd', optimizer: { kind: 'adam', lr: 0.01 }, overlapUpdate: false }],
  ['sapipe-dc (adaptive)', { mode: 'sapipe-dc', optimizer: sgdm }],
  ['sapipe-dc (elementwise), overlapUpdate off', { mode: 'sapipe-dc', optimizer: sgdm, compensation: { kind: 'elementwise', lambda: 0.5 }, overlapUpdate: false }],
  ['sapipe-wp prev-sync', { mode: 'sapipe-wp', optimizer: sgdm, estimate: 'prev-sync' }],
  ['sapipe-wp prev-sync + DC, Adam', { mode: 'sapipe-wp', optimizer: { kind: 'adam', lr: 0.01 }, estimate: 'prev-sync', compensation: {} }],
  ['sapipe-wp local', { mode: 'sapipe-wp', optimizer: sgdm, estimate: 'local' }],
  ['sapipe-wp local-prev-sync + DC', { mode: 'sapipe-wp', optimizer: sgdm, estimate: 'local-prev-sync', compensation: {} }],
];

for (const [name, config] of cases) {
  t.test(`${name}: ${N} steps, save, SIGKILL, resume, ${M} steps = ${N + M} uninterrupted steps, bit for bit`, async (t) => {
    const dir = mkdtempSync(join(tmpdir(), 'sapipe-resume-'));
    t.teardown(() => rmSync(dir, { recursive: true, force: true }));
    const group = `resume-${name.replace(/\W+/g, '-')}`;
    const [first, whole] = await Promise.all([run({ dir, config, from: 0, to: N, save: true, kill: true, group }), run({ dir: join(dir, 'unused'), config, from: 0, to: N + M, group })]);
    t.equal(first.signal, 'SIGKILL', `the first process was killed after its save\n${first.stderr.slice(-1500)}`);
    const resumed = await run({ dir, config, from: N, to: N + M, resume: true, group });
    t.equal(resumed.code, 0, `the resumed process finished\n${resumed.stderr.slice(-1500)}`);
    t.equal(whole.code, 0, `the uninterrupted process finished\n${whole.stderr.slice(-1500)}`);
    if (!resumed.result || !whole.result) return;
    t.same(resumed.result.weights, whole.result.weights, 'the weights');
    t.same(resumed.result.forward, whole.result.forward, 'the weights the next forward reads');
    t.same(resumed.result.flushed, whole.result.flushed, 'the weights after flush()');
    if (config.mode !== 'sync') t.notSame(whole.result.weights[0], whole.result.flushed[0], 'a gradient was in flight at the end (flush changed the weights)');
  });
}

// Restarts: `sapipe launch --max-restarts 2` over ucx, a rank SIGKILLed mid-run on the first
// attempt; the job restarts, the ranks resume from their last complete checkpoint, and the final
// weights equal those of a run never killed.
const RESTARTABLE = fileURLToPath(new URL('../fixtures/checkpoint/restartable.mjs', import.meta.url));
const repoRoot = fileURLToPath(new URL('../..', import.meta.url));

async function launchJob(dir: string, job: Record<string, unknown>, maxRestarts: number): Promise<{ exitCode: number; restarts: number; out: string; err: string; lost: { resumeStep?: number | null; lostMs?: number }[] }> {
  const { launch } = await import('../../dist/launch/index.js');
  const { Writable } = await import('node:stream');
  let out = '';
  let err = '';
  const sink = (append: (s: string) => void): InstanceType<typeof Writable> =>
    new Writable({
      write(chunk: Buffer, _encoding, callback): void {
        append(chunk.toString());
        callback();
      },
    });
  const result = await launch({ script: RESTARTABLE, args: [dir, JSON.stringify(job)], nproc: 2, maxRestarts, checkpointDir: dir, cwd: repoRoot, env: { ...process.env, NODE_OPTIONS: '' }, forwardSignals: false, graceMs: 2000, stdout: sink((s) => (out += s)), stderr: sink((s) => (err += s)) });
  return { exitCode: result.exitCode, restarts: result.restarts, out, err, lost: result.restarted.map((r) => ({ resumeStep: r.resumeStep, lostMs: r.lostMs })) };
}

const { ucxStatus } = await import('../../dist/comm/ucx-native.js');
const ucx = ucxStatus();
if (!ucx.available && process.env.CI) t.fail(`the ucx plugin is not available in CI, so restarts are untested: ${ucx.reason ?? 'unknown'}`);
for (const mode of ['sync', 'sapipe-wp'] as const) {
  t.test(`${mode}: sapipe launch --max-restarts 2 with a rank SIGKILLed mid-run ends with the weights of a run never killed`, ucx.available ? {} : { skip: `ucx is unavailable: ${ucx.reason ?? 'unknown'}` }, async (t) => {
    const base = mkdtempSync(join(tmpdir(), 'sapipe-restart-'));
    t.teardown(() => rmSync(base, { recursive: true, force: true }));
    const job = { steps: 40, every: 5, mode };
    const killed = await launchJob(join(base, 'killed'), { ...job, killAt: 23, killRank: 1 }, 2);
    t.equal(killed.exitCode, 0, `the job finished\n${killed.err.slice(-1500)}`);
    t.equal(killed.restarts, 1, 'after one restart');
    t.match(killed.err, /rank 1 \(local rank 1\) was killed by signal SIGKILL/, 'the launcher says which rank died');
    t.match(killed.err, /restarting the job \(restart 1 of 2\) after [\d.]+ s.*resume from step (15|20) \(the newest complete checkpoint in .*\), and the [\d.]+ s of training since it was saved are lost/, 'and that it restarts, from which step, losing how much');
    const resumed = [...killed.out.matchAll(/\[0\] RESUMED (\d+)/g)].map((m) => Number(m[1]));
    // Step 20's files may still have been on their way to disk when rank 1 died at step 23 (a save
    // is awaited at the next one): then step 15 is the newest complete checkpoint.
    t.ok(resumed.length === 2 && resumed[0] === 0 && (resumed[1] === 20 || resumed[1] === 15), `the second attempt resumed from the last complete checkpoint before the kill (${resumed.join(', then ')})`);
    t.equal(killed.lost[0]?.resumeStep, resumed[1], 'the launcher named the step the ranks resumed from');
    t.ok(killed.lost[0]!.lostMs! >= 0 && killed.lost[0]!.lostMs! < 60_000, `lost ${killed.lost[0]!.lostMs} ms`);
    const whole = await launchJob(join(base, 'whole'), job, 0);
    t.equal(whole.exitCode, 0, `the uninterrupted job finished\n${whole.err.slice(-1500)}`);
    const weights = (out: string): number[] => JSON.parse(/\[0\] RESULT (.*)/.exec(out)![1]!) as number[];
    t.same(weights(killed.out), weights(whole.out), 'the final weights, bit for bit');
  });
}
