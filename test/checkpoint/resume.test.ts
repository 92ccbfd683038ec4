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
    t.notSame(whole.result.weights[0], whole.result.flushed[0], 'a gradient was in flight at the end (flush changed the weights)', { skip: config.mode === 'sync' ? 'sync has nothing in flight' : false });
  });
}
