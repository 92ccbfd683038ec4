/**
 * sapipe/tfjs against sapipe's plain-TypeScript reference optimizer, with delay compensation and
 * weight prediction on: two tfjs models per rank, one trained by DataParallelTrainer through
 * TfjsParams, the other by ReferenceOptimizer (test/reference/optimizer.ts), each computing its
 * own gradients with tfjs at the weights its own side says the forward reads. 2 ranks, each its
 * half of every batch, 50 steps: the weights and every forward's weights agree to 1e-4 (fp32
 * kernels and fp32 tfjs gradients against a double-precision reference: rounding, which the
 * staleness-1 loop carries from step to step).
 *
 * And no tensor leaks over 1,000 steps: `tf.memory().numTensors` is flat in a data-parallel loop
 * (sapipe-wp, Adam) and through a TfjsStage's forward and backward (its pipeline-stage form).
 */
import * as tf from '@tensorflow/tfjs';
import t from 'tap';

import { DataParallelTrainer, FlatBuffer, LocalCommunicator, type DataParallelTrainerOptions } from '../../dist/index.js';
import { TfjsParams, TfjsStage } from '../../dist/tfjs/index.js';
import { ReferenceOptimizer, type RefConfig } from '../reference/optimizer.js';

const FEATURES = 5;
const CLASSES = 3;
const BATCH = 8; // per rank
const RANKS = 2;
const STEPS = 50;

function model(): tf.LayersModel {
  return tf.sequential({
    layers: [
      tf.layers.dense({ inputShape: [FEATURES], units: 6, activation: 'tanh', kernelInitializer: tf.initializers.glorotUniform({ seed: 21 }), biasInitializer: 'zeros' }),
      tf.layers.dense({ units: CLASSES, kernelInitializer: tf.initializers.glorotUniform({ seed: 22 }), biasInitializer: 'zeros' }),
    ],
  });
}

/** Rank `rank`'s half of batch `step` (a formula: the same on both sides). */
function batch(step: number, rank: number): { xs: tf.Tensor2D; ys: tf.Tensor2D } {
  const x = new Float32Array(BATCH * FEATURES);
  const y = new Float32Array(BATCH * CLASSES);
  for (let b = 0; b < BATCH; b++) {
    const n = rank * BATCH + b;
    for (let f = 0; f < FEATURES; f++) x[b * FEATURES + f] = Math.sin(0.3 + n * 0.61 + f * 1.7 + (step % 9) * 0.43);
    y[b * CLASSES + ((n + step) % CLASSES)] = 1;
  }
  return { xs: tf.tensor2d(x, [BATCH, FEATURES]), ys: tf.tensor2d(y, [BATCH, CLASSES]) };
}

const loss = (m: tf.LayersModel, xs: tf.Tensor, ys: tf.Tensor): tf.Scalar => tf.losses.softmaxCrossEntropy(ys, m.apply(xs) as tf.Tensor) as tf.Scalar;

interface Case {
  name: string;
  options: Omit<DataParallelTrainerOptions, 'comm' | 'params'>;
  ref: Omit<RefConfig, 'gradScale' | 'dampening' | 'nesterov' | 'weightDecay' | 'beta1' | 'beta2' | 'eps' | 'momentum'> & Partial<RefConfig>;
}

