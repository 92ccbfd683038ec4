/**
 * Wavelet tick-tock on the runtime, beyond its exactness (test/pipeline/runtime-sync.test.ts
 * checks its weights against mini-batch training): peak memory per worker, and the checks of
 * all-reduce actions before anything runs.
 *
 * Memory: the measured peak stored activations per stage equal the validator's figures for GPipe,
 * 1F1B and Wavelet at S = 4, M = 8; their bytes are the stored widths of the part times the count;
 * a Wavelet worker holds the whole model's weights, gradients and momentum.
 */
import t from 'tap';

import { LocalCommunicator, PipelineTrainer, Sequential, SGD, StageRunner, createSchedule, generateSchedule, type Action, type PipelineOptimizerSpec, type RuntimeScheduleName } from '../../dist/index.js';
import { FEATURES, LAYERS, SEED, dataset, evenBoundaries } from './runtime-helpers.js';

const B = 2;
const optimizer: PipelineOptimizerSpec = { kind: 'sgd', lr: 0.1, momentum: 0.9 };

t.test('peak memory per worker: stored activations as the validator says, bytes as the parts store them', async (t) => {
  const S = 4;
  const M = 8;
  const boundaries = [2, 4, 6]; // Linear+ReLU per part, the last part Linear, ReLU, Linear
  const widths = [FEATURES, 16, 16, 16, 16, 16, 16, 16, 16, 5]; // input of every layer, then the output
  const stored = (start: number, end: number): number => widths.slice(start, end + 1).reduce((a, b) => a + b, 0) * B * 4;
  const partRanges = [[0, 2], [2, 4], [4, 6], [6, 9]] as const;
  const { inputs, labels } = dataset(2 * M * B);
  const measured = new Map<RuntimeScheduleName, { counts: readonly number[]; bytes: readonly number[]; model: readonly number[] }>();
  for (const schedule of ['gpipe', '1f1b', 'wavelet'] as const) {
    const trainer = await PipelineTrainer.create({
      schedule,
      stages: S,
      microBatches: M,
      microBatchSize: B,
      model: { layers: LAYERS, seed: SEED, boundaries },
      optimizer,
      data: { inputs, labels, features: FEATURES },
    });
    try {
      await trainer.trainRound();
      const r = await trainer.trainRound();
      t.same(r.peakActivations, trainer.analysis.peakActivations, `${schedule}: measured stored micro-batches per stage are the validator's (${r.peakActivations.join(', ')})`);
      measured.set(schedule, { counts: r.peakActivations, bytes: r.peakActivationBytes, model: r.modelBytes });
      t.same(r.peakStashedBytes, [0, 0, 0, 0], `${schedule}: nothing stashed`);
    } finally {
      await trainer.dispose();
    }
  }
  const params = (start: number, end: number): number => {
    const part = new Sequential(LAYERS, { seed: SEED, range: [start, end] });
    const n = part.params.length;
    part.dispose();
    return n;
  };
  for (const schedule of ['gpipe', '1f1b'] as const) {
    const m = measured.get(schedule)!;
    t.same(m.bytes, m.counts.map((c, k) => c * stored(partRanges[k]![0], partRanges[k]![1])), `${schedule}: bytes = count x the part's stored widths`);
    // Weights, gradients and SGD's momentum of the stage's one part.
    t.same(m.model, partRanges.map(([s, e]) => 3 * 4 * params(s, e)), `${schedule}: model bytes = 3 copies of the part`);
  }
  const w = measured.get('wavelet')!;
  t.same(w.counts, [4, 4, 4, 4], 'wavelet: the same activations on every worker');
  t.ok(Math.max(...w.bytes) < Math.max(...measured.get('gpipe')!.bytes), 'wavelet: less peak activation memory than GPipe on its busiest stage');
  t.same(w.model, [0, 1, 2, 3].map(() => partRanges.reduce((n, [s, e]) => n + 3 * 4 * params(s, e), 0)), 'wavelet: every worker holds the whole model (3 copies)');
});

t.test('all-reduces are checked before anything runs: the same reductions in the same order on every stage, over the pipeline\'s communicator', async (t) => {
  const S = 2;
  const good = generateSchedule('wavelet', { stages: S, microBatches: 2, form: 'model-parallel' });
  const comms = await Promise.all(Array.from({ length: S }, (_, rank) => LocalCommunicator.create({ group: `wavelet-check-${process.pid}`, rank, size: S, timeoutMs: 5_000 })));
  const models = Array.from({ length: S }, (_, j) => Sequential.part(LAYERS, evenBoundaries(LAYERS.length, S), j, { seed: SEED }));
  const parts = models.map((model, part) => ({ part, model, optimizer: new SGD(model.params, { lr: 0.1 }), backwardPredictionRatio: 0 }));
  try {
    t.doesNotThrow(() => new StageRunner(0, good, comms[0], parts).dispose(), 'the generated schedule runs');
    t.throws(() => new StageRunner(0, good, undefined, parts), { code: 'ERR_INVALID_SCHEDULE', message: /communicator/ }, 'no communicator');
    // Stage 1 reduces its parts in the other order: the collectives would pair part 0 with part 1.
    const swapped = good.actions.map((row, s) => {
      if (s !== 1) return row;
      const reduces = row.filter((a) => a.kind === 'allReduce');
      let i = reduces.length;
      return row.map((a): Action => (a.kind === 'allReduce' ? reduces[--i]! : a));
    });
    const bad = createSchedule({ ...good, actions: swapped });
    t.throws(() => new StageRunner(0, bad, comms[0], parts), { code: 'ERR_INVALID_SCHEDULE', message: /same reductions in the same order/ });
  } finally {
    for (const p of parts) {
      p.optimizer.dispose();
      p.model.dispose();
    }
    for (const c of comms) c.destroy();
  }
});
