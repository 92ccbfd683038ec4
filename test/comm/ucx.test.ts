/**
 * The ucx backend with real processes started by `sapipe launch` (test/fixtures/comm/ucx-rank.ts):
 * every collective against a plain JS computation for sizes 0, 1, odd and large on 1-4 ranks,
 * point-to-point ordering (and user messages never taken by a collective), size mismatches, use
 * after destroy(), the fused all-reduce + update against the reference update, a rank killed with
 * SIGKILL mid-collective, bad input, and `sapipe info` when the plugin is missing.
 *
 * Needs the UCX plugin (build/Release/sapipe_ucx.so, built by `npm run build:native` where
 * libucx-dev is installed). In CI (CI set) a missing plugin fails the run; elsewhere the tests
 * say why they cannot run.
 */
import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import t, { type Test } from 'tap';

import { ucxStatus } from '../../dist/comm/ucx-native.js';
import { selectCommBackend } from '../../dist/backends/index.js';
import { allreduceAndStep, createRendezvous, DisposedError, FlatBuffer, InvalidArgumentError, ParamSet, SGD, TimeoutError, UcxCommunicator } from '../../dist/index.js';
import { launch } from '../../dist/launch/index.js';
import { repoRoot, typescriptEnv, typescriptNodeArgs } from '../fixtures/launch/typescript-child.js';
import { fusedReference, worstRatio } from '../helpers/fused-reference.js';
import { textSink } from '../helpers/text-sink.js';

const root = fileURLToPath(new URL('../..', import.meta.url));
const FIXTURE = fileURLToPath(new URL('../fixtures/comm/ucx-rank.ts', import.meta.url));

type Result = Record<string, unknown>;

/** Runs the fixture on n ranks; returns the launch result and every rank's RESULT messages. */
async function runRanks(n: number, args: string[], env: Record<string, string> = {}): Promise<{ exitCode: number; message?: string; results: Result[][]; stderr: string }> {
  let out = '';
  let err = '';
  const result = await launch({
    script: FIXTURE,
    args,
    nproc: n,
    nodeArgs: typescriptNodeArgs(),
    cwd: repoRoot,
    env: { ...process.env, ...typescriptEnv, ...env },
    forwardSignals: false,
    stdout: textSink((s) => (out += s)),
    stderr: textSink((s) => (err += s)),
  });
  const results: Result[][] = Array.from({ length: n }, () => []);
  for (const line of out.split('\n')) {
    const m = /^\[(\d+)\] RESULT (.*)$/.exec(line);
    if (m) results[Number(m[1])]!.push(JSON.parse(m[2]!) as Result);
  }
  return { exitCode: result.exitCode, ...(result.message ? { message: result.message } : {}), results, stderr: err };
}

const status = ucxStatus();
if (!status.available) {
  if (process.env.CI) t.fail(`the ucx plugin is not available in CI, so the ucx backend is untested: ${status.reason ?? 'unknown'}`);
  else t.comment(`ucx tests cannot run here: ${status.reason ?? 'unknown'}`);
}
const needsUcx = status.available ? {} : { skip: `the ucx plugin is unavailable: ${status.reason ?? 'unknown'}` };

t.test('sapipe info reports ucx, and why not when the plugin is missing', async (t) => {
  const info = (env: Record<string, string>): Promise<{ name: string; available: boolean; reason?: string }> =>
    new Promise((resolve, reject) => {
      execFile(process.execPath, [`${root}/bin/sapipe.js`, 'info', '--json'], { env: { ...process.env, ...env } }, (error, stdout) => {
        if (error) return reject(error);
        const backends = (JSON.parse(stdout) as { backends: { name: string; available: boolean; reason?: string }[] }).backends;
        resolve(backends.find((b) => b.name === 'ucx')!);
      });
    });
  const missing = `${root}/no/such/dir/sapipe_ucx.so`;
  const gone = await info({ SAPIPE_UCX_PLUGIN: missing });
  t.equal(gone.available, false);
  t.match(gone.reason, `the ucx plugin was not found: looked for ${missing}`);
  const wrong = await info({ SAPIPE_UCX_PLUGIN: `${root}/build/Release/test-fakes/plugin_other_abi.so` });
  t.equal(wrong.available, false, 'a file that is not the ucx plugin is refused');
  t.ok(wrong.reason && wrong.reason.length > 0, `with a reason: ${wrong.reason}`);
  if (status.available) {
    t.equal((await info({})).available, true, 'the built plugin is reported available');
    t.equal(selectCommBackend('ucx').name, 'ucx');
  } else {
    t.throws(() => selectCommBackend('ucx'), { code: 'ERR_BACKEND_UNAVAILABLE', message: /apt-get install libucx-dev/ });
  }
});

