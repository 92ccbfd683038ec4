/**
 * AvgPipe on the runtime: N pipelines of S stage workers, each with advance forward propagation
 * on its own share of every round, each stage's replicas averaged with their center (elastic
 * averaging: the fused kernel and one all-reduce of the differences per exchange).
 *
 * - The center after 20 rounds (20 or 10 exchanges) equals test/reference/pipeline.ts's
 *   referenceAvgPipe, N models stepped on their own samples and averaged in double, for N = 2 and
 *   3. Tolerance 2e-6 absolute (weights O(0.5)): fp32 accumulation and fp32 averaging, measured
 *   below 5e-7.
 * - Stored activations per stage at S = 4, M = 8, A = 3: 7, 5, 3, 1 per pipeline worker, the
 *   validator's per-device figures (14, 10, 6, 2 for two pipelines sharing a device) over N.
 */
import t from 'tap';

import { InvalidArgumentError, PipelineTrainer, type PipelineOptimizerSpec } from '../../dist/index.js';
import { referenceAvgPipe } from '../reference/pipeline.js';
import { FEATURES, LAYERS, SEED, dataset, evenBoundaries, initialPart, maxDiff, maxDiffToWhole, refConfig } from './runtime-helpers.js';

const TOLERANCE = 2e-6;
const ROUNDS = 20;
const optimizer: PipelineOptimizerSpec = { kind: 'sgd', lr: 0.1, momentum: 0.9 };

for (const { pipelines, stages, every, alpha } of [
  { pipelines: 2, stages: 2, every: 1, alpha: undefined },
  { pipelines: 3, stages: 2, every: 1, alpha: undefined },
  { pipelines: 2, stages: 3, every: 2, alpha: 0.3 },
]) {
  t.test(`avgpipe, ${pipelines} pipelines x ${stages} stages, averaging every ${every} round(s): the center equals the reference`, async (t) => {
    const M = 4;
    const B = 3;
    const perRound = pipelines * M * B;
    const { inputs, labels } = dataset(ROUNDS * perRound);
    const rounds = Array.from({ length: ROUNDS }, (_, r) => Array.from({ length: perRound }, (_, i) => r * perRound + i));
    const a = alpha ?? 0.9 / pipelines;
    const want = referenceAvgPipe(LAYERS, initialPart(0, LAYERS.length), refConfig(optimizer), { inputs, labels, features: FEATURES, batch: perRound }, rounds, pipelines, a, every);
    const boundaries = evenBoundaries(LAYERS.length, stages);
    const trainer = await PipelineTrainer.create({
      schedule: 'avgpipe',
      stages,
      microBatches: M,
      microBatchSize: B,
      pipelines,
      averaging: { every, ...(alpha === undefined ? {} : { alpha }) },
      model: { layers: LAYERS, seed: SEED, boundaries },
      optimizer,
      data: { inputs, labels, features: FEATURES },
      shuffle: false,
    });
    try {
      for (let r = 0; r < ROUNDS; r++) t.equal((await trainer.trainRound()).losses.length, pipelines * M, 'a loss per micro-batch of every pipeline');
      const worst = maxDiffToWhole(await trainer.weights(), boundaries, want);
      t.ok(worst <= TOLERANCE, `largest difference of the center ${worst.toExponential(2)} <= ${TOLERANCE}`);
      t.ok(maxDiff(initialPart(0, LAYERS.length), want) > 1e-2, 'the weights moved');
    } finally {
      await trainer.dispose();
    }
  });
}

t.test('advance forward propagation at S = 4, M = 8, A = 3: the stored activations the validator gives', async (t) => {
  const { inputs, labels } = dataset(2 * 8 * 2 * 3);
  const trainer = await PipelineTrainer.create({
    schedule: 'avgpipe',
    stages: 4,
    microBatches: 8,
    microBatchSize: 2,
    pipelines: 2,
    advance: 3,
    model: { layers: LAYERS, seed: SEED, boundaries: evenBoundaries(LAYERS.length, 4) },
    optimizer,
    data: { inputs, labels, features: FEATURES },
  });
  try {
    const report = await trainer.trainRound();
    t.same(report.peakActivations, [7, 5, 3, 1], 'measured per pipeline worker: 7, 5, 3, 1');
    t.same(trainer.analysis.peakActivations, [14, 10, 6, 2], 'the validator, per device shared by the 2 pipelines');
  } finally {
    await trainer.dispose();
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
