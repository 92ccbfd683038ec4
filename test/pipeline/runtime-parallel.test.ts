/**
 * Parallel pipelines coupled by data parallelism (PipelineTrainer's `pipelines` and
 * `dataParallel`): N pipelines of S stage workers each train on their own share of every round,
 * and each stage's N replicas combine their gradients with a DataParallelTrainer per part.
 *
 * - `sync` equals one pipeline on the concatenated batch, i.e. mini-batch training of the whole
 *   model on the N x M x b samples of each round (test/reference/pipeline.ts, double precision).
 * - The staleness-1 modes (`pipe-sgd`, `sapipe-dc`, `sapipe-wp`) equal the reference that applies
 *   each round's averaged gradient one round late, with the mode's compensation and prediction.
 *
 * Tolerance: 2e-6 absolute on every weight (weights are O(0.5)): the runtime sums micro-batch
 * gradients in fp32 in schedule order and averages the pipelines in fp32; the reference takes each
 * pipeline's gradient in one double pass. What remains is fp32 rounding (measured below 3e-7).
 */
import t from 'tap';

import { InvalidArgumentError, PipelineTrainer, type PipelineDataParallelOptions, type PipelineOptimizerSpec, type RuntimeScheduleName } from '../../dist/index.js';
import type { RefConfig } from '../reference/optimizer.js';
import { referenceParallelPipelines } from '../reference/pipeline.js';
import { FEATURES, LAYERS, SEED, dataset, evenBoundaries, initialPart, maxDiff, maxDiffToWhole, refConfig } from './runtime-helpers.js';

const TOLERANCE = 2e-6;
const ROUNDS = 10;
const M = 4;
const B = 3;
const optimizer: PipelineOptimizerSpec = { kind: 'sgd', lr: 0.1, momentum: 0.9 };

interface Case {
  schedule: RuntimeScheduleName;
  stages: number;
  pipelines: number;
  dataParallel: PipelineDataParallelOptions;
  /** The reference optimizer's compensation and prediction for the mode. */
  ref: Partial<RefConfig>;
}
const shadow = (n: number): RefConfig['prediction'] => ({ kind: 'shadow', estimate: 'prev-sync', compensate: false, n, localScale: 1 });
const cases: Case[] = [
  { schedule: 'gpipe', stages: 2, pipelines: 2, dataParallel: { mode: 'sync' }, ref: {} },
  { schedule: '1f1b', stages: 3, pipelines: 2, dataParallel: { mode: 'sync' }, ref: {} },
  { schedule: '1f1b', stages: 2, pipelines: 3, dataParallel: { mode: 'sync' }, ref: {} },
  { schedule: 'interleaved-1f1b', stages: 2, pipelines: 2, dataParallel: { mode: 'sync' }, ref: {} },
  { schedule: '1f1b', stages: 2, pipelines: 2, dataParallel: { mode: 'pipe-sgd' }, ref: {} },
  { schedule: '1f1b', stages: 2, pipelines: 2, dataParallel: { mode: 'sapipe-dc' }, ref: { compensation: { kind: 'adaptive', lambda: 10, eps: 1e-7 } } },
  { schedule: 'gpipe', stages: 2, pipelines: 2, dataParallel: { mode: 'sapipe-wp' }, ref: { prediction: shadow(2) } },
  { schedule: '1f1b', stages: 2, pipelines: 3, dataParallel: { mode: 'sapipe-wp' }, ref: { prediction: shadow(3) } },
  { schedule: '1f1b', stages: 2, pipelines: 2, dataParallel: { mode: 'sapipe-wp', overlapUpdate: false }, ref: { prediction: shadow(2) } },
];

for (const c of cases) {
  const dp = `${c.dataParallel.mode}${c.dataParallel.overlapUpdate === false ? ' (update at step())' : ''}`;
  t.test(`${c.pipelines} x ${c.schedule} on ${c.stages} stages, ${dp}, equals its reference`, async (t) => {
    const perRound = c.pipelines * M * B;
    const { inputs, labels } = dataset(ROUNDS * perRound);
    const rounds = Array.from({ length: ROUNDS }, (_, r) => Array.from({ length: perRound }, (_, i) => r * perRound + i));
    const staleness = c.dataParallel.mode === 'sync' ? 0 : 1;
    const want = referenceParallelPipelines(
      LAYERS,
      initialPart(0, LAYERS.length),
      { ...refConfig(optimizer), ...c.ref },
      { inputs, labels, features: FEATURES, batch: perRound },
      rounds,
      c.pipelines,
      staleness,
      c.dataParallel.mode === 'sapipe-wp',
    );
    const parts = c.schedule === 'interleaved-1f1b' ? 2 * c.stages : c.stages;
    const boundaries = evenBoundaries(LAYERS.length, parts);
    const trainer = await PipelineTrainer.create({
      schedule: c.schedule,
      stages: c.stages,
      microBatches: M,
      microBatchSize: B,
      pipelines: c.pipelines,
      dataParallel: c.dataParallel,
      model: { layers: LAYERS, seed: SEED, boundaries },
      optimizer,
      data: { inputs, labels, features: FEATURES },
      shuffle: false,
    });
    try {
      t.equal(trainer.pipelines, c.pipelines);
      for (let r = 0; r < ROUNDS; r++) {
        const report = await trainer.trainRound();
        t.equal(report.losses.length, c.pipelines * M, 'a loss per micro-batch of every pipeline');
      }
      const weights = await trainer.weights();
      const worst = maxDiffToWhole(weights, boundaries, want);
      t.ok(worst <= TOLERANCE, `largest weight difference ${worst.toExponential(2)} <= ${TOLERANCE}`);
      t.ok(maxDiff(initialPart(0, LAYERS.length), want) > 1e-2, 'the weights moved');
    } finally {
      await trainer.dispose();
    }
  });
}

t.test('configurations parallel pipelines cannot run are typed errors before any worker starts', async (t) => {
  const { inputs, labels } = dataset(64);
  const base = { stages: 2, microBatches: 4, microBatchSize: 2, model: { layers: LAYERS, seed: SEED }, optimizer, data: { inputs, labels, features: FEATURES } } as const;
  await t.rejects(PipelineTrainer.create({ ...base, schedule: 'pipedream', pipelines: 2 }), InvalidArgumentError, 'an asynchronous schedule');
  await t.rejects(PipelineTrainer.create({ ...base, schedule: '1f1b', pipelines: 0 }), InvalidArgumentError, 'no pipelines');
  await t.rejects(PipelineTrainer.create({ ...base, schedule: '1f1b', pipelines: 2, dataParallel: { mode: 'sapipe-wp', estimate: 'nope' as 'local' } }), InvalidArgumentError, 'a bad mode option');
  await t.rejects(PipelineTrainer.create({ ...base, schedule: '1f1b', pipelines: 2, dataParallel: { mode: 'sync', bucket: 1 } as PipelineDataParallelOptions }), InvalidArgumentError, 'an unknown key');
  await t.rejects(PipelineTrainer.create({ ...base, schedule: '1f1b', pipelines: 2, optimizer: { ...optimizer, compensation: {} } }), InvalidArgumentError, 'compensation on the optimizer');
  await t.rejects(PipelineTrainer.create({ ...base, schedule: '1f1b', pipelines: 9 }), InvalidArgumentError, 'more samples per round than the data set holds');
});
