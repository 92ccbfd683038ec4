/**
 * sapipe/tfjs: a TensorFlow.js model trained by DataParallelTrainer through TfjsParams.
 *
 * - `sync` on 2 ranks (each half of every batch, in this thread) against the same model trained
 *   by tfjs alone with its own momentum optimizer on the whole batch (the mean loss, so the average
 *   of the halves' gradients is the whole batch's): 12 steps, weights to 1e-5 relative. The
 *   reference is tfjs's own `tf.train.momentum`, independent of sapipe's kernels.
 * - `sapipe-wp`: the ranks agree, the loss falls, the model's variables hold the predicted weights
 *   the forward read, and `tf.memory().numTensors` is flat across 20 steps (no tensor leaks).
 * - Bad input: typed errors; a missing TensorFlow.js is a BackendUnavailableError saying what to install.
 * - TfjsStage: tfjs sub-models as pipeline stages; GPipe and 1F1B over 2 parts equal the whole
 *   network trained by tfjs's momentum optimizer (one round per epoch over the whole set) to 1e-5;
 *   PipeOptim trains.
 */
import * as tf from '@tensorflow/tfjs';
import t from 'tap';

import { DataParallelTrainer, LocalCommunicator } from '../../dist/index.js';
import { requirePackage, TfjsParams } from '../../dist/tfjs/index.js';

const FEATURES = 6;
const CLASSES = 3;
const BATCH = 16;

function model(seed: number): tf.LayersModel {
  return tf.sequential({
    layers: [
      tf.layers.dense({ inputShape: [FEATURES], units: 8, activation: 'relu', kernelInitializer: tf.initializers.glorotUniform({ seed }), biasInitializer: 'zeros' }),
      tf.layers.dense({ units: CLASSES, kernelInitializer: tf.initializers.glorotUniform({ seed: seed + 1 }), biasInitializer: 'zeros' }),
    ],
  });
}

/** Batch `step`: fixed inputs and one-hot labels (a formula, the same for every run). */
function batch(step: number): { xs: tf.Tensor2D; ys: tf.Tensor2D } {
  const x = new Float32Array(BATCH * FEATURES);
  const y = new Float32Array(BATCH * CLASSES);
  for (let b = 0; b < BATCH; b++) {
    for (let f = 0; f < FEATURES; f++) x[b * FEATURES + f] = Math.sin(1 + b * 0.7 + f * 1.3 + step * 0.37);
    y[b * CLASSES + ((b + step) % CLASSES)] = 1;
  }
  return { xs: tf.tensor2d(x, [BATCH, FEATURES]), ys: tf.tensor2d(y, [BATCH, CLASSES]) };
}

const loss = (m: tf.LayersModel, xs: tf.Tensor, ys: tf.Tensor): tf.Scalar => tf.losses.softmaxCrossEntropy(ys, m.apply(xs) as tf.Tensor) as tf.Scalar;

async function ranks(name: string): Promise<LocalCommunicator[]> {
  return Promise.all([0, 1].map((rank) => LocalCommunicator.create({ group: `${name}-${process.pid}`, rank, size: 2 })));
}

