/**
 * Wavelet tick-tock on the runtime, beyond its exactness (test/pipeline/runtime-sync.test.ts
 * checks its weights against mini-batch training): peak memory per worker, and the checks of
 * all-reduce actions before anything runs.
 *
 * Memory: the measured peak stored activations per stage equal the validator's figures for GPipe,
 * 1F1B and Wavelet at S = 4, M = 8; their bytes are the stored widths of the part times the count;
 * a Wavelet worker holds the whole model's weights, gradients and momentum.
 *
 * The data-parallel form (`form: 'data-parallel'`): over 10 rounds at S = 2 (SGD-momentum) and
 * S = 3 (Adam), M = 2, b = 2, the tick weights of worker 0 and every micro-batch's loss (both waves,
 * every worker) against test/reference/wavelet.ts (double precision, fp32 where the runtime's
 * buffers round the waves' average). Tolerance: 1e-5 absolute on the weights (O(0.5)), 1e-5
 * relative on the losses; the differences are float rounding of the passes and the sums.
 * Its memory: each wave holds one micro-batch at a time, and the worker runs each wave's backward
 * before the other wave's forward, so one wave's peak falls in the other's trough: the worker's
 * peak stored activations are one wave's, plain data parallelism's at the same micro-batch, and in
 * that memory each wave takes the whole micro-batch (twice plain's samples per worker iteration),
 * for a second replica's weights, gradients and optimizer state (measured: twice plain's).
 */
import t from 'tap';

import { InvalidArgumentError, LocalCommunicator, PipelineTrainer, Sequential, SGD, StageRunner, WAVELET_FORMS, createSchedule, generateSchedule, waveletMemory, type Action, type PipelineOptimizerSpec, type RuntimeScheduleName } from '../../dist/index.js';
import { referenceWaveletDataParallel } from '../reference/wavelet.js';
import { FEATURES, LAYERS, SEED, dataset, evenBoundaries, initialPart, maxDiff, partFromTrainer, refConfig } from './runtime-helpers.js';

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

const waveletDp = async (S: number, optimizer: PipelineOptimizerSpec, rounds: number, M = 2): Promise<{ weights: Float32Array; losses: number[][]; reports: Awaited<ReturnType<PipelineTrainer['trainRound']>>[] }> => {
  const perRound = 2 * S * M * B;
  const { inputs, labels } = dataset(rounds * perRound);
  const trainer = await PipelineTrainer.create({
    schedule: 'wavelet',
    form: 'data-parallel',
    stages: S,
    microBatches: M,
    microBatchSize: B,
    model: { layers: LAYERS, seed: SEED },
    optimizer,
    data: { inputs, labels, features: FEATURES },
    shuffle: false,
  });
  try {
    const reports = [];
    for (let r = 0; r < rounds; r++) reports.push(await trainer.trainRound());
    return { weights: (await trainer.weights())[0]!, losses: reports.map((r) => [...r.losses]), reports };
  } finally {
    await trainer.dispose();
  }
};

/** Each data-parallel run's first round, by S: the memory test reads its peaks. */
const firstRounds = new Map<number, Awaited<ReturnType<PipelineTrainer['trainRound']>>>();

t.test('data-parallel form: weights and losses as the reference over 10 rounds', async (t) => {
  const ROUNDS = 10;
  const M = 2;
  for (const [S, optimizer] of [
    [2, { kind: 'sgd', lr: 0.1, momentum: 0.9 }],
    [3, { kind: 'adam', lr: 0.01 }],
  ] as const) {
    const run = await waveletDp(S, optimizer, ROUNDS, M);
    firstRounds.set(S, run.reports[0]!);
    const perRound = 2 * S * M * B;
    const { inputs, labels } = dataset(ROUNDS * perRound);
    const rounds = Array.from({ length: ROUNDS }, (_, r) => Array.from({ length: perRound }, (_, i) => r * perRound + i));
    const initial = initialPart(0, LAYERS.length);
    const ref = referenceWaveletDataParallel(LAYERS, initial, refConfig(optimizer), { inputs, labels, features: FEATURES, batch: B }, rounds, S, M);
    const dw = maxDiff(partFromTrainer(0, LAYERS.length, run.weights), ref.tick);
    t.ok(dw < 1e-5, `S = ${S}, ${optimizer.kind}: tick weights within 1e-5 of the reference (worst ${dw.toExponential(2)})`);
    t.ok(maxDiff(ref.tick, ref.tock) > 1e-3, `S = ${S}: the waves' models differ (the test can tell tick from tock)`);
    let dl = 0;
    run.losses.forEach((row, r) => {
      t.equal(row.length, 2 * S * M, 'a loss per micro-batch of both waves of every worker');
      row.forEach((l, i) => (dl = Math.max(dl, Math.abs(l - ref.losses[r]![i]!) / Math.abs(ref.losses[r]![i]!))));
    });
    t.ok(dl < 1e-5, `S = ${S}: every loss (tick and tock, every worker, 10 rounds) within 1e-5 relative (worst ${dl.toExponential(2)})`);
    // The runtime's losses fall: it trains.
    t.ok(run.losses.at(-1)!.reduce((a, b) => a + b, 0) < run.losses[0]!.reduce((a, b) => a + b, 0), 'the loss falls');
  }
});

