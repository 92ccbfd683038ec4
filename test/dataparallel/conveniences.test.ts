/**
 * The trainer's conveniences (gradient accumulation, clipping by global norm after the all-reduce,
 * dynamic loss scaling) against a plain-TypeScript computation of the gradient they must apply:
 * G = clip(mean over micro-batches and ranks of the unscaled gradients), fed as every rank's
 * gradient to a trainer without them (whose modes are checked against the reference elsewhere).
 * Two ranks in this thread, 10 updates with a skipped one; weights agree to 1e-5 relative.
 */
import t from 'tap';

import { DataParallelTrainer, LocalCommunicator, ParamSet, type DataParallelMode } from '../../dist/index.js';

const N = 37; // elements: not a multiple of a vector width
const RANKS = 2;
const K = 3; // micro-batches per update
const UPDATES = 10;
const CLIP = 2.5;
const SKIPPED = 4; // an Inf on rank 1 in this update

function gradient(r: number, u: number, m: number, i: number): number {
  if (u === SKIPPED && r === 1 && m === 0 && i === 0) return Infinity;
  return 3 * Math.sin(1 + i * 0.37 + r * 1.3 + u * 0.71 + m * 0.11);
}

/** The gradient the conveniences must apply at update u (plain TypeScript, float64). */
function expected(u: number): Float64Array {
  const g = new Float64Array(N);
  for (let i = 0; i < N; i++) {
    let s = 0;
    for (let r = 0; r < RANKS; r++) for (let m = 0; m < K; m++) s += gradient(r, u, m, i);
    g[i] = s / (RANKS * K);
  }
  const norm = Math.sqrt(g.reduce((a, x) => a + x * x, 0));
  if (Number.isFinite(norm) && norm > CLIP) for (let i = 0; i < N; i++) g[i]! *= CLIP / (norm + 1e-6);
  return g;
}

async function group(name: string): Promise<LocalCommunicator[]> {
  return Promise.all(Array.from({ length: RANKS }, (_, rank) => LocalCommunicator.create({ group: `${name}-${process.pid}`, rank, size: RANKS, timeoutMs: 10_000 })));
}

async function train(mode: DataParallelMode, conveniences: boolean): Promise<{ weights: Float32Array; scales: number[]; norms: (number | undefined)[] }> {
  const comms = await group(`conv-${mode}-${conveniences}`);
  const sets = comms.map(() => new ParamSet({ w: [N] }));
  sets.forEach((p) => p.get('w').data.fill(0.5));
  const trainers = await Promise.all(
    comms.map((comm, r) =>
      DataParallelTrainer.create({
        comm,
        params: sets[r]!,
        mode,
        optimizer: { kind: 'sgd', lr: 0.1, momentum: 0.9 },
        ...(conveniences ? { accumulationSteps: K, clipGradNorm: CLIP, lossScaling: { initScale: 1024, growthInterval: 3 } } : {}),
      }),
    ),
  );
  const scales: number[] = [];
  const norms: (number | undefined)[] = [];
  for (let u = 0; u < UPDATES; u++) {
    scales.push(trainers[0]!.lossScale);
    if (conveniences) {
      for (const tr of trainers) tr.zeroGrad();
      for (let m = 0; m < K; m++) {
        sets.forEach((p, r) => {
          const g = p.get('w').grad;
          for (let i = 0; i < N; i++) g[i]! += gradient(r, u, m, i) * trainers[r]!.lossScale;
        });
        const results = await Promise.all(trainers.map((tr) => tr.step()));
        if (m < K - 1 && !results.every((x) => x.accumulating && !x.updated)) throw new Error('a micro-batch step updated');
        if (m === K - 1) norms.push(results[0]!.gradNorm);
      }
    } else {
      const g = expected(u);
      for (const p of sets) p.get('w').grad.set(g);
      await Promise.all(trainers.map((tr) => tr.step()));
    }
  }
  await Promise.all(trainers.map((tr) => tr.flush()));
  const weights = sets[0]!.get('w').data.slice();
  t.same([...sets[1]!.get('w').data], [...weights], 'the ranks agree');
  await Promise.all(trainers.map((tr) => tr.dispose()));
  for (const p of sets) p.dispose();
  for (const c of comms) c.destroy();
  return { weights, scales, norms };
}

for (const mode of ['sync', 'sapipe-wp'] as const)
  t.test(`${mode}: accumulation, clipping after the all-reduce and loss scaling apply the expected gradient`, async (t) => {
    const got = await train(mode, true);
    const want = await train(mode, false);
    const worst = got.weights.reduce((w, x, i) => Math.max(w, Math.abs(x - want.weights[i]!) / (1e-6 + Math.abs(want.weights[i]!))), 0);
    t.ok(worst < 1e-5, `weights within 1e-5 relative (worst ${worst.toExponential(2)})`);
    t.not(got.weights[0], 0.5, 'training moved the weights');
    // The reported norm is of the averaged, unscaled gradient before clipping.
    if (mode === 'sync') {
      const u = 1;
      const raw = new Float64Array(N);
      for (let i = 0; i < N; i++) for (let r = 0; r < RANKS; r++) for (let m = 0; m < K; m++) raw[i]! += gradient(r, u, m, i) / (RANKS * K);
      const norm = Math.sqrt(raw.reduce((a, x) => a + x * x, 0));
      t.ok(Math.abs(got.norms[u]! - norm) < 1e-4 * norm, `gradNorm ${got.norms[u]} = ${norm}`);
      t.ok(norm > CLIP, 'the clip was active');
      // 3 good updates double the scale; the skipped update 4 halves it.
      t.same(got.scales, [1024, 1024, 1024, 2048, 2048, 1024, 1024, 1024, 2048, 2048]);
    }
  });

