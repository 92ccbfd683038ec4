import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';

import t, { type Test } from 'tap';

import { launch, type LaunchOptions } from '../../dist/launch/index.js';
import { fixture, repoRoot, typescriptEnv, typescriptNodeArgs } from '../fixtures/launch/typescript-child.js';

class Collector extends Writable {
  text = '';
  override _write(chunk: Buffer, _encoding: BufferEncoding, callback: () => void): void {
    this.text += chunk.toString();
    callback();
  }
  get lines(): string[] {
    return this.text.split('\n').filter((l) => l !== '');
  }
}

/** A fresh directory for the fixtures' readiness barrier (test/fixtures/launch/ready.mjs). */
function readyDirectory(t: Test): string {
  const dir = mkdtempSync(join(tmpdir(), 'sapipe-launch-ready-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

async function run(options: Omit<LaunchOptions, 'stdout' | 'stderr'>) {
  const stdout = new Collector();
  const stderr = new Collector();
  const start = Date.now();
  const result = await launch({ forwardSignals: false, ...options, stdout, stderr });
  return { result, stdout, stderr, elapsedMs: Date.now() - start };
}

t.test('three ranks get torchrun variables and prefixed output, and the job exits 0', async (t) => {
  const { result, stdout, stderr } = await run({ script: fixture('print-env.mjs'), args: ['--lr', '0.1', 'x y'], nproc: 3 });
  t.equal(result.exitCode, 0);
  t.equal(result.failure, undefined);
  t.same(result.ranks.map((r) => [r.rank, r.code, r.signal]), [[0, 0, null], [1, 0, null], [2, 0, null]]);
  for (const line of stdout.lines) t.match(line, /^\[[0-2]\] /, 'every stdout line is prefixed');
  for (const line of stderr.lines) t.match(line, /^\[[0-2]\] to stderr from [0-2]$/, 'stderr is prefixed too');
  for (let rank = 0; rank < 3; rank++) {
    const line = stdout.lines.find((l) => l.startsWith(`[${rank}] env `));
    t.ok(line, `rank ${rank} printed its env`);
    const env = JSON.parse(line!.slice(`[${rank}] env `.length));
    t.same(env, {
      RANK: String(rank),
      WORLD_SIZE: '3',
      LOCAL_RANK: String(rank),
      LOCAL_WORLD_SIZE: '3',
      MASTER_ADDR: '127.0.0.1',
      MASTER_PORT: String(result.masterPort),
      GROUP_RANK: '0',
      hasToken: true,
      args: ['--lr', '0.1', 'x y'],
      execArgv: [],
    });
    t.ok(stdout.lines.includes(`[${rank}] no newline from ${rank}`), 'a last line without newline is completed');
  }
  t.ok(result.masterPort > 0);
  const [ephemeralLow] = readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/).map(Number);
  t.ok(result.masterPort < ephemeralLow!, `the default master port ${result.masterPort} lies below the ephemeral range (from ${ephemeralLow}), which other sockets are given`);
});

t.test('ranks of a later node are numbered after the earlier nodes', async (t) => {
  const { result, stdout } = await run({
    script: fixture('print-env.mjs'),
    nproc: 2,
    nnodes: 3,
    nodeRank: 1,
    masterAddr: 'node0.example',
    masterPort: 29555,
    env: { ...process.env, SAPIPE_TOKEN: 'shared' },
  });
  t.equal(result.exitCode, 0);
  const envs = stdout.lines.filter((l) => l.includes(' env ')).map((l) => JSON.parse(l.slice(l.indexOf('{'))));
  t.same(envs.map((e) => e.RANK).sort(), ['2', '3']);
  t.same(envs.map((e) => e.LOCAL_RANK).sort(), ['0', '1']);
  for (const e of envs) t.match(e, { WORLD_SIZE: '6', LOCAL_WORLD_SIZE: '2', GROUP_RANK: '1', MASTER_ADDR: 'node0.example', MASTER_PORT: '29555' });
});

t.test('a rank exiting 3 stops the others quickly and fails the job', async (t) => {
  const { result, stdout, stderr, elapsedMs } = await run({ script: fixture('fail-one.mjs'), args: ['1', '3', readyDirectory(t)], nproc: 3 });
  t.equal(result.exitCode, 3);
  t.match(result.failure, { rank: 1, code: 3, signal: null });
  t.match(result.message, /rank 1 .*exited with code 3/);
  t.match(stderr.text, /sapipe launch: rank 1 \(local rank 1\) exited with code 3; stopping the other ranks/);
  t.ok(stdout.lines.includes('[0] got SIGTERM') && stdout.lines.includes('[2] got SIGTERM'), 'the others got SIGTERM');
  t.ok(elapsedMs < 10_000, `took ${elapsedMs} ms, far less than the ranks' minute of sleep`);
});

t.test('a rank killed by SIGKILL fails the job', async (t) => {
  const { result, stderr, elapsedMs } = await run({ script: fixture('kill-self.mjs'), nproc: 3 });
  t.equal(result.exitCode, 128 + 9);
  t.match(result.failure, { rank: 1, code: null, signal: 'SIGKILL' });
  t.match(stderr.text, /rank 1 \(local rank 1\) was killed by signal SIGKILL/);
  t.ok(elapsedMs < 10_000);
});

t.test('a rank killed from outside is blamed over the peers that failed because of it, whichever exit came first', async (t) => {
  const { result, stderr, elapsedMs } = await run({ script: fixture('killed-after-peer.mjs'), nproc: 2 });
  t.equal(result.exitCode, 128 + 9, 'the killed rank\'s signal');
  t.match(result.failure, { rank: 1, code: null, signal: 'SIGKILL' });
  t.match(result.message, /rank 1 .*was killed by signal SIGKILL; the failure of rank 0 before it was reported followed from it/);
  t.match(stderr.text, /rank 0 \(local rank 0\) exited with code 1; stopping the other ranks/, 'the first report is still printed as it came');
  t.ok(elapsedMs < 10_000);
});

t.test('a rank that ignores SIGTERM is killed after the grace period', async (t) => {
  const { result, stdout, elapsedMs } = await run({ script: fixture('ignore-sigterm.mjs'), args: [readyDirectory(t)], nproc: 2, graceMs: 300 });
  t.equal(result.exitCode, 2);
  t.match(result.failure, { rank: 0, code: 2 });
  t.match(result.ranks[1], { rank: 1, signal: 'SIGKILL' });
  t.ok(stdout.lines.includes('[1] ignoring SIGTERM'));
  t.ok(elapsedMs < 10_000);
});

t.test('bad options are refused', async (t) => {
  const script = fixture('print-env.mjs');
  await t.rejects(launch({ script, nproc: 0 }), { code: 'ERR_INVALID_ARGUMENT' });
  await t.rejects(launch({ script, nproc: 1.5 }), { code: 'ERR_INVALID_ARGUMENT' });
  await t.rejects(launch({ script, nproc: 1, nnodes: 2 }), { code: 'ERR_INVALID_ARGUMENT', message: /masterAddr/ });
  await t.rejects(launch({ script, nproc: 1, nnodes: 2, nodeRank: 2, masterAddr: 'a', masterPort: 1 }), { code: 'ERR_INVALID_ARGUMENT' });
  await t.rejects(launch({ script, nproc: 1, masterPort: 65536 }), { code: 'ERR_INVALID_ARGUMENT' });
  await t.rejects(launch({ script: '', nproc: 1 }), { code: 'ERR_INVALID_ARGUMENT' });
});

t.test('launched ranks meet through the rendezvous store', async (t) => {
  const { result, stdout, stderr } = await run({
    script: fixture('rendezvous-ranks.ts'),
    nproc: 3,
    nodeArgs: typescriptNodeArgs(),
    cwd: repoRoot,
    env: { ...process.env, ...typescriptEnv },
  });
  t.equal(result.exitCode, 0, stderr.text);
  for (let rank = 0; rank < 3; rank++) {
    const next = (rank + 1) % 3;
    t.ok(
      stdout.lines.includes(`[${rank}] next ${next},${255 - next} seen 0,255 1,254 2,253 local=${rank} arrivals<=3:true`),
      `rank ${rank} saw every value`,
    );
  }
});

/**
 * Runs `sapipe launch` from source in a child process: through the whole CLI (main.ts), or with
 * `launchOnly` through the command alone, which starts faster.
 */
function cli(args: string[], launchOnly = true) {
  const entry = fixture(launchOnly ? 'run-launch-command.ts' : 'run-cli.ts');
  const child = spawn(process.execPath, [...typescriptNodeArgs(), entry, ...args], {
    cwd: repoRoot,
    env: { ...process.env, ...typescriptEnv },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (c: Buffer) => (stdout += c.toString()));
  child.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
  const timer = setTimeout(() => child.kill('SIGKILL'), 20_000);
  const exited = once(child, 'close').then(([code, signal]) => {
    clearTimeout(timer);
    return { code: code as number | null, signal: signal as NodeJS.Signals | null, stdout, stderr };
  });
  return { child, exited, output: () => stdout };
}

t.test('sapipe launch passes everything after the script to it and exits with the failed rank', async (t) => {
  const ok = await cli(['launch', '--nproc', '2', '--node-arg=--no-warnings', fixture('print-env.mjs'), '--nproc', '7', '-x'], false).exited;
  t.equal(ok.code, 0, ok.stderr);
  t.match(ok.stdout, /^\[1\] env .*"args":\["--nproc","7","-x"\],"execArgv":\["--no-warnings"\]/m);
  const failed = await cli(['launch', '--nproc', '2', '--grace-ms', '500', fixture('fail-one.mjs'), '0', '5']).exited;
  t.equal(failed.code, 5);
  t.match(failed.stderr, /rank 0 \(local rank 0\) exited with code 5/);
  const bad = await cli(['launch', '--nproc', 'two', fixture('print-env.mjs')]).exited;
  t.not(bad.code, 0);
  t.match(bad.stderr, /--nproc/);
});

t.test('SIGTERM to the launcher is forwarded to the ranks', async (t) => {
  const { child, exited, output } = cli(['launch', '--nproc', '2', fixture('sleep.mjs')]);
  while ((output().match(/ready/g) ?? []).length < 2) await once(child.stdout, 'data');
  child.kill('SIGTERM');
  const { code, stdout, stderr } = await exited;
  t.match(stdout, /^\[0\] got SIGTERM$/m);
  t.match(stdout, /^\[1\] got SIGTERM$/m);
  t.match(stderr, /received SIGTERM; stopping all ranks/);
  t.equal(code, 128 + 15);
});
