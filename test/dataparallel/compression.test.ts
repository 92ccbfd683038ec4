/**
 * DataParallelTrainer with top-k compression (MSTopK + sparse all-reduce, error feedback) against
 * a plain-TypeScript computation of what it must apply: per rank x = g + r (fp32), the exact top-k
 * of x sent (k < 64 and distinct magnitudes, where MSTopK's selection is the exact one), the
 * average of every rank's selection summed in rank order, r = x with the sent elements zeroed;
 * SGD with momentum on that average. 3 ranks in this thread, 12 updates with an Inf on one rank
 * in one of them (skipped everywhere; that rank's residual unchanged, the others keep all of x).
 * sync and pipe-sgd (whose gradients here do not depend on the weights, so after flush() both have
 * applied the same averages in the same order). Residuals bit for bit, weights to 1e-5 (relative above 1, absolute below).
 * Resuming from exportState() with the residual is exact; bad options are typed errors.
 */
import t from 'tap';

import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { DataParallelTrainer, loadCheckpoint, LocalCommunicator, ParamSet, saveCheckpoint, type DataParallelMode } from '../../dist/index.js';
import { exactTopk, scatterAddRef } from '../reference/topk.js';

const N = 1001;
const RANKS = 3;
const DENSITY = 0.03;
const K = Math.round(DENSITY * N); // 30 < 64: MSTopK stops only at exactly k
const UPDATES = 12;
const SKIPPED = 5;
const LR = 0.05;
const MU = 0.9;

function gradient(r: number, u: number, i: number): number {
  if (u === SKIPPED && r === 2 && i === 7) return Infinity;
  return Math.sin(1 + i * 0.37 + r * 1.3 + u * 0.71) * (1 + ((i * 7919 + r * 31 + u * 17) % 1000) / 250);
}

/** Weights and residuals the compressed training must reach (plain TypeScript, fp32 where the kernels are). */
function reference(errorFeedback: boolean): { weights: Float64Array; residuals: Float32Array[] } {
  const residuals = Array.from({ length: RANKS }, () => new Float32Array(N));
  const w = new Float64Array(N).fill(0.5);
  const m = new Float64Array(N);
  let first = true;
  for (let u = 0; u < UPDATES; u++) {
    const xs = Array.from({ length: RANKS }, (_, r) => Float32Array.from({ length: N }, (_, i) => Math.fround(Math.fround(gradient(r, u, i)) + (errorFeedback ? residuals[r]![i]! : 0))));
    const bad = xs.some((x) => x.some((v) => !Number.isFinite(v)));
    const sent = xs.map((x) => (x.some((v) => !Number.isFinite(v)) ? [] : exactTopk(x, K)));
    if (errorFeedback)
      xs.forEach((x, r) => {
        if (x.some((v) => !Number.isFinite(v))) return; // the rank with the Inf selects nothing; its residual stays
        const kept = x.slice();
        if (!bad) for (const i of sent[r]!) kept[i] = 0;
        residuals[r] = kept;
      });
    if (bad) continue;
    const avg = new Float32Array(N);
    xs.forEach((x, r) => scatterAddRef(avg, sent[r]!, sent[r]!.map((i) => x[i]!), 1 / RANKS));
    for (let i = 0; i < N; i++) {
      m[i] = first ? avg[i]! : MU * m[i]! + avg[i]!;
      w[i]! -= LR * m[i]!;
    }
    first = false;
  }
  return { weights: w, residuals };
}

async function trainers(name: string, mode: DataParallelMode, errorFeedback: boolean): Promise<{ sets: ParamSet[]; trainers: DataParallelTrainer[] }> {
  const comms = await Promise.all(Array.from({ length: RANKS }, (_, rank) => LocalCommunicator.create({ group: `${name}-${process.pid}`, rank, size: RANKS, timeoutMs: 10_000 })));
  const sets = comms.map(() => new ParamSet({ w: [N] }));
  sets.forEach((p) => p.get('w').data.fill(0.5));
  const list = await Promise.all(
    comms.map((comm, r) =>
      DataParallelTrainer.create({ comm, params: sets[r]!, mode, optimizer: { kind: 'sgd', lr: LR, momentum: MU }, compression: { kind: 'topk', density: DENSITY, errorFeedback } }),
    ),
  );
  return { sets, trainers: list };
}

async function run(list: DataParallelTrainer[], sets: ParamSet[], from: number, to: number): Promise<void> {
  for (let u = from; u < to; u++) {
    sets.forEach((p, r) => {
      const g = p.get('w').grad;
      for (let i = 0; i < N; i++) g[i] = gradient(r, u, i);
    });
    await Promise.all(list.map((tr) => tr.step()));
  }
}

for (const mode of ['sync', 'pipe-sgd'] as const) {
  for (const errorFeedback of [true, false]) {
    t.test(`${mode}, ${errorFeedback ? 'with' : 'without'} error feedback: ${UPDATES} updates on ${RANKS} ranks equal the reference`, async (t) => {
      const { sets, trainers: list } = await trainers(`topk-${mode}-${errorFeedback}`, mode, errorFeedback);
      await run(list, sets, 0, UPDATES);
      await Promise.all(list.map((tr) => tr.flush()));
      const ref = reference(errorFeedback);
      const states = await Promise.all(list.map((tr) => tr.exportState()));
      t.equal(states[0]!.optimizer.skippedSteps, 1, 'the update with the Inf was skipped');
      let worst = 0;
      sets[0]!.get('w').data.forEach((v, i) => (worst = Math.max(worst, Math.abs(v - ref.weights[i]!) / Math.max(1, Math.abs(ref.weights[i]!)))));
      t.ok(worst <= 1e-5, `weights: largest difference ${worst.toExponential(2)}, relative above 1 and absolute below (limit 1e-5: fp32 against float64)`);
      for (let r = 1; r < RANKS; r++) t.same([...sets[r]!.get('w').data], [...sets[0]!.get('w').data], `rank ${r} holds rank 0's weights`);
      states.forEach((s, r) => {
        if (errorFeedback) t.ok(s.residual instanceof Float32Array && ref.residuals[r]!.every((v, i) => Object.is(s.residual![i], v)) && s.residual.subarray(N).every((v) => v === 0), `rank ${r}: the residual equals the reference bit for bit (the ParamSet's alignment padding stays 0)`);
        else t.equal(s.residual, null, `rank ${r}: no residual without error feedback`);
      });
      await Promise.all(list.map((tr) => tr.dispose()));
    });
  }
}