// `direct`: whether collectives on shared buffers read the peers' memory (they fall back to the
// ring, on every rank alike, with algorithm 'ring' or when UCX has no shared-memory transport).
const runs: { memory: 'host' | 'shared'; algorithm: 'direct' | 'ring'; worlds: number[]; direct: boolean; env?: Record<string, string>; what: string }[] = [
  { memory: 'host', algorithm: 'direct', worlds: [1, 2, 3, 4], direct: false, what: 'ordinary buffers (the ring)' },
  { memory: 'shared', algorithm: 'direct', worlds: [1, 2, 3, 4], direct: true, what: 'buffers from comm.allocate() (direct reads of shared memory)' },
  { memory: 'shared', algorithm: 'ring', worlds: [2], direct: false, what: "buffers from comm.allocate() with algorithm 'ring'" },
  { memory: 'shared', algorithm: 'direct', worlds: [2], direct: false, env: { UCX_TLS: 'tcp,self' }, what: 'buffers from comm.allocate() when UCX may only use TCP (the ring)' },
  // Each rank claims a machine of its own (SAPIPE_UCX_HOST): UCX then watches the peers itself
  // (its peer error mode, over TCP) and shared buffers take the ring, as between machines.
  { memory: 'shared', algorithm: 'direct', worlds: [3], direct: false, env: { SAPIPE_TEST_SEPARATE_HOSTS: '1' }, what: 'buffers from comm.allocate() on ranks that claim separate machines (the ring)' },
];
for (const { memory, algorithm, worlds, direct, env: extra, what } of runs)
t.test(`every collective, point-to-point ordering, mismatches, the fused step and destroy on ${worlds.join(', ')} ranks, ${what}`, needsUcx, async (t) => {
  const sizes = '0,1,17,1001,1000003';
  for (const n of worlds) {
    // Small chunks on 3 ranks: the pipelined path with many chunks per part.
    const env: Record<string, string> = { SAPIPE_TEST_MEMORY: memory, SAPIPE_TEST_ALGORITHM: algorithm, ...(n === 3 ? { SAPIPE_UCX_CHUNK_BYTES: '4096' } : {}), ...extra };
    const run = await runRanks(n, ['all', sizes], env);
    t.equal(run.exitCode, 0, `world ${n}: ${run.message ?? ''} ${run.exitCode ? run.stderr.slice(-2000) : ''}`);
    for (let rank = 0; rank < n; rank++) {
      const msgs = run.results[rank]!;
      const collectives = msgs.filter((m) => 'len' in m);
      t.equal(collectives.length, 5, `world ${n} rank ${rank}: every size ran`);
      for (const m of collectives) {
        const checks = m.checks as Record<string, { bad: number } | number>;
        for (const [name, c] of Object.entries(checks))
          if (typeof c === 'number') t.equal(c, 0, `world ${n} len ${String(m.len)} ${name}`);
          else t.equal(c.bad, 0, `world ${n} rank ${rank} len ${String(m.len)}: ${name} ${JSON.stringify(c)}`);
        // Shared buffers on 2+ ranks: every collective with data read the peers directly (7 per
        // size: sum, avg, range if non-empty, reduce-scatter, all-gather, broadcast, shards).
        const expected = !direct || n === 1 || m.len === 0 ? 0 : (m.count as number) > 0 ? 7 : 6;
        t.equal(m.direct, expected, `world ${n} rank ${rank} len ${String(m.len)}: collectives on shared memory`);
      }
      if (memory === 'shared') {
        const regions = msgs.find((m) => 'regions' in m)?.regions as { mixed: { bad: number }; mixedDirect: number; churnBad: number; growth: number } | undefined;
        t.equal(regions?.mixed.bad, 0, `world ${n} rank ${rank}: shared memory on one rank only: the ring, correct`);
        t.equal(regions?.mixedDirect, 0, 'and not read directly');
        t.equal(regions?.churnBad, 0, '40 regions allocated, reduced and freed in turn: every sum right');
        t.ok((regions?.growth ?? 99) <= 4, `and peers unmapped the freed ones (shared mappings grew by ${String(regions?.growth)})`);
        t.equal(msgs.find((m) => 'keptAfterDestroy' in m)?.keptAfterDestroy, true, 'a buffer outlives destroy() until disposed');
      }
      t.same(msgs.find((m) => 'afterDestroy' in m)?.afterDestroy, 'ERR_DISPOSED', `world ${n} rank ${rank}: use after destroy()`);
      if (n < 2) continue;
      if (rank > 0) {
        const p2p = msgs.find((m) => 'p2p' in m);
        t.same(p2p?.p2p, p2p?.expected, `world ${n} rank ${rank}: messages in order and intact`);
        t.equal(p2p?.collective, n, 'a collective in between took no user message');
      }
      const mm = msgs.find((m) => 'mismatch' in m);
      t.same(mm?.mismatch, ['ERR_SIZE_MISMATCH'], `world ${n} rank ${rank}: mismatched all-reduce sizes fail on every rank`);
      t.equal(mm?.after, (n * (n - 1)) / 2, 'and the group still works');
      if (rank === 1) {
        t.equal(mm?.p2p, 'ERR_SIZE_MISMATCH', 'a receive of another length is refused');
        t.same(mm?.next, [7, 8], 'and the next message arrives intact');
      }
      checkFused(t, n, rank, msgs.find((m) => 'fused' in m)?.fused as Record<string, FusedOut> | undefined);
      type Run = { weights: number[]; applied: boolean[]; overlapped: boolean };
      // Each mode's runs come in a line of their own (trainerRuns), then the shared-memory count.
      const runsOf = (all: Result[]): Record<string, Run> => Object.assign({}, ...all.filter((m) => 'trainerRuns' in m).map((m) => m.trainerRuns as Record<string, Run>));
      const direct0 = msgs.find((m) => 'trainer' in m)?.trainer as { direct: number } | undefined;
      const trained = direct0 && { runs: runsOf(msgs), direct: direct0.direct };
      const trained0 = { runs: runsOf(run.results[0]!) };
      t.ok(trained, `world ${n} rank ${rank}: DataParallelTrainer trained over ucx`);
      for (const mode of ['pipe-sgd', 'sapipe-dc', 'sapipe-wp', 'sapipe-wp+dc adam', 'sapipe-wp+dc adam, per bucket']) {
        const over = trained?.runs[`${mode} overlapped`];
        const at = trained?.runs[`${mode} at-step`];
        t.ok(over?.overlapped && at && !at.overlapped, `${mode}: one run overlapped, one at step()`);
        t.ok(over?.weights.some((w, i) => w !== Math.fround(Math.sin(i))), `${mode}: trained`);
        t.same(over?.weights, at?.weights, `world ${n} rank ${rank}, ${mode}: the overlapped update equals the one at step(), bit for bit, after 50 steps`);
        t.same(over?.weights, trained0?.runs[`${mode} overlapped`]?.weights, 'and rank 0\'s weights');
        t.same(over?.applied, at?.applied, 'the same steps applied');
        if (n > 1) t.equal(over?.applied[21], false, 'a NaN in one bucket of one rank skips that update on every rank');
      }
      if (direct) t.ok((trained?.direct ?? 0) > 0, `its all-reduces read shared memory (${String(trained?.direct)})`);
    }
  }
});

