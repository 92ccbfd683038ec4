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
 *
 * A small GPT with its per-token loss runs `sync`, `sapipe-dc` and `sapipe-wp` as 2 x 2 workers
 * against the same loops over the whole model's fp32 gradient (its own tolerances, below).
 */
import t from 'tap';

import { FlatBuffer, InvalidArgumentError, PipelineTrainer, Sequential, gptLayers, textWindows, tokenCrossEntropy, type PipelineDataParallelOptions, type PipelineOptimizerSpec, type RuntimeScheduleName } from '../../dist/index.js';
import type { RefConfig } from '../reference/optimizer.js';
import { referenceParallelPipelines, referenceParallelPipelinesOf } from '../reference/pipeline.js';
import { FEATURES, LAYERS, SEED, dataset, evenBoundaries, initialPart, maxDiff, maxDiffByName, maxDiffToWhole, refConfig } from './runtime-helpers.js';

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

// A GPT (gptLayers: embedding, 2 pre-LN blocks of width 32 and 2 heads, layer norm, head; the
// per-token cross-entropy over its 16 rows per sample) as 2 pipelines x 2 stages, on token windows
// of a synthetic 32-token text. The references above are MLP-only and in double, so the gradient
// here is the whole, uncut model's in fp32 (Sequential and tokenCrossEntropy, whose layers
// test/nn/gpt.test.ts checks against test/reference/gpt.ts, as the GPT case of
// runtime-loss.test.ts does), and the same loop applies it (referenceParallelPipelinesOf):
// - `sync` equals mini-batch training of the whole model on the union of the two pipelines'
//   samples, one gradient over all 2 x M x b windows a round;
// - the staleness-1 modes equal the whole model whose averaged gradient applies one round late,
//   with the mode's compensation (`sapipe-dc`) or with its forwards reading the shadow prediction
//   (`sapipe-wp`), as the MLP cases of those modes.
// Tolerances: 4e-6 absolute on every weight (the layer norms' gains are 1) and 1e-6 relative on
// every round's loss (the mean over both pipelines' micro-batches, at the weights the forwards
// read). Both sides are fp32 with different summation orders (the runtime sums micro-batch
// gradients and averages the pipelines; the reference takes one pass over each share), carried
// across rounds by momentum: measured below 5e-7 and 2e-8, while a reference of the wrong mode
// (no prediction, or staleness 1 for sync) misses by more than 0.1 on both.
const GPT = { vocab: 32, context: 16, dim: 32, heads: 2, layers: 2 } as const;
const GPT_ROUNDS = 8;
const GPT_TOLERANCE = 4e-6;
const GPT_LOSS_TOLERANCE = 1e-6;
const gptCases: { schedule: RuntimeScheduleName; dataParallel: PipelineDataParallelOptions; ref: Partial<RefConfig>; referencePipelines: number; staleness: 0 | 1 }[] = [
  { schedule: '1f1b', dataParallel: { mode: 'sync' }, ref: {}, referencePipelines: 1, staleness: 0 },
  { schedule: 'gpipe', dataParallel: { mode: 'sapipe-wp' }, ref: { prediction: shadow(2) }, referencePipelines: 2, staleness: 1 },
  { schedule: '1f1b', dataParallel: { mode: 'sapipe-dc' }, ref: { compensation: { kind: 'adaptive', lambda: 10, eps: 1e-7 } }, referencePipelines: 2, staleness: 1 },
];

/** A text of `length` tokens below GPT.vocab: mostly each token a fixed function of the one before, else random. */
function tokenText(length: number, seed = 13): Uint8Array {
  let s = seed >>> 0;
  const next = (): number => (s = (Math.imul(s, 1664525) + 1013904223) >>> 0) / 2 ** 32;
  const text = new Uint8Array(length);
  for (let i = 1; i < length; i++) text[i] = next() < 0.8 ? (text[i - 1]! * 5 + 3) % GPT.vocab : Math.floor(next() * GPT.vocab);
  return text;
}