t.test('sync on 2 ranks equals tfjs training the whole batch with its own momentum optimizer', async (t) => {
  const LR = 0.1;
  const MU = 0.9;
  const STEPS = 12;
  const reference = model(7);
  const optimizer = tf.train.momentum(LR, MU);
  for (let s = 0; s < STEPS; s++) {
    const { xs, ys } = batch(s);
    optimizer.minimize(() => loss(reference, xs, ys));
    tf.dispose([xs, ys]);
  }
  const comms = await ranks('tfjs-sync');
  const models = [model(7), model(7)];
  const adapters = models.map((m, r) => TfjsParams.fromModel(tf, m, { memory: comms[r]! }));
  const trainers = await Promise.all(adapters.map((a, r) => DataParallelTrainer.create({ comm: comms[r]!, params: a.params, mode: 'sync', optimizer: { kind: 'sgd', lr: LR, momentum: MU } })));
  for (let s = 0; s < STEPS; s++) {
    const { xs, ys } = batch(s);
    adapters.forEach((a, r) => {
      a.writeWeights(trainers[r]!.forwardWeights);
      const half = BATCH / 2;
      const [x, y] = [xs.slice([r * half, 0], [half, FEATURES]), ys.slice([r * half, 0], [half, CLASSES])];
      a.computeGradients(() => loss(models[r]!, x, y));
      tf.dispose([x, y]);
    });
    await Promise.all(trainers.map((tr) => tr.step()));
    tf.dispose([xs, ys]);
  }
  adapters[0]!.writeWeights();
  let worst = 0;
  reference.trainableWeights.forEach((w, i) => {
    const want = w.read().dataSync();
    const got = models[0]!.trainableWeights[i]!.read().dataSync();
    want.forEach((v, j) => (worst = Math.max(worst, Math.abs(v - got[j]!) / Math.max(1e-3, Math.abs(v)))));
  });
  t.ok(worst <= 1e-5, `weights after ${STEPS} steps: largest relative difference ${worst.toExponential(2)} (limit 1e-5)`);
  t.same([...adapters[1]!.params.weights.array], [...adapters[0]!.params.weights.array], 'the ranks agree bit for bit');
  await Promise.all(trainers.map((tr) => tr.dispose()));
  adapters.forEach((a) => a.params.dispose());
  comms.forEach((c) => c.destroy());
  tf.dispose([...models, reference].flatMap((m) => m.weights.map((w) => w.read())));
});

for (const kind of ['sgd', 'adam'] as const)
  t.test(`one worker, ${kind === 'sgd' ? 'SGD with momentum' : 'Adam'}: 50 steps equal tfjs's own optimizer on the same batches`, async (t) => {
    const reference = model(5);
    const mine = model(5);
    const tfOptimizer = kind === 'sgd' ? tf.train.momentum(0.05, 0.9) : tf.train.adam(0.01, 0.9, 0.999, 1e-8);
    const tp = TfjsParams.fromModel(tf, mine);
    const { SGD, Adam } = await import('../../dist/index.js');
    const optimizer = kind === 'sgd' ? new SGD(tp.params, { lr: 0.05, momentum: 0.9 }) : new Adam(tp.params, { lr: 0.01, eps: 1e-8 });
    for (let s = 0; s < 50; s++) {
      const { xs, ys } = batch(s % 7);
      tfOptimizer.minimize(() => loss(reference, xs, ys));
      tp.writeWeights(optimizer.forwardWeights);
      tp.computeGradients(() => loss(mine, xs, ys));
      await optimizer.step();
      tf.dispose([xs, ys]);
    }
    tp.writeWeights();
    let worst = 0;
    reference.trainableWeights.forEach((w, i) => {
      const want = w.read().dataSync();
      const got = mine.trainableWeights[i]!.read().dataSync();
      want.forEach((v, j) => (worst = Math.max(worst, Math.abs(v - got[j]!) / Math.max(1e-2, Math.abs(v)))));
    });
    // Adam: tfjs adds eps to sqrt(v) before the bias correction, PyTorch's rule (sapipe's) after it.
    t.ok(worst <= 1e-4, `largest difference ${worst.toExponential(2)} (relative above 0.01, absolute below; limit 1e-4)`);
    optimizer.dispose();
    tp.params.dispose();
  });