interface FusedOut {
  results: { applied: boolean; nonFiniteCount: number }[];
  weights: number[];
  predicted: number[];
}

/** The fixture's fused steps against the reference update of the all-reduced average (as test/comm/local.test.ts). */
function checkFused(t: Test, n: number, rank: number, fused: Record<string, FusedOut> | undefined): void {
  t.ok(fused, `world ${n} rank ${rank}: the fused step ran`);
  if (!fused) return;
  const ref = fusedReference(n);
  for (const guard of ['prescan', 'deferred', 'sharded']) {
    const got = fused[guard]!;
    t.same(got.results.map((r) => r.applied), [true, true, false], `${guard}: the step with a NaN on rank 1 is skipped on every rank`);
    const worst = worstRatio(got.weights, ref.w);
    const worstPred = worstRatio(got.predicted, ref.predicted);
    t.ok(worst <= 1, `world ${n} ${guard} rank ${rank}: weights within 1e-5 relative (+1e-6 absolute) of the reference (worst ${worst.toFixed(3)})`);
    t.ok(worstPred <= 1, `world ${n} ${guard} rank ${rank}: predicted weights too (worst ${worstPred.toFixed(3)})`);
  }
}

for (const [memory, separate] of [['host', '0'], ['shared', '0'], ['host', '1']] as const)
t.test(`a rank killed with SIGKILL mid-collective (${memory} buffers${separate === '1' ? ', ranks claiming separate machines' : ''}): every later operation of the others is ERR_PEER_LOST, quickly`, needsUcx, async (t) => {
  const run = await runRanks(3, ['die'], { SAPIPE_TEST_UCX_TIMEOUT_MS: '15000', SAPIPE_TEST_MEMORY: memory, SAPIPE_TEST_SEPARATE_HOSTS: separate });
  t.not(run.exitCode, 0, `sapipe launch exits non-zero (${run.message ?? ''})`);
  t.equal(run.exitCode, 128 + 9, 'with the killed rank\'s signal');
  for (const rank of [0, 2]) {
    const r = run.results[rank]!.find((m) => 'die' in m);
    t.same(r?.die, Array(5).fill('ERR_PEER_LOST'), `rank ${rank}: the all-reduce in flight, later collectives and point-to-point all fail (${run.stderr.slice(-4000)})`);
    t.ok((r?.ms as number) < 5000, `rank ${rank}: within ${String(r?.ms)} ms (${String(r?.completed)} all-reduces completed first), well before the 15 s timeout`);
  }
});

