/**
 * The check of test/pipeline/runtime-sapipe*.test.ts: PipelineTrainer running the sapipe schedule
 * on W data-parallel workers against W DataParallelTrainers in the same mode trained directly on
 * the same shards from the same seed (test/fixtures/pipeline/sapipe-dp-rank.ts: one step() per
 * iteration, a flush() at each round's end, as the schedule's last optimizerStep does), after 20
 * iterations (2 rounds of M = 10).
 *
 * Tolerance: 1e-6 absolute on every weight (weights are O(0.5)). Both sides run the same kernels
 * on the same gradients in the same order, so the weights agree bit for bit in practice (measured
 * difference 0); the tolerance only leaves room for a different reduction order.
 */
import type { Test } from 'tap';

import { PipelineTrainer, Sequential, spawnLocalRanks, type PipelineDataParallelOptions, type PipelineOptimizerSpec } from '../../dist/index.js';
import { FEATURES, LAYERS, SEED, dataset } from './runtime-helpers.js';

export const TOLERANCE = 1e-6;
export const M = 10;
export const ROUNDS = 2;
export const B = 4;
const FIXTURE = new URL('../fixtures/pipeline/sapipe-dp-rank.ts', import.meta.url);

export const { inputs, labels } = dataset(3 * ROUNDS * M * B);

/** The reference: W DataParallelTrainers on the shards PipelineTrainer's workers take, pipeline 0's weights. */
export async function reference(workers: number, optimizer: PipelineOptimizerSpec, dataParallel: PipelineDataParallelOptions): Promise<Float32Array> {
  const ranks = spawnLocalRanks(FIXTURE, workers, {
    workerData: { layers: LAYERS, seed: SEED, inputs, labels, features: FEATURES, batch: B, iterations: M, rounds: ROUNDS, trainer: { optimizer, ...dataParallel } },
  });
  try {
    const replies = await Promise.all(
      ranks.map(
        (w) =>
          new Promise<{ weights?: Float32Array; error?: string }>((resolve, reject) => {
            w.once('message', resolve);
            w.once('error', reject);
          }),
      ),
    );
    for (const r of replies) if (r.error !== undefined) throw new Error(r.error);
    return replies[0]!.weights!;
  } finally {
    await Promise.all(ranks.map((w) => w.terminate()));
  }
}

export const maxAbsDiff = (a: Float32Array, b: Float32Array): number => a.reduce((m, v, i) => Math.max(m, Math.abs(v - b[i]!)), 0);

export interface SapipeCase {
  workers: number;
  optimizer: PipelineOptimizerSpec;
  dataParallel: PipelineDataParallelOptions;
}
/** The name of a case's test. */
export const caseName = (c: SapipeCase): string => `sapipe on ${c.workers} workers, ${c.optimizer.kind}, ${JSON.stringify(c.dataParallel)}: equals the DataParallelTrainer`;

/** Runs a case: trains both ways and compares. */
export async function checkCase(t: Test, c: SapipeCase): Promise<void> {
  {
    // The reference trains meanwhile, on threads of its own.
    const expecting = reference(c.workers, c.optimizer, c.dataParallel);
    expecting.catch(() => undefined);
    const trainer = await PipelineTrainer.create({
      schedule: 'sapipe',
      stages: c.workers,
      microBatches: M,
      microBatchSize: B,
      model: { layers: LAYERS, seed: SEED, boundaries: [] },
      optimizer: c.optimizer,
      data: { inputs, labels, features: FEATURES },
      shuffle: false,
      dataParallel: c.dataParallel,
    });
    try {
      t.equal(trainer.pipelines, c.workers, 'one data-parallel worker per row');
      t.equal(trainer.schedule.parts, 1, 'every worker holds the whole model');
      let last;
      for (let r = 0; r < ROUNDS; r++) last = await trainer.trainRound();
      t.equal(last!.losses.length, c.workers * M, 'a loss per iteration of every worker');
      t.ok(last!.losses.every(Number.isFinite));
      t.equal(last!.timeline.length, c.workers, 'a measured timeline row per worker');
      t.same(
        last!.timeline.map((row) => row.length),
        trainer.schedule.actions.map((row) => row.length),
        'every action of every row measured',
      );
      t.equal(last!.skippedSteps, 0);
      const [weights] = await trainer.weights();
      const expected = await expecting;
      const diff = maxAbsDiff(weights!, expected);
      t.ok(diff <= TOLERANCE, `max |w - w_dp| = ${diff.toExponential(2)} <= ${TOLERANCE}`);
      const initial = new Sequential(LAYERS, { seed: SEED });
      t.ok(maxAbsDiff(weights!, initial.params.weights.array) > 1e-3, 'it trained');
      initial.dispose();
    } finally {
      await trainer.dispose();
    }
  }
}
