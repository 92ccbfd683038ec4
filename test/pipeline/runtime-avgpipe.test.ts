/**
 * AvgPipe on the runtime: N pipelines over S stages, each with advance forward propagation on its
 * own share of every round, each stage's replicas averaged with their center (elastic averaging),
 * in both layouts: `shared-stages` (the default: S workers, worker k running row k for every
 * pipeline with N replicas of part k, averaged on the worker) and `worker-per-replica` (N x S
 * workers, the replicas averaged by one all-reduce of the differences per exchange).
 *
 * - The center after 20 rounds (20 or 10 exchanges) equals test/reference/pipeline.ts's
 *   referenceAvgPipe, N models stepped on their own samples and averaged in double, for N = 2 and
 *   3, in the shared layout, and in the other for N = 3 and for averaging every 2 rounds on 3 stages. Tolerance 2e-6 absolute (weights O(0.5)): fp32 accumulation and fp32
 *   averaging, measured below 5e-7.
 * - The two layouts against each other on the same data and seed (those two settings): every
 *   round's losses and the center. They run the same kernels on the same replicas; only the summation order of the d_i
 *   may differ (the all-reduce's against the worker's pipeline order), which for N = 2 is none
 *   (a + b = b + a in fp32) and for N = 3 a rounding per exchange. Tolerance 1e-6 absolute on the
 *   center and 1e-6 relative on the losses; measured 0 (bit for bit) for N = 2 and 3 here.
 * - Stored activations per stage at S = 4, M = 8, A = 3: the validator's per-device figures 14, 10,
 *   6, 2 on the shared stages, and 7, 5, 3, 1 per pipeline worker in the other layout (over N).
 * - The shared stages' measured timeline: each worker's row runs every pipeline's passes in the
 *   generator's interleaved order.
 */
import t from 'tap';

import { AVERAGING_LAYOUTS, InvalidArgumentError, PipelineTrainer, trainPipelineStage, type AveragingLayout, type PipelineOptimizerSpec } from '../../dist/index.js';
import { referenceAvgPipe } from '../reference/pipeline.js';
import { FEATURES, LAYERS, SEED, dataset, evenBoundaries, initialPart, maxDiff, maxDiffToWhole, refConfig } from './runtime-helpers.js';

const TOLERANCE = 2e-6;
/** Between the layouts: the center (absolute) and every round's losses (relative). */
const LAYOUT_TOLERANCE = 1e-6;
const ROUNDS = 20;
const optimizer: PipelineOptimizerSpec = { kind: 'sgd', lr: 0.1, momentum: 0.9 };