t.test('bad input is refused with typed errors; use after destroy() is ERR_DISPOSED', needsUcx, async (t) => {
  await t.rejects(UcxCommunicator.create({ rank: 0, size: 1, timeoutMs: 0, store: undefined }), InvalidArgumentError);
  await t.rejects(UcxCommunicator.create(null as never), InvalidArgumentError);
  await t.rejects(UcxCommunicator.create({ store: {} as never }), InvalidArgumentError);
  await t.rejects(UcxCommunicator.create({ chunkBytes: 3, store: undefined, rank: 0, size: 1 }), InvalidArgumentError);
  await t.rejects(UcxCommunicator.create({ algorithm: 'tree' as 'ring', rank: 0, size: 1 }), InvalidArgumentError);
  const store = await createRendezvous({ rank: 0, worldSize: 1, port: 0 });
  await t.rejects(UcxCommunicator.create({ store, rank: 1, size: 2 }), InvalidArgumentError);
  const comm = await UcxCommunicator.create({ store, timeoutMs: 5000 });
  t.equal(comm.backend, 'ucx');
  // The calls every backend shares are in test/comm/contract.test.ts; what follows is ucx's own.
  const b = FlatBuffer.from([1, 2, 3]);
  // Shared memory: zeroed, any length (0 too), bad lengths refused; a ParamSet and its optimizer state there.
  const shared = comm.allocate(1000);
  t.ok(shared.array.every((v) => v === 0), 'comm.allocate() memory is zero-filled');
  shared.array.fill(2);
  t.equal((await comm.allreduce(shared, { op: 'avg' })).nonFiniteCount, 0);
  t.equal(shared.array[999], 2);
  t.equal(comm.allocate(0).length, 0);
  for (const bad of [-1, 1.5, NaN, 2 ** 32, '8' as unknown as number]) t.throws(() => comm.allocate(bad), InvalidArgumentError, `allocate(${String(bad)})`);
  const params = new ParamSet({ w: [3, 5] }, { memory: comm });
  const sgd = new SGD(params, { lr: 0.1, momentum: 0.9 });
  params.grads.array.fill(1);
  await allreduceAndStep(comm, sgd);
  t.ok(params.weights.array.slice(0, 15).every((v) => Math.abs(v + 0.1) < 1e-7), 'a ParamSet in shared memory steps as any other');
  sgd.dispose();
  comm.destroy();
  t.throws(() => comm.allocate(4), DisposedError, 'allocate() after destroy()');
  const later = new SGD(params, { lr: 0.1, momentum: 0.9 });
  later.stepSync();
  t.ok(params.weights.array[0]! < -0.1, 'the ParamSet outlives its communicator: a new optimizer gets ordinary memory for its state');
  later.dispose();
  params.dispose();
  shared.array[0] = 5;
  t.equal(shared.array[0], 5, 'a shared buffer stays usable after destroy()');
  shared.dispose();
  comm.destroy();
  await t.rejects(comm.allreduce(b), DisposedError);
  // A rank whose peers never come: create() gives up at the timeout.
  const lonely = await createRendezvous({ rank: 0, worldSize: 2, port: 0 });
  await t.rejects(UcxCommunicator.create({ store: lonely, timeoutMs: 300 }), TimeoutError);
  await lonely.close();
  await t.rejects(comm.barrier(), DisposedError);
  await t.rejects(comm.recv(b, 0), DisposedError);
  await store.close();
});