const LAMBDA = 0.5;
const CASES: Case[] = [
  {
    name: 'sapipe-dc, SGD with momentum, elementwise compensation',
    options: { mode: 'sapipe-dc', compensation: { kind: 'elementwise', lambda: LAMBDA }, optimizer: { kind: 'sgd', lr: 0.1, momentum: 0.9 } },
    ref: { optimizer: 'sgd', lr: 0.1, momentum: 0.9, compensation: { kind: 'elementwise', lambda: LAMBDA, eps: 1e-7 } },
  },
  {
    name: 'sapipe-wp (local-prev-sync), Adam, adaptive compensation of the gradient and the estimate',
    options: { mode: 'sapipe-wp', estimate: 'local-prev-sync', compensation: { kind: 'adaptive', lambda: LAMBDA, eps: 1e-7 }, optimizer: { kind: 'adam', lr: 0.01 } },
    ref: {
      optimizer: 'adam',
      lr: 0.01,
      compensation: { kind: 'adaptive', lambda: LAMBDA, eps: 1e-7 },
      prediction: { kind: 'shadow', estimate: 'local-prev-sync', compensate: true, n: RANKS, localScale: 1 },
    },
  },
  {
    name: 'sapipe-wp (prev-sync), SGD with momentum and weight decay',
    options: { mode: 'sapipe-wp', estimate: 'prev-sync', optimizer: { kind: 'sgd', lr: 0.1, momentum: 0.9, weightDecay: 1e-3 } },
    ref: { optimizer: 'sgd', lr: 0.1, momentum: 0.9, weightDecay: 1e-3, prediction: { kind: 'shadow', estimate: 'prev-sync', compensate: false, n: RANKS, localScale: 1 } },
  },
  {
    name: 'sapipe-wp (local), AdamW',
    options: { mode: 'sapipe-wp', estimate: 'local', optimizer: { kind: 'adamw', lr: 0.01, weightDecay: 0.01 } },
    ref: { optimizer: 'adamw', lr: 0.01, weightDecay: 0.01, prediction: { kind: 'shadow', estimate: 'local', compensate: false, n: RANKS, localScale: 1 } },
  },
];

const ATOL = 1e-5;
const RTOL = 1e-4;
function worst(got: ArrayLike<number>, want: ArrayLike<number>): number {
  let w = 0;
  for (let i = 0; i < want.length; i++) w = Math.max(w, Math.abs(got[i]! - want[i]!) / (ATOL + RTOL * Math.abs(want[i]!)));
  return w;
}

for (const c of CASES)
  t.test(`${c.name}: ${STEPS} steps on ${RANKS} ranks equal the reference optimizer fed tfjs's gradients`, async (t) => {
    const comms = await Promise.all(Array.from({ length: RANKS }, (_, rank) => LocalCommunicator.create({ group: `tfjs-ref-${process.pid}-${c.options.mode}-${CASES.indexOf(c)}`, rank, size: RANKS })));
    const models = comms.map(() => model());
    const adapters = models.map((m, r) => TfjsParams.fromModel(tf, m, { memory: comms[r]! }));
    const trainers = await Promise.all(adapters.map((a, r) => DataParallelTrainer.create({ comm: comms[r]!, params: a.params, ...c.options })));
    // The reference side: its own models, weights from the reference, gradients from tfjs.
    const refModels = comms.map(() => model());
    const refParams = refModels.map((m) => TfjsParams.fromModel(tf, m));
    const cfg: RefConfig = { dampening: 0, nesterov: false, weightDecay: 0, beta1: 0.9, beta2: 0.999, eps: 1e-8, momentum: 0, gradScale: 1, ...c.ref };
    const refs = refParams.map((p) => new ReferenceOptimizer(cfg, p.params.weights.array));
    const forwardOf = (ref: ReferenceOptimizer): Float32Array => (cfg.prediction ? ref.predicted : ref.w);
    let pending: Float32Array | undefined;
    let worstForward = 0;
    try {
      for (let s = 0; s < STEPS; s++) {
        // sapipe's side
        for (let r = 0; r < RANKS; r++) {
          const { xs, ys } = batch(s, r);
          adapters[r]!.writeWeights(trainers[r]!.forwardWeights);
          trainers[r]!.zeroGrad();
          adapters[r]!.computeGradients(() => loss(models[r]!, xs, ys));
          tf.dispose([xs, ys]);
        }
        // the reference's side: the same loop in plain TypeScript, one step late (staleness 1)
        const local = refs.map((ref, r) => {
          const p = refParams[r]!;
          p.params.weights.array.set(forwardOf(ref));
          p.writeWeights();
          worstForward = Math.max(worstForward, worst(trainers[r]!.forwardWeights.array, forwardOf(ref)));
          const { xs, ys } = batch(s, r);
          p.computeGradients(() => loss(refModels[r]!, xs, ys));
          tf.dispose([xs, ys]);
          return p.params.grads.array.slice();
        });
        const avg = new Float32Array(local[0]!.length);
        for (let i = 0; i < avg.length; i++) avg[i] = Math.fround(Math.fround(local[0]![i]! + local[1]![i]!) * 0.5);
        if (pending) refs.forEach((ref, r) => ref.step(pending!, local[r]));
        pending = avg;
        await Promise.all(trainers.map((tr) => tr.step()));
      }
      t.ok(worstForward <= 1, `the weights every forward read agree (worst ${worstForward.toFixed(3)} of |d| <= ${ATOL} + ${RTOL}|x|)`);
      const w = worst(trainers[0]!.params.weights.array, refs[0]!.w);
      t.ok(w <= 1, `after ${STEPS} steps the weights agree (worst ${w.toFixed(3)} of the tolerance)`);
      t.same([...trainers[1]!.params.weights.array], [...trainers[0]!.params.weights.array], 'the ranks hold the same real weights');
    } finally {
      await Promise.all(trainers.map((tr) => tr.dispose()));
      adapters.forEach((a) => a.params.dispose());
      refParams.forEach((p) => p.params.dispose());
      comms.forEach((cm) => cm.destroy());
      tf.dispose([...models, ...refModels].flatMap((m) => m.weights.map((v) => v.read())));
    }
  });