// (Both layouts where N = 3, or averaging every 2 rounds on 3 stages; the shared stages alone at N = 2 on 2 stages, to keep the file's time down.)
for (const { pipelines, stages, every, alpha, layouts } of [
  { pipelines: 2, stages: 2, every: 1, alpha: undefined, layouts: 1 },
  { pipelines: 3, stages: 2, every: 1, alpha: undefined, layouts: 2 },
  { pipelines: 2, stages: 3, every: 2, alpha: 0.3, layouts: 2 },
]) {
  t.test(`avgpipe, ${pipelines} pipelines x ${stages} stages, averaging every ${every} round(s): the center equals the reference${layouts > 1 ? ' in both layouts, and the layouts each other' : ''}`, async (t) => {
    const M = 4;
    const B = 3;
    const perRound = pipelines * M * B;
    const { inputs, labels } = dataset(ROUNDS * perRound);
    const rounds = Array.from({ length: ROUNDS }, (_, r) => Array.from({ length: perRound }, (_, i) => r * perRound + i));
    const a = alpha ?? 0.9 / pipelines;
    const want = referenceAvgPipe(LAYERS, initialPart(0, LAYERS.length), refConfig(optimizer), { inputs, labels, features: FEATURES, batch: perRound }, rounds, pipelines, a, every);
    const boundaries = evenBoundaries(LAYERS.length, stages);
    const run = async (layout: AveragingLayout | undefined): Promise<{ layout: AveragingLayout | undefined; weights: Float32Array[]; losses: number[][] }> => {
      const trainer = await PipelineTrainer.create({
        schedule: 'avgpipe',
        stages,
        microBatches: M,
        microBatchSize: B,
        pipelines,
        averaging: { every, ...(alpha === undefined ? {} : { alpha }), ...(layout === undefined ? {} : { layout }) },
        model: { layers: LAYERS, seed: SEED, boundaries },
        optimizer,
        data: { inputs, labels, features: FEATURES },
        shuffle: false,
      });
      try {
        const losses: number[][] = [];
        for (let r = 0; r < ROUNDS; r++) losses.push([...(await trainer.trainRound()).losses]);
        return { layout: trainer.averagingLayout, weights: await trainer.weights(), losses };
      } finally {
        await trainer.dispose();
      }
    };
    const shared = await run(undefined);
    t.equal(shared.layout, 'shared-stages', 'the default layout: the pipelines share the stages');
    const separate = layouts > 1 ? await run('worker-per-replica') : undefined;
    t.equal(separate?.layout ?? 'worker-per-replica', 'worker-per-replica');
    for (const r of separate ? [shared, separate] : [shared]) {
      t.ok(r.losses.every((l) => l.length === pipelines * M && l.every(Number.isFinite)), `${r.layout}: a loss per micro-batch of every pipeline, every round`);
      const worst = maxDiffToWhole(r.weights, boundaries, want);
      t.ok(worst <= TOLERANCE, `${r.layout}: largest difference of the center to the reference ${worst.toExponential(2)} <= ${TOLERANCE}`);
    }
    t.ok(maxDiff(initialPart(0, LAYERS.length), want) > 1e-2, 'the weights moved');
    if (!separate) return;
    let worstWeights = 0;
    for (let j = 0; j < shared.weights.length; j++)
      for (let i = 0; i < shared.weights[j]!.length; i++) worstWeights = Math.max(worstWeights, Math.abs(shared.weights[j]![i]! - separate.weights[j]![i]!));
    let worstLoss = 0;
    for (let r = 0; r < ROUNDS; r++)
      for (let m = 0; m < pipelines * M; m++) worstLoss = Math.max(worstLoss, Math.abs(shared.losses[r]![m]! - separate.losses[r]![m]!) / Math.max(1e-30, Math.abs(separate.losses[r]![m]!)));
    t.ok(worstWeights <= LAYOUT_TOLERANCE, `the layouts' centers differ by at most ${worstWeights.toExponential(2)} <= ${LAYOUT_TOLERANCE}`);
    t.ok(worstLoss <= LAYOUT_TOLERANCE, `the layouts' round losses (pipeline 0's micro-batches, then pipeline 1's, ...) differ by at most ${worstLoss.toExponential(2)} relative <= ${LAYOUT_TOLERANCE}`);
  });
}