for (const c of gptCases) {
  t.test(`a GPT as 2 x ${c.schedule} on 2 stages, ${c.dataParallel.mode}, equals the whole model trained on the same samples`, async (t) => {
    const [pipelines, m, b] = [2, 4, 2];
    const perRound = pipelines * m * b;
    const { inputs, labels: bytes } = textWindows(tokenText(GPT_ROUNDS * perRound * GPT.context + 1), GPT.context);
    const labels = Int32Array.from(bytes);
    const layers = gptLayers(GPT);
    const boundaries = [2]; // embedding and a block | a block, layer norm and head
    const rounds = Array.from({ length: GPT_ROUNDS }, (_, r) => Array.from({ length: perRound }, (_, i) => r * perRound + i));

    // The whole model's mean per-token loss over `samples` at `weights`, and its gradient.
    const whole = new Sequential(layers, { seed: SEED });
    const initial = whole.params.weights.array.slice();
    const gradient = (weights: Float32Array, samples: readonly number[]): { grad: Float32Array; loss: number } => {
      const n = samples.length;
      const [x, y, dlogits] = [n * GPT.context, n * GPT.context, n * GPT.context * GPT.vocab].map((size) => FlatBuffer.allocate(size)) as [FlatBuffer, FlatBuffer, FlatBuffer];
      try {
        samples.forEach((sample, r) => {
          x.array.set(inputs.subarray(sample * GPT.context, (sample + 1) * GPT.context), r * GPT.context);
          y.array.set(labels.subarray(sample * GPT.context, (sample + 1) * GPT.context), r * GPT.context);
        });
        whole.params.weights.array.set(weights);
        const loss = tokenCrossEntropy(whole.forward(0, x, n), y, n, GPT.context, GPT.vocab, dlogits);
        whole.backward(0, dlogits, { grads: whole.params.grads, inputGrad: false });
        return { grad: whole.params.grads.array.slice(), loss };
      } finally {
        for (const buffer of [x, y, dlogits]) buffer.dispose();
      }
    };
    let want: { weights: Float32Array; losses: number[] };
    try {
      want = referenceParallelPipelinesOf(initial, { ...refConfig(optimizer), ...c.ref }, rounds, c.referencePipelines, c.staleness, c.dataParallel.mode === 'sapipe-wp', gradient);
    } finally {
      whole.dispose();
    }

    const trainer = await PipelineTrainer.create({
      schedule: c.schedule,
      stages: 2,
      microBatches: m,
      microBatchSize: b,
      pipelines,
      dataParallel: c.dataParallel,
      model: { layers, seed: SEED, boundaries },
      optimizer,
      data: { inputs, labels, features: GPT.context },
      shuffle: false,
    });
    try {
      let worstLoss = 0;
      const losses: number[] = [];
      for (let r = 0; r < GPT_ROUNDS; r++) {
        const report = await trainer.trainRound();
        t.equal(report.losses.length, pipelines * m, 'a loss per micro-batch of every pipeline');
        losses.push(report.loss);
        worstLoss = Math.max(worstLoss, Math.abs(report.loss - want.losses[r]!) / want.losses[r]!);
      }
      t.ok(worstLoss <= GPT_LOSS_TOLERANCE, `every round's loss within ${GPT_LOSS_TOLERANCE} (relative) of the reference's (worst ${worstLoss.toExponential(2)}; ${want.losses[0]!.toFixed(4)} -> ${want.losses.at(-1)!.toFixed(4)})`);
      t.ok(losses.at(-1)! < losses[0]! - 0.3, `the loss falls by more than 0.3 nats: ${losses[0]!.toFixed(4)} -> ${losses.at(-1)!.toFixed(4)}`);
      const worst = maxDiffByName(layers, SEED, boundaries, await trainer.weights(), want.weights);
      t.ok(worst <= GPT_TOLERANCE, `every weight within ${GPT_TOLERANCE} of the reference's (worst ${worst.toExponential(2)}; largest weight ${want.weights.reduce((a, v) => Math.max(a, Math.abs(v)), 0).toFixed(2)})`);
      t.ok(want.weights.some((v, i) => Math.abs(v - initial[i]!) > 1e-2), 'the weights moved');
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