t.test('sapipe-wp: the forward reads the predicted weights, the loss falls, no tensor leaks', async (t) => {
  const comms = await ranks('tfjs-wp');
  const models = [model(3), model(3)];
  const adapters = models.map((m, r) => TfjsParams.fromModel(tf, m, { memory: comms[r]! }));
  t.same(adapters[0]!.names, models[0]!.trainableWeights.map((w) => w.name), 'one ParamSet tensor per trainable weight, in order');
  t.same(adapters[0]!.names.map((n) => [...adapters[0]!.params.layout(n).shape]), models[0]!.trainableWeights.map((w) => w.shape), 'with its shape');
  const trainers = await Promise.all(adapters.map((a, r) => DataParallelTrainer.create({ comm: comms[r]!, params: a.params, mode: 'sapipe-wp', optimizer: { kind: 'adam', lr: 0.01 } })));
  const losses: number[] = [];
  let tensors = 0;
  for (let s = 0; s < 20; s++) {
    if (s === 3) tensors = tf.memory().numTensors;
    const { xs, ys } = batch(s % 4);
    const stepLoss = adapters.map((a, r) => {
      a.writeWeights(trainers[r]!.forwardWeights);
      trainers[r]!.zeroGrad();
      return a.computeGradients(() => loss(models[r]!, xs, ys));
    });
    losses.push(stepLoss[0]!);
    tf.dispose([xs, ys]);
    await Promise.all(trainers.map((tr) => tr.step()));
  }
  t.equal(tf.memory().numTensors, tensors, `tf.memory().numTensors is flat from step 3 to 20 (${tensors})`);
  t.ok(losses.slice(-4).reduce((a, b) => a + b) < losses.slice(0, 4).reduce((a, b) => a + b), `the loss falls (${losses[0]!.toFixed(3)} -> ${losses[19]!.toFixed(3)})`);
  adapters[0]!.writeWeights(trainers[0]!.forwardWeights);
  const predicted = trainers[0]!.forwardWeights.array;
  const w0 = models[0]!.trainableWeights[0]!.read().dataSync();
  const view = adapters[0]!.params.view(trainers[0]!.forwardWeights, adapters[0]!.names[0]!);
  t.ok(w0.every((v, i) => v === view[i]), 'the model holds the predicted weights it was given');
  t.ok(predicted.some((v, i) => v !== adapters[0]!.params.weights.array[i]), 'and they differ from the real ones (prediction is on)');
  t.same([...adapters[1]!.params.weights.array], [...adapters[0]!.params.weights.array], 'the ranks agree');
  await Promise.all(trainers.map((tr) => tr.flush()));
  await Promise.all(trainers.map((tr) => tr.dispose()));
  adapters.forEach((a) => a.params.dispose());
  comms.forEach((c) => c.destroy());
});

t.test('bad input is a typed error; a missing TensorFlow.js says what to install', (t) => {
  const m = model(1);
  t.throws(() => TfjsParams.fromModel({} as never, m), { code: 'ERR_INVALID_ARGUMENT', message: /TensorFlow.js namespace/ });
  t.throws(() => TfjsParams.fromModel(tf, {} as never), { code: 'ERR_INVALID_ARGUMENT', message: /trainable weights/ });
  t.throws(() => TfjsParams.fromModel(tf, m, { memroy: 1 } as never), { code: 'ERR_INVALID_ARGUMENT', message: /memory/ });
  const a = TfjsParams.fromModel(tf, m);
  t.throws(() => a.writeWeights({} as never), { code: 'ERR_SIZE_MISMATCH' });
  t.throws(() => a.computeGradients(null as never), { code: 'ERR_INVALID_ARGUMENT' });
  t.throws(() => a.writeGradients({}), { code: 'ERR_INVALID_ARGUMENT', message: /no gradient for weight/ });
  // Gradients that are not tensors: typed errors, and nothing written (all or nothing).
  const names = m.trainableWeights.map((w) => w.name);
  const goodGrads = (): Record<string, tf.Tensor> => Object.fromEntries(m.trainableWeights.map((w) => [w.name, tf.onesLike(w.read())]));
  for (const bad of [42, 'g', null, {}, { dataSync: () => 'text' }, { dataSync: () => { throw new Error('disposed'); } }]) {
    const grads = goodGrads();
    a.params.grads.array.fill(7);
    t.throws(() => a.writeGradients({ ...grads, [names[names.length - 1]!]: bad } as never), { code: 'ERR_INVALID_ARGUMENT' }, `a gradient ${JSON.stringify(String(bad))}`);
    t.ok(a.params.grads.array.every((v) => v === 7), 'nothing was written');
    Object.values(grads).forEach((g) => g.dispose());
  }
  a.params.dispose();
  t.throws(() => a.writeWeights(), { code: 'ERR_DISPOSED' });
  // A model that grows after its ParamSet was made is refused, not written into the wrong places.
  const grown = tf.sequential({ layers: [tf.layers.dense({ inputShape: [FEATURES], units: 4 })] });
  const g = TfjsParams.fromModel(tf, grown);
  grown.add(tf.layers.dense({ units: 2 }));
  t.throws(() => g.writeWeights(), { code: 'ERR_SIZE_MISMATCH', message: /trainable weights changed/ });
  t.throws(() => g.computeGradients(() => tf.scalar(0)), { code: 'ERR_SIZE_MISMATCH' });
  g.params.dispose();
  t.throws(() => requirePackage('@tensorflow/no-such-package'), { code: 'ERR_BACKEND_UNAVAILABLE', message: /npm install @tensorflow\/tfjs/ });
  t.end();
});

