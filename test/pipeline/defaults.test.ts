/**
 * The pipeline runtime's defaults make each schedule what its name says: PipeDream-2BW at its
 * defaults keeps two weight versions and reads one-update-old weights (it once ran one batch per
 * round, which is 1F1B exactly), and trains to different weights than 1F1B from the same start.
 */
import t from 'tap';

import { PipelineTrainer, validateSchedule } from '../../dist/index.js';
import { planPipeline, TRAINER_OPTION_KEYS, type PipelineTrainerOptions } from '../../dist/pipeline/runtime/plan.js';
import { FEATURES, LAYERS, SEED, dataset, evenBoundaries } from './runtime-helpers.js';

const largestDifference = (a: Float32Array[], b: Float32Array[]): number =>
  Math.max(...a.map((part, j) => Math.max(...part.map((x, i) => Math.abs(x - b[j]![i]!)))));

const S = 2;
const base = (schedule: 'pipedream-2bw' | '1f1b', samples: number): PipelineTrainerOptions => {
  const { inputs, labels } = dataset(samples, 5);
  return {
    schedule,
    stages: S,
    microBatches: 2,
    microBatchSize: 2,
    model: { layers: LAYERS, seed: SEED, boundaries: evenBoundaries(LAYERS.length, S) },
    optimizer: { kind: 'sgd', lr: 0.05, momentum: 0.9 },
    data: { inputs, labels, features: FEATURES },
    shuffle: false,
  };
};

t.test('PipeDream-2BW at its defaults: two weight versions, stale reads, not 1F1B', async (t) => {
  const plan = await planPipeline(base('pipedream-2bw', 48), 'test', TRAINER_OPTION_KEYS);
  const analysis = validateSchedule(plan.schedule);
  t.same(analysis.weightVersions, new Array(S).fill(2), 'every stage keeps two weight versions');
  const reads = plan.schedule.actions.flat().filter((a) => a.kind === 'forward').map((a) => a.version);
  t.ok(reads.some((v) => v > 0), 'some forwards read a version other than the round start');
  const oneF1B = await planPipeline(base('1f1b', 48), 'test', TRAINER_OPTION_KEYS);
  t.same(validateSchedule(oneF1B.schedule).weightVersions, new Array(S).fill(1), '1F1B keeps one');

  // Trained over the same 48 samples (2BW: one round of 3 batches x 2 micro-batches x 2 samples, twice), the weights differ.
  const weightsAfter = async (options: PipelineTrainerOptions, rounds: number): Promise<Float32Array[]> => {
    const trainer = await PipelineTrainer.create(options);
    try {
      for (let r = 0; r < rounds; r++) await trainer.trainRound();
      return await trainer.weights();
    } finally {
      await trainer.dispose();
    }
  };
  const twoBW = await weightsAfter(base('pipedream-2bw', 48), 4);
  const flush = await weightsAfter(base('1f1b', 48), 12);
  const diff = largestDifference(twoBW, flush);
  t.ok(diff > 1e-6, `2BW's stale reads change the trajectory (largest difference ${diff.toExponential(2)})`);
});