t.test('resuming from exportState() or checkpoint files (residual included) equals training straight through, bit for bit', async (t) => {
  const straight = await trainers('topk-straight', 'pipe-sgd', true);
  await run(straight.trainers, straight.sets, 0, 10);
  await Promise.all(straight.trainers.map((tr) => tr.flush()));
  const first = await trainers('topk-first', 'pipe-sgd', true);
  await run(first.trainers, first.sets, 0, 4);
  const states = await Promise.all(first.trainers.map((tr) => tr.exportState()));
  await Promise.all(first.trainers.map((tr) => tr.dispose()));
  const second = await trainers('topk-second', 'pipe-sgd', true);
  second.trainers.forEach((tr, r) => tr.importState(states[r]!));
  await run(second.trainers, second.sets, 4, 10);
  await Promise.all(second.trainers.map((tr) => tr.flush()));
  for (let r = 0; r < RANKS; r++) t.same([...second.sets[r]!.get('w').data], [...straight.sets[r]!.get('w').data], `rank ${r}: the same weights`);
  const a = await Promise.all(straight.trainers.map((tr) => tr.exportState()));
  const b = await Promise.all(second.trainers.map((tr) => tr.exportState()));
  for (let r = 0; r < RANKS; r++) t.same([...b[r]!.residual!], [...a[r]!.residual!], `rank ${r}: the same residual`);
  // The same through checkpoint files: the residual travels as compression/residual.
  const dir = mkdtempSync(join(tmpdir(), 'sapipe-topk-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const saver = await trainers('topk-saver', 'pipe-sgd', true);
  await run(saver.trainers, saver.sets, 0, 4);
  const saves = await Promise.all(saver.trainers.map((tr) => saveCheckpoint(tr, { dir })));
  await Promise.all(saves.map((x) => x.written));
  await Promise.all(saver.trainers.map((tr) => tr.dispose()));
  const loader = await trainers('topk-loader', 'pipe-sgd', true);
  const loaded = await Promise.all(loader.trainers.map((tr) => loadCheckpoint(tr, { dir })));
  t.ok(loaded.every((l) => l?.step === 4), 'every rank loaded step 4');
  await run(loader.trainers, loader.sets, 4, 10);
  await Promise.all(loader.trainers.map((tr) => tr.flush()));
  for (let r = 0; r < RANKS; r++) t.same([...loader.sets[r]!.get('w').data], [...straight.sets[r]!.get('w').data], `rank ${r}: resumed from files, the same weights`);
  await Promise.all(loader.trainers.map((tr) => tr.dispose()));
  const plain = await trainers('topk-plain', 'pipe-sgd', false);
  t.throws(() => plain.trainers[0]!.importState(states[0]!), { code: 'ERR_INVALID_ARGUMENT' }, 'a residual into a trainer without error feedback is refused');
  await Promise.all([...straight.trainers, ...second.trainers, ...plain.trainers].map((tr) => tr.dispose()));
});

t.test('bad compression options are typed errors that say what to do', async (t) => {
  const comm = await LocalCommunicator.create({ group: `topk-bad-${process.pid}`, rank: 0, size: 1 });
  const params = new ParamSet({ w: [8] });
  const base = { comm, params, mode: 'sync', optimizer: { kind: 'sgd' as const, lr: 0.1 } };
  const cases: [string, Record<string, unknown>, RegExp][] = [
    ['an unknown kind', { compression: { kind: 'randk', density: 0.1 } }, /compression.kind must be 'topk'/],
    ['density 0', { compression: { kind: 'topk', density: 0 } }, /density/],
    ['a misspelled key', { compression: { kind: 'topk', density: 0.1, error_feedback: true } }, /errorFeedback/],
    ['the sharded update', { compression: { kind: 'topk', density: 0.1 }, update: 'sharded' }, /replicated/],
    ['loss scaling with error feedback', { compression: { kind: 'topk', density: 0.1 }, lossScaling: true }, /errorFeedback: false/],
    ['overlapUpdate forced on', { mode: 'pipe-sgd', compression: { kind: 'topk', density: 0.1 }, overlapUpdate: true }, /compression/],
  ];
  for (const [what, extra, message] of cases)
    await t.rejects(DataParallelTrainer.create({ ...base, ...extra } as never), { code: 'ERR_INVALID_ARGUMENT', message }, what);
  const ok = await DataParallelTrainer.create({ ...base, mode: 'sapipe-wp', compression: { kind: 'topk', density: 0.5 }, lossScaling: true, ...{} } as never).catch((e: Error) => e);
  t.match(ok, { code: 'ERR_INVALID_ARGUMENT' }, 'loss scaling is refused in every mode');
  params.dispose();
  comm.destroy();
});