t.test('advance forward propagation at S = 4, M = 8, A = 3: the stored activations the validator gives; the shared stages run the generator\'s interleaved rows', async (t) => {
  const { inputs, labels } = dataset(2 * 8 * 2 * 3);
  const create = (layout: AveragingLayout): Promise<PipelineTrainer> =>
    PipelineTrainer.create({
      schedule: 'avgpipe',
      stages: 4,
      microBatches: 8,
      microBatchSize: 2,
      pipelines: 2,
      advance: 3,
      averaging: { layout },
      model: { layers: LAYERS, seed: SEED, boundaries: evenBoundaries(LAYERS.length, 4) },
      optimizer,
      data: { inputs, labels, features: FEATURES },
    });
  const shared = await create('shared-stages');
  try {
    const report = await shared.trainRound();
    t.same(shared.analysis.peakActivations, [14, 10, 6, 2], 'the validator, per device shared by the 2 pipelines');
    t.same(report.peakActivations, [14, 10, 6, 2], 'measured per worker of the shared stages: the same');
    t.equal(report.timeline.length, 4, 'a timeline row per stage worker');
    report.timeline.forEach((row, k) => {
      t.same(row.map((x) => x.index), shared.schedule.actions[k]!.map((_, i) => i), `stage ${k}: every action of its row, in the row's order`);
      t.same(row.map((x) => `${x.action.kind}:${x.action.pipeline}:${x.action.microBatch}`), shared.schedule.actions[k]!.map((a) => `${a.kind}:${a.pipeline}:${a.microBatch}`), `stage ${k}: the generator's interleaving of both pipelines`);
      t.same([...new Set(row.filter((x) => x.action.kind === 'forward').map((x) => x.action.pipeline))].sort(), [0, 1], `stage ${k}: forwards of both pipelines`);
    });
    t.ok(report.versions[0]!.some((v) => v.pipeline === 1), 'the versions read name their pipeline');
  } finally {
    await shared.dispose();
  }
  const separate = await create('worker-per-replica');
  try {
    const report = await separate.trainRound();
    t.same(report.peakActivations, [7, 5, 3, 1], 'measured per pipeline worker: 7, 5, 3, 1');
  } finally {
    await separate.dispose();
  }
});

t.test('avgpipe configurations that cannot run are typed errors before any worker starts', async (t) => {
  const { inputs, labels } = dataset(64);
  const base = { stages: 2, microBatches: 4, microBatchSize: 2, model: { layers: LAYERS, seed: SEED }, optimizer, data: { inputs, labels, features: FEATURES } } as const;
  await t.rejects(PipelineTrainer.create({ ...base, schedule: 'avgpipe', averaging: { alpha: 2 } }), InvalidArgumentError, 'alpha above 1');
  await t.rejects(PipelineTrainer.create({ ...base, schedule: 'avgpipe', averaging: { tau: 2 } as never }), InvalidArgumentError, 'an unknown key');
  await t.rejects(PipelineTrainer.create({ ...base, schedule: 'avgpipe', dataParallel: { mode: 'sync' } }), InvalidArgumentError, 'dataParallel on avgpipe');
  await t.rejects(PipelineTrainer.create({ ...base, schedule: '1f1b', advance: 1 }), InvalidArgumentError, 'advance outside avgpipe');
});

t.test('averaging.layout: one of AVERAGING_LAYOUTS, else a typed error that lists them, before any worker starts', async (t) => {
  t.same(AVERAGING_LAYOUTS, ['shared-stages', 'worker-per-replica'], 'the default first');
  const { inputs, labels } = dataset(64);
  const base = { stages: 2, microBatches: 4, microBatchSize: 2, model: { layers: LAYERS, seed: SEED }, optimizer, data: { inputs, labels, features: FEATURES } } as const;
  const lists = /averaging\.layout must be one of 'shared-stages', 'worker-per-replica'/;
  for (const layout of ['shared', 'Worker-Per-Replica', 42, null])
    await t.rejects(PipelineTrainer.create({ ...base, schedule: 'avgpipe', averaging: { layout: layout as never } }), { name: 'InvalidArgumentError', message: lists }, `layout ${String(layout)}`);
  await t.rejects(PipelineTrainer.create({ ...base, schedule: 'gpipe', averaging: { layout: 'shared-stages' } }), { name: 'InvalidArgumentError', message: /averaging is an option of the avgpipe schedule/ }, 'a layout outside avgpipe');
  await t.rejects(
    trainPipelineStage({ ...base, schedule: 'avgpipe', averaging: { layout: 'shared-stages' }, epochs: 1 }),
    { name: 'InvalidArgumentError', message: /launched processes run AvgPipe's pipelines in the 'worker-per-replica' layout/ },
    'launched processes: the shared stages are planned',
  );
});
