/**
 * `launch --max-restarts` with the newest checkpoint damaged: a rank dies after corrupting a
 * byte of another rank's file of the newest step. The launcher names the step the ranks really
 * resume from (the newest that verifies) and the step it passes over and why; every rank loads
 * that same step, warns (SAPIPE_CHECKPOINT_FALLBACK) naming the corrupt file, and the job
 * finishes. Before, the launcher promised the damaged step and every restart failed loading it.
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Writable } from 'node:stream';
import t from 'tap';

import { launch } from '../../dist/launch/index.js';
import { repoRoot, typescriptEnv, typescriptNodeArgs } from '../fixtures/launch/typescript-child.js';

const RANK = fileURLToPath(new URL('../fixtures/checkpoint/fallback-rank.ts', import.meta.url));

class Collector extends Writable {
  text = '';
  override _write(chunk: Buffer, _encoding: BufferEncoding, callback: () => void): void {
    this.text += chunk.toString();
    callback();
  }
}

const { ucxStatus } = await import('../../dist/comm/ucx-native.js');
const ucx = ucxStatus();
if (!ucx.available && process.env.CI) t.fail(`the ucx plugin is not available in CI, so the fallback under restarts is untested: ${ucx.reason ?? 'unknown'}`);

t.test('a corrupt newest checkpoint: the restart resumes from the one before on every rank, and the launcher says so', ucx.available ? {} : { skip: `ucx is unavailable: ${ucx.reason ?? 'unknown'}` }, async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'sapipe-fallback-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const stdout = new Collector();
  const stderr = new Collector();
  const result = await launch({
    script: RANK,
    args: [dir, JSON.stringify({ steps: 15, every: 5, corruptAt: 10 })],
    nproc: 2,
    maxRestarts: 2,
    checkpointDir: dir,
    nodeArgs: typescriptNodeArgs(),
    cwd: repoRoot,
    env: { ...process.env, ...typescriptEnv },
    forwardSignals: false,
    graceMs: 2000,
    stdout,
    stderr,
  });
  const out = stdout.text;
  const err = stderr.text;
  t.equal(result.exitCode, 0, `the job finished\n${err.slice(-3000)}`);
  t.equal(result.restarts, 1, 'after one restart');
  t.match(err, /rank 0 \(local rank 0\) was killed by signal SIGKILL/, 'the launcher says which rank died');
  t.match(
    err,
    /restarting the job \(restart 1 of 2\).*resume from step 5 \(the newest complete checkpoint in .* that verifies; passing over step 10 \(.*step-0000000010\/rank-1\.safetensors: its SHA-256 differs.*\)\), and the [\d.]+ s of training since it was saved are lost/,
    'the launcher names the step the ranks resume from, and the corrupt file it passes over',
  );
  t.notMatch(err, /resume from step 10/, 'never the damaged step');
  t.equal(result.restarted[0]?.resumeStep, 5);
  t.same(result.restarted[0]?.skippedSteps, [10]);
  for (const rank of [0, 1]) {
    const resumed = [...out.matchAll(new RegExp(`^\\[${rank}\\] RESUMED (\\d+) (.*)$`, 'gm'))].map((m) => [Number(m[1]), JSON.parse(m[2]!) as number[]]);
    t.same(resumed, [[0, []], [5, [10]]], `rank ${rank}: a fresh start, then step 5, passing over step 10`);
    t.match(out, new RegExp(`^\\[${rank}\\] WARNING SAPIPE_CHECKPOINT_FALLBACK .*skipped step-0000000010: .*rank-1\\.safetensors: its SHA-256 differs.*loading step-0000000005 instead`, 'm'), `rank ${rank} warned, naming the file and the reason`);
    t.match(out, new RegExp(`^\\[${rank}\\] DONE 15$`, 'm'), `rank ${rank} trained to the end`);
  }
});

t.test('nothing in the checkpoint directory can load: the launcher does not restart a job that could only fail again', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'sapipe-fallback-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  // Not a checkpoint: loadCheckpoint on every rank would refuse the directory rather than start afresh.
  writeFileSync(join(dir, 'notes.txt'), 'not a checkpoint');
  const script = join(dir, 'fail.mjs');
  writeFileSync(script, 'process.exit(3);\n');
  const stderr = new Collector();
  const result = await launch({ script, nproc: 2, maxRestarts: 3, checkpointDir: dir, forwardSignals: false, graceMs: 2000, stdout: new Collector(), stderr });
  t.equal(result.exitCode, 3, 'the failure is returned');
  t.equal(result.restarts, 0, 'no restart');
  t.same(result.restarted, []);
  t.match(result.notRestarted, /cannot resume from .*holds no checkpoint .*notes\.txt/, 'says why');
  t.match(stderr.text, /not restarting the job \(3 restarts left\) after [\d.]+ s: .*cannot resume from/, 'and tells the user');
});