t.test('bad convenience options', async (t) => {
  const comms = await group('conv-bad');
  const p = new ParamSet({ w: [4] });
  const make = (extra: object, mode: DataParallelMode = 'sync') =>
    DataParallelTrainer.create({ comm: comms[0]!, params: p, mode, optimizer: { kind: 'sgd', lr: 0.1 }, broadcastWeights: false, ...extra });
  await t.rejects(make({ clipGradNorm: 0 }), { code: 'ERR_INVALID_ARGUMENT' });
  await t.rejects(make({ clipGradNorm: 1, update: 'sharded' }), { code: 'ERR_INVALID_ARGUMENT', message: /replicated/ });
  await t.rejects(make({ accumulationSteps: 0 }), { code: 'ERR_INVALID_ARGUMENT' });
  await t.rejects(make({ lossScaling: { initScale: 2, growth: 3 } }), { code: 'ERR_INVALID_ARGUMENT', message: /did you mean 'growthFactor'/ });
  await t.rejects(make({ lossScaling: true, estimate: 'local' }, 'sapipe-wp'), { code: 'ERR_INVALID_ARGUMENT', message: /prev-sync/ });
  p.dispose();
  for (const c of comms) c.destroy();
});

// A checkpoint taken between the micro-batches of an update, with the loss scale grown and shrunk,
// resumes exactly: the accumulated gradient, the count and the scale travel with the state.
for (const mode of ['sync', 'sapipe-wp'] as const)
  t.test(`${mode}: exportState between micro-batches, with a grown loss scale, resumes bit for bit`, async (t) => {
    const options = { mode, optimizer: { kind: 'sgd' as const, lr: 0.1, momentum: 0.9 }, accumulationSteps: K, lossScaling: { initScale: 1024, growthInterval: 3 } };
    const make = async (name: string): Promise<{ sets: ParamSet[]; trainers: DataParallelTrainer[]; comms: LocalCommunicator[] }> => {
      const comms = await group(name);
      const sets = comms.map(() => new ParamSet({ w: [N] }));
      sets.forEach((p) => p.get('w').data.fill(0.5));
      return { comms, sets, trainers: await Promise.all(comms.map((comm, r) => DataParallelTrainer.create({ comm, params: sets[r]!, ...options }))) };
    };
    // Micro-batch j of the run: update floor(j / K), micro-batch j % K.
    const feed = async (x: { sets: ParamSet[]; trainers: DataParallelTrainer[] }, from: number, to: number): Promise<void> => {
      for (let j = from; j < to; j++) {
        const [u, m] = [Math.floor(j / K), j % K];
        if (m === 0) for (const tr of x.trainers) tr.zeroGrad();
        x.sets.forEach((p, r) => {
          const g = p.get('w').grad;
          for (let i = 0; i < N; i++) g[i]! += gradient(r, u, m, i) * x.trainers[r]!.lossScale;
        });
        await Promise.all(x.trainers.map((tr) => tr.step()));
      }
    };
    const total = UPDATES * K;
    const cut = 5 * K + 2; // after update 4 (skipped, scale halved) and 2 micro-batches of update 5
    const straight = await make(`conv-straight-${mode}`);
    await feed(straight, 0, total);
    await Promise.all(straight.trainers.map((tr) => tr.flush()));
    const first = await make(`conv-first-${mode}`);
    await feed(first, 0, cut);
    const states = await Promise.all(first.trainers.map((tr) => tr.exportState()));
    t.equal(states[0]!.accumulation?.count, 2, 'the state holds the 2 micro-batches counted');
    // sync has applied update 4 (skipped: 2048 halved); sapipe-wp applies it one call later.
    t.same(states[0]!.lossScale, mode === 'sync' ? { scale: 1024, goodSteps: 0 } : { scale: 2048, goodSteps: 1 }, 'and the loss scale, grown once');
    const second = await make(`conv-second-${mode}`);
    second.trainers.forEach((tr, r) => tr.importState(states[r]!));
    t.equal(second.trainers[0]!.lossScale, first.trainers[0]!.lossScale, 'the imported scale is in effect');
    await feed(second, cut, total);
    await Promise.all(second.trainers.map((tr) => tr.flush()));
    for (let r = 0; r < RANKS; r++) t.same([...second.sets[r]!.get('w').data], [...straight.sets[r]!.get('w').data], `rank ${r}: the weights of the run never stopped`);
    t.equal(second.trainers[0]!.lossScale, straight.trainers[0]!.lossScale, 'the same final loss scale');
    t.throws(() => straight.trainers[0]!.importState({ ...states[0]!, accumulation: { count: K, grads: states[0]!.accumulation!.grads } }), { code: 'ERR_INVALID_ARGUMENT' }, 'a count outside the accumulation is refused');
    for (const x of [straight, first, second]) {
      await Promise.all(x.trainers.map((tr) => tr.dispose()));
      x.comms.forEach((c) => c.destroy());
    }
  });
