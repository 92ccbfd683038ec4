/**
 * The runtime's losses besides one class per sample: mean squared error against real targets, and
 * the cross-entropy over P rows of classes per sample (a language model's per-token loss, each
 * sample's P next tokens). GPipe and 1F1B on 2 and 3 stages end, after 8 batches, with the weights
 * of single-process mini-batch training of the whole model on the same batches
 * (test/reference/pipeline.ts, double), to 1e-6 absolute as test/pipeline/runtime-sync.test.ts.
 * Shapes that do not fit the loss are refused, typed, before any stage starts.
 */
import t from 'tap';

import { FlatBuffer, InvalidArgumentError, PipelineTrainer, SGD, Sequential, SizeMismatchError, gptLayers, mlpLayers, tokenCrossEntropy, type LayerSpec, type PipelineOptimizerSpec } from '../../dist/index.js';
import { refForward, refLoss, refMse, referenceMiniBatch, type RefPartWeights } from '../reference/pipeline.js';
import { FEATURES, evenBoundaries, maxDiffByName, refConfig } from './runtime-helpers.js';

const TOLERANCE = 1e-6;
const BATCHES = 8;
const M = 6;
const B = 3;
const SEED = 11;
const optimizer: PipelineOptimizerSpec = { kind: 'sgd', lr: 0.1, momentum: 0.9 };

/** The whole model's initial weights per layer, as the library draws them. */
function initial(layers: LayerSpec[]): RefPartWeights {
  const model = new Sequential(layers, { seed: SEED });
  try {
    return layers.map((l, i) => (l.kind === 'linear' ? { w: model.params.view(model.params.weights, `layer${i}.weight`).slice(), b: model.params.view(model.params.weights, `layer${i}.bias`).slice() } : null));
  } finally {
    model.dispose();
  }
}

function random(seed: number): () => number {
  let s = seed >>> 0;
  return () => (s = (Math.imul(s, 1664525) + 1013904223) >>> 0) / 2 ** 32;
}

const samples = BATCHES * M * B;
const next = random(5);
const inputs = Float32Array.from({ length: samples * FEATURES }, () => next() * 2 - 1);

interface LossCase {
  name: string;
  layers: LayerSpec[];
  loss: 'cross-entropy' | 'mse';
  labels: Float32Array | Int32Array;
  per: number;
}
// Regression: 4 real targets per sample, a smooth function of the inputs.
const mse: LossCase = {
  name: 'mse',
  layers: mlpLayers([FEATURES, 16, 16, 4]),
  loss: 'mse',
  labels: Float32Array.from({ length: samples * 4 }, (_, i) => Math.sin(inputs[Math.floor(i / 4) * FEATURES + (i % 4)]! * 2)),
  per: 4,
};
// A language model's loss: 3 rows of 5 classes per sample (15 outputs), 3 class indices per sample.
const tokens: LossCase = {
  name: 'cross-entropy over 3 rows per sample',
  layers: mlpLayers([FEATURES, 16, 16, 15]),
  loss: 'cross-entropy',
  labels: Int32Array.from({ length: samples * 3 }, (_, i) => (inputs[Math.floor(i / 3) * FEATURES + (i % 3)]! > 0 ? 2 : 0) + (i % 3 === 1 ? 1 : 0)),
  per: 3,
};

