/**
 * Synchronous schedules are exact: GPipe, 1F1B, interleaved 1F1B, ZB-H1 and Wavelet (its
 * model-parallel form: every stage holds every part, each part's gradients all-reduced over the
 * stages, one step per round) on 2, 3 and 4 stage workers end, after 10 batches, with the weights
 * of single-process mini-batch training of the unpartitioned model on the same batches
 * (test/reference/pipeline.ts, double precision). Wavelet also with M not a multiple of S, where
 * stages run different numbers of micro-batches of a part, and some none.
 *
 * Tolerance: 1e-6 absolute on every weight (weights are O(0.5)). The runtime accumulates the
 * micro-batch gradients in fp32 in schedule order (GPipe backwards in reverse), the reference
 * takes each batch's gradient in one double pass; what remains is fp32 rounding (measured
 * at most 1.2e-7).
 */
import t from 'tap';

import { PipelineTrainer, type PipelineOptimizerSpec, type RuntimeScheduleName } from '../../dist/index.js';
import { referenceMiniBatch } from '../reference/pipeline.js';
import { FEATURES, LAYERS, SEED, dataset, evenBoundaries, initialPart, maxDiff, maxDiffToWhole, refConfig } from './runtime-helpers.js';

const TOLERANCE = 1e-6;
const BATCHES = 10;
// M is a multiple of 2, 3 and 4 (interleaved 1F1B needs a multiple of the stages).
const M = 12;
const B = 2;
const optimizer: PipelineOptimizerSpec = { kind: 'sgd', lr: 0.1, momentum: 0.9 };

const cases: { schedule: RuntimeScheduleName; stages: number; parts: number; microBatches?: number }[] = [];
for (const stages of [2, 3, 4]) {
  cases.push({ schedule: 'gpipe', stages, parts: stages }, { schedule: '1f1b', stages, parts: stages }, { schedule: 'zb-h1', stages, parts: stages });
  cases.push({ schedule: 'interleaved-1f1b', stages, parts: 2 * stages }, { schedule: 'wavelet', stages, parts: stages });
}
cases.push({ schedule: 'wavelet', stages: 4, parts: 4, microBatches: 6 }, { schedule: 'wavelet', stages: 4, parts: 4, microBatches: 3 });

const { inputs, labels } = dataset(BATCHES * M * B);
/** Mini-batch training on batches of m micro-batches, once per m. */
const wholes = new Map<number, ReturnType<typeof referenceMiniBatch>>();
const whole = (m: number): ReturnType<typeof referenceMiniBatch> => {
  if (!wholes.has(m)) {
    const batches = Array.from({ length: BATCHES }, (_, r) => Array.from({ length: m * B }, (_, i) => r * m * B + i));
    wholes.set(m, referenceMiniBatch(LAYERS, initialPart(0, LAYERS.length), refConfig(optimizer), { inputs, labels, features: FEATURES, batch: m * B }, batches));
  }
  return wholes.get(m)!;
};

for (const c of cases) {
  const m = c.microBatches ?? M;
  t.test(`${c.schedule} on ${c.stages} stages (${c.parts} parts), M = ${m}, equals mini-batch training`, async (t) => {
    const boundaries = evenBoundaries(LAYERS.length, c.parts);
    const trainer = await PipelineTrainer.create({
      schedule: c.schedule,
      stages: c.stages,
      microBatches: m,
      microBatchSize: B,
      model: { layers: LAYERS, seed: SEED, boundaries },
      optimizer,
      data: { inputs, labels, features: FEATURES },
      shuffle: false,
    });
    try {
      t.equal(trainer.schedule.parts, c.parts);
      for (let r = 0; r < BATCHES; r++) {
        const report = await trainer.trainRound();
        t.equal(report.losses.length, m, 'a loss per micro-batch');
      }
      const weights = await trainer.weights();
      const worst = maxDiffToWhole(weights, boundaries, whole(m));
      t.ok(worst <= TOLERANCE, `largest weight difference ${worst.toExponential(2)} <= ${TOLERANCE}`);
      t.ok(maxDiff(initialPart(0, LAYERS.length), whole(m)) > 1e-2, 'the weights moved');
    } finally {
      await trainer.dispose();
    }
  });
}