t.test('data-parallel form: each wave\'s and the worker\'s peak stored activations, against plain data parallelism', async (t) => {
  const { inputs, labels } = dataset(4 * B);
  const plain = await PipelineTrainer.create({ schedule: 'gpipe', stages: 1, microBatches: 1, microBatchSize: B, model: { layers: LAYERS, seed: SEED }, optimizer, data: { inputs, labels, features: FEATURES } });
  let plainBytes: number;
  let plainModelBytes: number;
  try {
    const r = await plain.trainRound();
    plainBytes = r.peakActivationBytes[0]!;
    plainModelBytes = r.modelBytes[0]!;
  } finally {
    await plain.dispose();
  }
  for (const [S, r] of firstRounds) {
    t.ok(r.replicaPeaks, `S = ${S}: the report has each replica's peaks`);
    for (let x = 0; x < S; x++) {
      const [tick, tock] = r.replicaPeaks![x]!;
      t.same([tick!.pipeline, tock!.pipeline], [2 * x, 2 * x + 1], `worker ${x}: its tick and tock replicas`);
      t.same([tick!.peakActivations, tock!.peakActivations], [1, 1], `worker ${x}: each wave holds one micro-batch at a time`);
      t.equal(tick!.peakActivationBytes, plainBytes, 'a wave\'s peak is plain data parallelism\'s (one replica\'s forward of b samples)');
      t.equal(tock!.peakActivationBytes, plainBytes, 'the tock\'s too');
      // tock B(t-1) runs before tick F(t), tick B(t) before tock F(t): one wave's peak is the other's trough.
      t.equal(r.peakActivations[x], 1, `worker ${x}: never holds both waves' micro-batches at once`);
      t.equal(r.peakActivationBytes[x], plainBytes, 'the worker\'s peak is one wave\'s: plain data parallelism\'s');
      const m = waveletMemory({ waves: [tick!.peakActivationBytes, tock!.peakActivationBytes], worker: r.peakActivationBytes[x]!, plain: plainBytes, microBatchSize: B });
      t.same([m.overlap, m.ratio, m.sameMemoryMicroBatch], [0.5, 1, B], 'in plain data parallelism\'s memory each wave takes the whole micro-batch: 2b samples per worker iteration');
      // (the S = 2 run steps with SGD-momentum, as plain does; the S = 3 run's Adam keeps more state)
      if (S === 2) t.equal(r.modelBytes[x], 2 * plainModelBytes, 'the price: two replicas\' weights, gradients and optimizer state');
    }
  }
  t.same([...firstRounds.keys()], [2, 3], 'both runs measured');
});

t.test('waveletMemory: the batch that fits from measured peaks; typed errors', async (t) => {
  // Waves whose peaks fall in each other's troughs (a layer-interleaved run): 1.2x one wave.
  const m = waveletMemory({ waves: [1000, 1000], worker: 1200, plain: 1000, microBatchSize: 12 });
  t.same([m.overlap, m.ratio, m.sameMemoryMicroBatch], [0.6, 1.2, 10], 'worker 1.2x plain: a wave of 10 fits, 20 samples per worker iteration against 12');
  t.throws(() => waveletMemory({ waves: [1000, 1000], worker: 2001, plain: 1000, microBatchSize: 2 }), InvalidArgumentError, 'a worker peak above tick + tock');
  t.throws(() => waveletMemory({ waves: [1000], worker: 1000, plain: 1000, microBatchSize: 2 } as never), InvalidArgumentError, 'one wave');
  t.throws(() => waveletMemory({ waves: [1000, 1000], worker: 1500, plain: 0, microBatchSize: 2 }), InvalidArgumentError, 'no plain peak');
});

t.test('the form option: one list, typed errors', async (t) => {
  t.same([...WAVELET_FORMS], ['data-parallel', 'model-parallel']);
  const { inputs, labels } = dataset(64);
  const base = { schedule: 'wavelet' as const, stages: 2, microBatches: 2, microBatchSize: B, model: { layers: LAYERS, seed: SEED }, optimizer, data: { inputs, labels, features: FEATURES } };
  await t.rejects(PipelineTrainer.create({ ...base, form: 'tick-tock' as never }), { name: 'InvalidArgumentError', message: /form must be one of 'data-parallel', 'model-parallel'/ }, 'an unknown form');
  await t.rejects(PipelineTrainer.create({ ...base, form: 3 as never }), InvalidArgumentError, 'a form that is not a string');
  await t.rejects(PipelineTrainer.create({ ...base, schedule: 'gpipe', form: 'data-parallel' }), { name: 'InvalidArgumentError', message: /form is an option of the wavelet schedule/ }, 'form on another schedule');
  await t.rejects(PipelineTrainer.create({ ...base, form: 'data-parallel', pipelines: 3 }), { name: 'InvalidArgumentError', message: /one data-parallel worker per row/ }, 'pipelines beside the data-parallel form');
  await t.rejects(PipelineTrainer.create({ ...base, form: 'data-parallel', dataParallel: { mode: 'sync' } }), { name: 'InvalidArgumentError', message: /leave out dataParallel/ }, 'dataParallel beside the data-parallel form');
  await t.rejects(PipelineTrainer.create({ ...base, form: 'data-parallel', data: { inputs: inputs.subarray(0, 15 * FEATURES), labels: labels.subarray(0, 15), features: FEATURES } }), { name: 'InvalidArgumentError', message: /2 workers x 2 waves x 2 micro-batches x 2 samples = 16/ }, 'a data set smaller than a round of both waves');
  t.throws(() => generateSchedule('wavelet', { stages: 2, microBatches: 2, form: 'x' as never }), InvalidArgumentError, 'the generator refuses it too');
  // (The default, model-parallel, is the registry's generatorOptions: test/pipeline/registry.test.ts.)
});