t.test('no tensor leaks over 1,000 steps: a sapipe-wp loop and a TfjsStage', async (t) => {
  const STEPS_LONG = 1000;
  const comm = await LocalCommunicator.create({ group: `tfjs-leak-${process.pid}`, rank: 0, size: 1 });
  const m = model();
  const tp = TfjsParams.fromModel(tf, m, { memory: comm });
  const trainer = await DataParallelTrainer.create({ comm, params: tp.params, mode: 'sapipe-wp', compensation: {}, optimizer: { kind: 'adam', lr: 0.01 } });
  const { xs, ys } = batch(0, 0);
  let before = 0;
  const losses: number[] = [];
  for (let s = 0; s < STEPS_LONG; s++) {
    if (s === 2) before = tf.memory().numTensors;
    tp.writeWeights(trainer.forwardWeights);
    trainer.zeroGrad();
    losses.push(tp.computeGradients(() => loss(m, xs, ys)));
    await trainer.step();
  }
  await trainer.flush();
  tp.writeWeights();
  tp.readWeights();
  t.equal(tf.memory().numTensors, before, `data-parallel loop: ${before} tensors at step 2 and after step ${STEPS_LONG}`);
  t.ok(losses[STEPS_LONG - 1]! < 0.5 * losses[0]!, `the loss fell (${losses[0]!.toFixed(3)} -> ${losses[STEPS_LONG - 1]!.toFixed(4)})`);
  await trainer.dispose();
  tp.params.dispose();
  comm.destroy();

  // The stage form: forward, backward (input and weight gradients) for 1,000 micro-batches.
  const stage = new TfjsStage(tf, model());
  const input = FlatBuffer.allocate(BATCH * FEATURES);
  const sample = batch(1, 0);
  input.array.set(sample.xs.dataSync());
  tf.dispose([sample.xs, sample.ys]);
  const gradOut = FlatBuffer.allocate(BATCH * CLASSES);
  gradOut.array.fill(0.01);
  const grads = FlatBuffer.allocate(stage.params.length);
  let stageBefore = 0;
  for (let s = 0; s < STEPS_LONG; s++) {
    if (s === 2) stageBefore = tf.memory().numTensors;
    const out = stage.forward(s % 4, input, BATCH, stage.params.weights);
    const gx = stage.backward(s % 4, gradOut, { grads, accumulate: false, inputGrad: true });
    stage.recycle(out);
    if (gx) stage.recycle(gx);
  }
  t.equal(tf.memory().numTensors, stageBefore, `TfjsStage: ${stageBefore} tensors at micro-batch 2 and after ${STEPS_LONG}`);
  t.ok(grads.array.some((v) => v !== 0), 'and its backward wrote weight gradients');
  input.dispose();
  gradOut.dispose();
  grads.dispose();
  stage.dispose();
});