for (const c of [mse, tokens])
  for (const schedule of ['gpipe', '1f1b'] as const)
    for (const stages of [2, 3]) {
      t.test(`${c.name}: ${schedule} on ${stages} stages equals mini-batch training`, async (t) => {
        const batches = Array.from({ length: BATCHES }, (_, r) => Array.from({ length: M * B }, (_, i) => r * M * B + i));
        const ref = referenceMiniBatch(c.layers, initial(c.layers), refConfig(optimizer), { inputs, labels: c.labels, features: FEATURES, batch: M * B, loss: c.loss, targetsPerSample: c.per }, batches);
        const boundaries = evenBoundaries(c.layers.length, stages);
        const trainer = await PipelineTrainer.create({
          schedule,
          stages,
          microBatches: M,
          microBatchSize: B,
          model: { layers: c.layers, seed: SEED, boundaries },
          optimizer,
          data: { inputs, labels: c.labels, features: FEATURES },
          loss: c.loss,
          shuffle: false,
        });
        try {
          const losses: number[] = [];
          for (let r = 0; r < BATCHES; r++) losses.push((await trainer.trainRound()).loss);
          t.ok(losses[BATCHES - 1]! < losses[0]!, `the loss falls: ${losses[0]!.toFixed(4)} -> ${losses[BATCHES - 1]!.toFixed(4)}`);
          const parts = await trainer.weights();
          // Flatten the trainer's parts into per-layer weights, as the reference holds them.
          const edges = [0, ...boundaries, c.layers.length];
          let worst = 0;
          parts.forEach((flat, j) => {
            const part = new Sequential(c.layers, { seed: SEED, range: [edges[j]!, edges[j + 1]!] });
            try {
              part.params.weights.array.set(flat);
              for (let i = edges[j]!; i < edges[j + 1]!; i++) {
                const r = ref[i];
                if (!r) continue;
                const w = part.params.view(part.params.weights, `layer${i}.weight`);
                const b = part.params.view(part.params.weights, `layer${i}.bias`);
                w.forEach((v, k) => (worst = Math.max(worst, Math.abs(v - r.w[k]!))));
                b.forEach((v, k) => (worst = Math.max(worst, Math.abs(v - r.b[k]!))));
              }
            } finally {
              part.dispose();
            }
          });
          t.ok(worst <= TOLERANCE, `largest weight difference ${worst.toExponential(2)} <= ${TOLERANCE}`);
          // The validation loss of the trained model against the reference's loss at its weights, in double.
          const x = Float64Array.from(inputs);
          const out = refForward(c.layers, ref, x, samples).outputs.at(-1)!;
          const expected = c.loss === 'mse' ? refMse(out, c.labels).loss : refLoss(out, c.labels, samples * c.per, (c.layers.at(-1) as { out: number }).out / c.per).loss;
          const got = await trainer.evaluateLoss(inputs, c.labels);
          t.ok(Math.abs(got - expected) <= 1e-5 * (1 + expected), `evaluateLoss ${got.toFixed(6)} = the reference's ${expected.toFixed(6)}`);
          if (c.loss === 'cross-entropy') {
            const accuracy = await trainer.evaluate(inputs, c.labels);
            t.ok(accuracy > 0.4 && accuracy <= 1, `evaluate scores every row: ${accuracy.toFixed(3)}`);
            t.same(await trainer.evaluateAccuracyAndLoss(inputs, c.labels), { accuracy, loss: got }, 'both from one pass: the same figures to the bit');
          } else {
            await t.rejects(trainer.evaluate(inputs, c.labels), InvalidArgumentError, 'no accuracy for a regression');
            await t.rejects(trainer.evaluateAccuracyAndLoss(inputs, c.labels), InvalidArgumentError, 'nor both');
          }
        } finally {
          await trainer.dispose();
        }
      });
    }

t.test('targets that do not fit the loss are refused before any stage starts, typed', async (t) => {
  const base = { schedule: 'gpipe' as const, stages: 2, microBatches: 2, microBatchSize: 2, optimizer, model: { layers: mse.layers, boundaries: [2] } };
  // mse: 4 outputs, 3 targets per sample.
  await t.rejects(PipelineTrainer.create({ ...base, loss: 'mse', data: { inputs, labels: new Float32Array(samples * 3), features: FEATURES } }), SizeMismatchError);
  await t.rejects(PipelineTrainer.create({ ...base, loss: 'mse', data: { inputs, labels: Float32Array.from({ length: samples * 4 }, (_, i) => (i === 7 ? NaN : 0)), features: FEATURES } }), InvalidArgumentError);
  // Cross-entropy: 3 rows do not divide 4 outputs; a label past its row's classes.
  await t.rejects(PipelineTrainer.create({ ...base, data: { inputs, labels: new Int32Array(samples * 3), features: FEATURES } }), SizeMismatchError);
  await t.rejects(PipelineTrainer.create({ ...base, data: { inputs, labels: Int32Array.from({ length: samples * 2 }, (_, i) => (i === 5 ? 2 : 0)), features: FEATURES } }), InvalidArgumentError);
  // Targets that are not a whole number per sample, and an unknown loss.
  await t.rejects(PipelineTrainer.create({ ...base, data: { inputs, labels: new Int32Array(samples + 1), features: FEATURES } }), SizeMismatchError);
  await t.rejects(PipelineTrainer.create({ ...base, loss: 'hinge' as never, data: { inputs, labels: new Int32Array(samples), features: FEATURES } }), InvalidArgumentError);
});