t.test('sapipe bench allreduce --backend ucx runs its ranks as processes and reports the table', needsUcx, async (t) => {
  const args = ['bench', 'allreduce', '--backend', 'ucx', '--nproc', '2', '--min', '4K', '--max', '8K', '--reps', '2', '--warmup', '1', '--optimizers', '', '--json'];
  const report = await new Promise<{ backend: string; nproc: number; algorithm: string; rows: { bytes: number; busbwGBps: number; ratioToCopy: number }[]; copy: { GBps: number } }>((resolve, reject) => {
    execFile(process.execPath, [`${root}/bin/sapipe.js`, ...args], { maxBuffer: 1 << 22 }, (error, stdout, stderr) => (error ? reject(new Error(`${error.message}: ${stderr}`)) : resolve(JSON.parse(stdout))));
  });
  t.equal(report.backend, 'ucx');
  t.equal(report.nproc, 2);
  t.equal(report.algorithm, 'direct', 'its buffers come from comm.allocate(), so the collectives read shared memory');
  t.same(report.rows.map((r) => r.bytes), [4096, 8192]);
  t.ok(report.rows.every((r) => r.busbwGBps > 0 && r.ratioToCopy > 0) && report.copy.GBps > 0, 'bandwidths and the memcpy reference are measured');
});

t.test('sapipe bench allreduce --topk prints the fused steps against the unfused sequence and the top-k exchange against its all-reduce', needsUcx, async (t) => {
  const args = ['bench', 'allreduce', '--backend', 'ucx', '--nproc', '2', '--min', '4K', '--max', '4K', '--reps', '2', '--warmup', '1', '--fused-size', '64K', '--optimizers', 'sgd-momentum', '--topk', '0.05', '--json'];
  const report = await new Promise<{ fused: { unfusedMs: number; unfusedRatio: number; unfusedShardedMs: number; unfusedShardedRatio: number }[]; topk: { density: number; topkMs: number; allreduceMs: number; ratio: number } }>((resolve, reject) => {
    execFile(process.execPath, [`${root}/bin/sapipe.js`, ...args], { maxBuffer: 1 << 22 }, (error, stdout, stderr) => (error ? reject(new Error(`${error.message}: ${stderr}`)) : resolve(JSON.parse(stdout))));
  });
  const f = report.fused[0]!;
  t.ok(f.unfusedMs > 0 && f.unfusedShardedMs > 0 && f.unfusedRatio > 0 && f.unfusedShardedRatio > 0, `the unfused sequences were timed (${f.unfusedMs.toFixed(3)}, ${f.unfusedShardedMs.toFixed(3)} ms)`);
  t.equal(report.topk.density, 0.05);
  t.ok(report.topk.topkMs > 0 && report.topk.allreduceMs > 0 && Math.abs(report.topk.ratio - report.topk.topkMs / report.topk.allreduceMs) < 1e-9, 'the top-k exchange against its all-reduce');
  await t.rejects(
    new Promise((resolve, reject) => execFile(process.execPath, [`${root}/bin/sapipe.js`, 'bench', 'allreduce', '--topk', '2'], (error, stdout, stderr) => (error ? reject(new Error(stderr)) : resolve(stdout)))),
    /--topk must be a density in \(0, 1\]/,
  );
});