t.test('a tfjs sub-model as a pipeline stage: GPipe over 2 tfjs parts equals tfjs training the whole network', async (t) => {
  // From the build, as the runtime tests do: stage threads load what the trainer was loaded from,
  // and through the test runner's TypeScript hook each would compile lib/ again.
  const { PipelineTrainer } = (await import(new URL('../../dist/index.js', import.meta.url).href)) as typeof import('../../dist/index.js');
  const fixture = new URL('../fixtures/pipeline/tfjs-stage.mjs', import.meta.url);
  const { layer, FEATURES: F, LAYERS } = (await import(fixture.href)) as { layer(i: number, shape: number[]): tf.layers.Layer; FEATURES: number; LAYERS: { units: number }[] };
  const M = 4;
  const B = 4;
  const n = M * B; // one round per epoch: every round is the whole set, whatever its order
  const inputs = new Float32Array(n * F).map((_, i) => Math.sin(1 + i * 0.37));
  const labels = Array.from({ length: n }, (_, i) => i % 3);
  const LR = 0.1;
  const MU = 0.9;
  const ROUNDS = 6;
  const reference = tf.sequential({ layers: [layer(0, [F]), layer(1, [LAYERS[0]!.units])] });
  const optimizer = tf.train.momentum(LR, MU);
  const xs = tf.tensor2d(inputs, [n, F]);
  const ys = tf.oneHot(tf.tensor1d(labels, 'int32'), 3);
  for (let r = 0; r < ROUNDS; r++) optimizer.minimize(() => tf.losses.softmaxCrossEntropy(ys, reference.apply(xs) as tf.Tensor) as tf.Scalar);
  tf.dispose([xs, ys]);
  for (const schedule of ['gpipe', '1f1b'] as const) {
    const trainer = await PipelineTrainer.create({
      schedule,
      stages: 2,
      microBatches: M,
      microBatchSize: B,
      model: { module: fixture.href },
      optimizer: { kind: 'sgd', lr: LR, momentum: MU },
      data: { inputs, labels: Uint8Array.from(labels), features: F },
    });
    try {
      for (let r = 0; r < ROUNDS; r++) await trainer.trainEpoch();
      const parts = await trainer.weights();
      const want = reference.trainableWeights.map((w) => w.read().dataSync());
      // Part k's ParamSet holds layer k's kernel then bias, each aligned to 16 floats.
      let worst = 0;
      parts.forEach((p, k) => {
        const [kernel, bias] = [want[2 * k]!, want[2 * k + 1]!];
        const at = Math.ceil(kernel.length / 16) * 16;
        kernel.forEach((v, i) => (worst = Math.max(worst, Math.abs(v - p[i]!) / Math.max(1e-3, Math.abs(v)))));
        bias.forEach((v, i) => (worst = Math.max(worst, Math.abs(v - p[at + i]!) / Math.max(1e-3, Math.abs(v)))));
      });
      t.ok(worst <= 1e-5, `${schedule}: after ${ROUNDS} rounds the parts equal the whole network trained by tfjs (largest relative difference ${worst.toExponential(2)}, limit 1e-5)`);
    } finally {
      await trainer.dispose();
    }
  }
  // PipeOptim: the forward of the first stage reads the weights the fused kernel predicts.
  const async = await PipelineTrainer.create({
    schedule: 'pipeoptim',
    stages: 2,
    microBatches: M,
    microBatchSize: B,
    model: { module: fixture.href },
    optimizer: { kind: 'sgd', lr: 0.05, momentum: 0.9 },
    data: { inputs, labels: Uint8Array.from(labels), features: F },
  });
  try {
    const losses: number[] = [];
    for (let r = 0; r < 10; r++) losses.push((await async.trainEpoch()).loss);
    t.ok(losses[9]! < losses[0]!, `pipeoptim with tfjs stages: the loss falls (${losses[0]!.toFixed(4)} -> ${losses[9]!.toFixed(4)})`);
  } finally {
    await async.dispose();
  }
});