// A GPT's per-token loss through the runtime: a tiny byte-level GPT (gptLayers; its layers are
// checked against test/reference/gpt.ts in test/nn/gpt.test.ts) cut into 2 stages under GPipe
// equals the whole model trained on the same batches with tokenCrossEntropy, 6 SGD steps.
t.test('a GPT under gpipe on 2 stages trains as the whole model on the same batches (per-token cross-entropy)', async (t) => {
  const [vocab, context, rounds, m, b] = [11, 5, 6, 2, 3];
  const layers = gptLayers({ vocab, context, dim: 8, heads: 2, layers: 2 });
  const count = rounds * m * b;
  const tokens = random(9);
  const windows = Float32Array.from({ length: count * context }, () => Math.floor(tokens() * vocab));
  // The next token of each position: a fixed function of the window, so there is something to learn.
  const targets = Int32Array.from(windows, (v, i) => (v + (i % context)) % vocab);
  const sgd: PipelineOptimizerSpec = { kind: 'sgd', lr: 0.2, momentum: 0 };
  const trainer = await PipelineTrainer.create({
    schedule: 'gpipe',
    stages: 2,
    microBatches: m,
    microBatchSize: b,
    model: { layers, seed: SEED, boundaries: [2] },
    optimizer: sgd,
    data: { inputs: windows, labels: targets, features: context },
    shuffle: false,
  });
  const whole = new Sequential(layers, { seed: SEED });
  const optimizer = new SGD(whole.params, { lr: 0.2, momentum: 0 });
  const x = FlatBuffer.allocate(m * b * context);
  const y = FlatBuffer.allocate(m * b * context);
  const dlogits = FlatBuffer.allocate(m * b * context * vocab);
  try {
    for (let r = 0; r < rounds; r++) {
      const report = await trainer.trainRound();
      const rows = [r * m * b * context, (r + 1) * m * b * context];
      x.array.set(windows.subarray(rows[0], rows[1]));
      y.array.set(Float32Array.from(targets.subarray(rows[0], rows[1])));
      const logits = whole.forward(0, x, m * b);
      const loss = tokenCrossEntropy(logits, y, m * b, context, vocab, dlogits);
      whole.backward(0, dlogits, { grads: whole.params.grads, inputGrad: false });
      optimizer.stepSync();
      t.ok(Math.abs(report.loss - loss) < 1e-5, `round ${r}: loss ${report.loss.toFixed(6)} = the whole model's ${loss.toFixed(6)}`);
    }
    const worst = maxDiffByName(layers, SEED, [2], await trainer.weights(), whole.params.weights.array);
    t.ok(worst <= 1e-6, `every weight within 1e-6 of the whole model's (worst ${worst.toExponential(2)})`);
    // evaluateLoss over every window = the whole model's mean loss, batch by batch.
    let sum = 0;
    for (let r = 0; r < rounds; r++) {
      const rows = [r * m * b * context, (r + 1) * m * b * context];
      x.array.set(windows.subarray(rows[0], rows[1]));
      y.array.set(Float32Array.from(targets.subarray(rows[0], rows[1])));
      sum += tokenCrossEntropy(whole.forward(1, x, m * b), y, m * b, context, vocab);
      whole.release(1);
    }
    const validation = await trainer.evaluateLoss(windows, targets);
    t.ok(Math.abs(validation - sum / rounds) < 1e-5, `evaluateLoss ${validation.toFixed(6)} = the whole model's ${(sum / rounds).toFixed(6)}`);
  } finally {
    await trainer.dispose();
    for (const buffer of [x, y, dlogits]) buffer.dispose();
    whole.dispose();
  }
});
