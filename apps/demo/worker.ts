/**
 * One rank of `sapipe demo` (a worker thread): trains the model (apps/demo/models.ts) on its shard of the training
 * set with one data-parallel mode, reporting per step how long step() waited for communication.
 * Rank 0 also measures test accuracy after every epoch (outside the timed region, behind a
 * barrier, so evaluation never counts as training or communication time).
 */
import { performance } from 'node:perf_hooks';
import { parentPort, workerData } from 'node:worker_threads';

import { DataParallelTrainer, FlatBuffer, LocalCommunicator, type LocalRankData, type NetworkEmulation, shuffledIndices } from 'sapipe';
import { demoTrainerOptions, type DemoSharedData, type DemoVariant } from './config.js';
import type { GptSize } from './gpt-size.js';
import { createDemoModel, type DemoModelName } from './models.js';

export interface DemoWorkerData extends LocalRankData, DemoSharedData {
  model: DemoModelName;
  /** The GPT's size; undefined: the demo's default. */
  gpt: GptSize | undefined;
  variant: DemoVariant;
  lambda: number | undefined;
  dcKind: 'elementwise' | 'adaptive' | undefined;
  /** false: the staleness-1 modes apply each update at the next step() (overlapUpdate: false). */
  overlap: boolean;
  /** Top-k compressed exchange; undefined: dense. */
  topk: { density: number; errorFeedback: boolean } | undefined;
  epochs: number;
  batch: number;
  lr: number;
  momentum: number;
  seed: number;
  emulate: NetworkEmulation | undefined;
}

export type DemoWorkerMessage =
  | { kind: 'epoch'; epoch: number; accuracy: number; loss?: number }
  | { kind: 'done'; rank: number; trainMs: number; loopMs: number; steps: number; commMs: number; samples: number }
  | { kind: 'error'; rank: number; error: string };

const data = workerData as DemoWorkerData;
const { group, rank, size } = data.sapipeLocal;
const FEATURES = data.features;
/** Labels per sample: 1, or the GPT's `context` next bytes. */
const PER = data.trainLabels.length / (data.trainInputs.length / FEATURES);

async function main(): Promise<void> {
  const comm = await LocalCommunicator.create({ group, rank, size, ...(data.emulate ? { emulate: data.emulate } : {}) });
  // Same seed on every rank: identical initial weights (the trainer also broadcasts rank 0's).
  const model = createDemoModel(data.model, data.seed, data.gpt);
  const trainer = await DataParallelTrainer.create({ comm, params: model.params, ...demoTrainerOptions(data.variant, data) });
  const trainCount = data.trainInputs.length / FEATURES;
  // Rank r owns samples r, r+size, ...; every rank runs the same number of steps (collectives pair up).
  const perRank = Math.floor(trainCount / size);
  const stepsPerEpoch = Math.max(1, Math.floor(perRank / data.batch));
  const batch = Math.min(data.batch, perRank);
  const x = FlatBuffer.allocate(batch * FEATURES);
  const labels = new Uint8Array(batch * PER);
  let trainMs = 0;
  let loopMs = 0;
  let commMs = 0;
  let steps = 0;
  for (let epoch = 0; epoch < data.epochs; epoch++) {
    const order = shuffledIndices(perRank, (data.seed * 7919 + epoch * 104729 + rank) >>> 0);
    const start = performance.now();
    for (let s = 0; s < stepsPerEpoch; s++) {
      for (let b = 0; b < batch; b++) {
        const i = order[s * batch + b]! * size + rank;
        x.array.set(data.trainInputs.subarray(i * FEATURES, (i + 1) * FEATURES), b * FEATURES);
        labels.set(data.trainLabels.subarray(i * PER, (i + 1) * PER), b * PER);
      }
      model.forward(x, batch, trainer.forwardWeights);
      model.loss(labels);
      model.backward(trainer.grads);
      const t0 = performance.now();
      const r = await trainer.step();
      // sync: the whole step() is the all-reduce (+ a fused update); pipelined: only what it waited.
      commMs += trainer.staleness === 0 ? performance.now() - t0 : r.waitedMs;
      steps += 1;
    }
    loopMs += performance.now() - start;
    const t0 = performance.now();
    // Apply the gradient in flight so the epoch's accuracy reflects every step taken.
    await trainer.flush();
    commMs += performance.now() - t0;
    trainMs += performance.now() - start;
    if (rank === 0) {
      // One pass over the test set where the model gives both figures.
      const { accuracy, loss } = model.evaluate?.(data.testInputs, data.testLabels) ?? { accuracy: model.accuracy(data.testInputs, data.testLabels), loss: undefined };
      parentPort!.postMessage({ kind: 'epoch', epoch: epoch + 1, accuracy, ...(loss === undefined ? {} : { loss }) } satisfies DemoWorkerMessage);
    }
    await comm.barrier();
  }
  x.dispose();
  await trainer.dispose();
  model.dispose();
  await comm.destroy();
  parentPort!.postMessage({ kind: 'done', rank, trainMs, loopMs, steps, commMs, samples: steps * batch } satisfies DemoWorkerMessage);
}

main().catch((e: unknown) => parentPort!.postMessage({ kind: 'error', rank, error: e instanceof Error ? e.message : String(e) } satisfies DemoWorkerMessage));
