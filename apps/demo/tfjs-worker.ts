/**
 * One rank of `sapipe demo --tfjs` (a worker thread): trains the demo's TensorFlow.js CNN on the
 * MNIST digits, either alone with tfjs's own momentum optimizer on the whole global batch (the
 * baseline, `variant` undefined, one rank) or as one of N data-parallel ranks through sapipe/tfjs
 * (its share of the same global batch, sapipe's trainer in one mode). Both walk the training set
 * in the same seeded order, so `sync` computes what tfjs alone does, up to rounding.
 *
 * Each rank times, per step, tfjs's forward and backward (`tf.variableGrads`), the adapter's copies
 * (weights into the model, gradients out of it) and the wait in `step()`; rank 0 measures test
 * accuracy at the end, outside the timed region.
 */
import { performance } from 'node:perf_hooks';
import { parentPort, workerData } from 'node:worker_threads';

import type * as TF from '@tensorflow/tfjs';

import { DataParallelTrainer, LocalCommunicator, type LocalRankData, type NetworkEmulation, shuffledIndices } from 'sapipe';
import { demoTrainerOptions, type DemoSharedData, type DemoTrainerSettings, type DemoVariant } from './config.js';
import { CNN_INPUT_SHAPE, cnnAccuracy, disposeModel, loadTfjs, mnistCnn, type Tf } from './tfjs-model.js';

export interface TfjsDemoWorkerData extends LocalRankData, DemoTrainerSettings, DemoSharedData {
  /** undefined: tfjs alone (one rank, tfjs's optimizer, the whole global batch). */
  variant: DemoVariant | undefined;
  /** Samples per rank per step; tfjs alone takes `batch x globalRanks`. */
  batch: number;
  /** The data-parallel runs' rank count: the global batch is `batch x globalRanks` samples. */
  globalRanks: number;
  epochs: number;
  seed: number;
  emulate: NetworkEmulation | undefined;
}

export type TfjsDemoWorkerMessage =
  | {
      kind: 'done';
      rank: number;
      /** Training wall time (the end-of-epoch flushes in, evaluation out). */
      trainMs: number;
      steps: number;
      samples: number;
      /** Summed over steps: tfjs's forward and backward, the adapter's copies, the wait in step(). */
      tfjsMs: number;
      adapterMs: number;
      commMs: number;
      /** Rank 0: test accuracy after the last epoch. */
      accuracy: number | undefined;
    }
  | { kind: 'error'; rank: number; error: string };

const data = workerData as TfjsDemoWorkerData;
const { group, rank, size } = data.sapipeLocal;
const PIXELS = 784;

/** The rows of global step `s`'s batch this rank takes, from the epoch's seeded order. */
function rowsOf(order: Uint32Array, s: number, share: number, offset: number): number[] {
  const global = data.batch * data.globalRanks;
  return Array.from({ length: share }, (_, b) => order[s * global + offset + b]!);
}

function batchTensors(tf: Tf, rows: number[]): { xs: TF.Tensor4D; ys: TF.Tensor2D } {
  const x = new Float32Array(rows.length * PIXELS);
  rows.forEach((i, b) => x.set(data.trainInputs.subarray(i * PIXELS, (i + 1) * PIXELS), b * PIXELS));
  const labels = tf.tensor1d(Int32Array.from(rows, (i) => data.trainLabels[i]!), 'int32');
  const ys = tf.oneHot(labels, 10) as TF.Tensor2D;
  labels.dispose();
  return { xs: tf.tensor4d(x, [rows.length, ...CNN_INPUT_SHAPE]), ys };
}

async function main(): Promise<void> {
  const tf = await loadTfjs();
  const { TfjsParams } = await import('sapipe/tfjs');
  const model = mnistCnn(tf, data.seed);
  const lossOf = (xs: TF.Tensor, ys: TF.Tensor) => (): TF.Scalar => tf.losses.softmaxCrossEntropy(ys, model.apply(xs) as TF.Tensor) as TF.Scalar;
  const global = data.batch * data.globalRanks;
  const stepsPerEpoch = Math.floor(data.trainLabels.length / global);
  let tfjsMs = 0;
  let adapterMs = 0;
  let commMs = 0;
  let steps = 0;
  let trainMs = 0;
  let accuracy: number | undefined;
  if (data.variant === undefined) {
    const optimizer = tf.train.momentum(data.lr, data.momentum);
    for (let epoch = 0; epoch < data.epochs; epoch++) {
      const order = shuffledIndices(data.trainLabels.length, (data.seed * 7919 + epoch) >>> 0);
      const start = performance.now();
      for (let s = 0; s < stepsPerEpoch; s++) {
        const { xs, ys } = batchTensors(tf, rowsOf(order, s, global, 0));
        const t0 = performance.now();
        optimizer.minimize(lossOf(xs, ys));
        tfjsMs += performance.now() - t0;
        tf.dispose([xs, ys]);
        steps += 1;
      }
      trainMs += performance.now() - start;
    }
    accuracy = cnnAccuracy(tf, [model], data.testInputs, data.testLabels);
    optimizer.dispose();
  } else {
    const comm = await LocalCommunicator.create({ group, rank, size, ...(data.emulate ? { emulate: data.emulate } : {}) });
    const tp = TfjsParams.fromModel(tf, model, { memory: comm });
    const trainer = await DataParallelTrainer.create({ comm, params: tp.params, ...demoTrainerOptions(data.variant, data) });
    for (let epoch = 0; epoch < data.epochs; epoch++) {
      const order = shuffledIndices(data.trainLabels.length, (data.seed * 7919 + epoch) >>> 0);
      const start = performance.now();
      for (let s = 0; s < stepsPerEpoch; s++) {
        const { xs, ys } = batchTensors(tf, rowsOf(order, s, data.batch, rank * data.batch));
        let t0 = performance.now();
        tp.writeWeights(trainer.forwardWeights); // the (predicted) weights this step's forward reads
        trainer.zeroGrad();
        adapterMs += performance.now() - t0;
        t0 = performance.now();
        const { value, grads } = tf.variableGrads(lossOf(xs, ys));
        tfjsMs += performance.now() - t0;
        t0 = performance.now();
        tp.writeGradients(grads);
        adapterMs += performance.now() - t0;
        tf.dispose([value, xs, ys, ...Object.values(grads)]);
        t0 = performance.now();
        const r = await trainer.step();
        commMs += trainer.staleness === 0 ? performance.now() - t0 : r.waitedMs;
        steps += 1;
      }
      await trainer.flush();
      trainMs += performance.now() - start;
    }
    if (rank === 0) {
      tp.writeWeights(); // the real weights, for evaluation
      accuracy = cnnAccuracy(tf, [model], data.testInputs, data.testLabels);
    }
    await trainer.dispose();
    tp.params.dispose();
    await comm.destroy();
  }
  disposeModel(tf, model);
  parentPort!.postMessage({ kind: 'done', rank, trainMs, steps, samples: steps * (data.variant === undefined ? global : data.batch), tfjsMs, adapterMs, commMs, accuracy } satisfies TfjsDemoWorkerMessage);
}

main().catch((e: unknown) => parentPort!.postMessage({ kind: 'error', rank, error: e instanceof Error ? e.message : String(e) } satisfies TfjsDemoWorkerMessage));
