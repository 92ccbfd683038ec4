/**
 * One rank of `sapipe demo` (a worker thread): trains the model (apps/demo/models.ts) on its shard of the training
 * set with one data-parallel mode, reporting per step how long step() waited for communication.
 * Rank 0 also measures test accuracy after every epoch (outside the timed region, behind a
 * barrier, so evaluation never counts as training or communication time). On a GPU the rank is
 * an NCCL rank whose model, weights, gradients and optimizer state live on its device; only each
 * batch goes in, and nothing but the test figures comes back.
 */
import { performance } from 'node:perf_hooks';
import { parentPort, workerData } from 'node:worker_threads';

import { type CudaDevice, createRendezvous, DataParallelTrainer, FlatBuffer, LocalCommunicator, type LocalRankData, NcclCommunicator, type NetworkEmulation, shuffledIndices } from 'sapipe';
import { demoTrainerOptions, type DemoSharedData, type DemoVariant } from './config.js';
import type { GptSize } from './gpt-size.js';
import { createDemoModel, createDeviceDemoModel, type DemoModelName, type DeviceDemoModel } from './models.js';

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
  /**
   * On GPUs: rank r's device is `ranks[r]`, and the NCCL unique id goes through the driver's
   * rendezvous store on `storePort` (the driver is its rank 0, worker r its rank r + 1).
   * Undefined: the CPU, over the local backend.
   */
  gpu: { ranks: readonly CudaDevice[]; storePort: number } | undefined;
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

/** The calls of one training step and of the evaluation, on the host or on this rank's GPU. */
interface RankModel {
  readonly comm: LocalCommunicator | NcclCommunicator;
  readonly trainer: DataParallelTrainer;
  /** Forward, loss and backward of `batch` samples of `x`, the gradient into the trainer's. */
  computeGradient(x: FlatBuffer, batch: number, labels: Uint8Array): void;
  evaluate(): { accuracy: number; loss: number | undefined };
  dispose(): Promise<void>;
}

async function onHost(): Promise<RankModel> {
  const comm = await LocalCommunicator.create({ group, rank, size, ...(data.emulate ? { emulate: data.emulate } : {}) });
  // Same seed on every rank: identical initial weights (the trainer also broadcasts rank 0's).
  const model = createDemoModel(data.model, data.seed, data.gpt);
  const trainer = await DataParallelTrainer.create({ comm, params: model.params, ...demoTrainerOptions(data.variant, data) });
  return {
    comm,
    trainer,
    computeGradient(x, batch, labels) {
      model.forward(x, batch, trainer.forwardWeights);
      model.loss(labels);
      model.backward(trainer.grads);
    },
    // One pass over the test set where the model gives both figures.
    evaluate: () => model.evaluate?.(data.testInputs, data.testLabels) ?? { accuracy: model.accuracy(data.testInputs, data.testLabels), loss: undefined },
    async dispose() {
      await trainer.dispose();
      model.dispose();
      await comm.destroy();
    },
  };
}

async function onGpu(gpu: NonNullable<DemoWorkerData['gpu']>): Promise<RankModel> {
  const device = gpu.ranks[rank]!;
  const job = await createRendezvous({ rank: rank + 1, worldSize: size + 1, port: gpu.storePort });
  let comm: NcclCommunicator;
  try {
    comm = await NcclCommunicator.create({ rank, size, device, store: job.group('demo', rank, size) });
  } finally {
    // The clique is up (or failed): the store is not needed again.
    await job.close();
  }
  let model: DeviceDemoModel | undefined;
  let trainer: DataParallelTrainer;
  try {
    model = createDeviceDemoModel(data.model, data.seed, comm.device, data.gpt);
    trainer = await DataParallelTrainer.create({ comm, params: model.params, model, device: comm.device, ...demoTrainerOptions(data.variant, data) });
  } catch (error) {
    // The other ranks learn of it from their collectives' timeouts; this one lets go of its GPU.
    model?.dispose();
    await comm.destroy();
    throw error;
  }
  return {
    comm,
    trainer,
    computeGradient: (x, batch, labels) => model.computeGradient(x.array.subarray(0, batch * FEATURES), batch, labels, trainer.deviceForwardWeights, trainer.deviceGrads),
    evaluate: () => model.evaluate(data.testInputs, data.testLabels, trainer.deviceWeights),
    async dispose() {
      await trainer.dispose();
      model.dispose();
      await comm.destroy();
    },
  };
}

async function main(): Promise<void> {
  const { comm, trainer, computeGradient, evaluate, dispose } = data.gpu ? await onGpu(data.gpu) : await onHost();
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
      computeGradient(x, batch, labels);
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
      const { accuracy, loss } = evaluate();
      parentPort!.postMessage({ kind: 'epoch', epoch: epoch + 1, accuracy, ...(loss === undefined ? {} : { loss }) } satisfies DemoWorkerMessage);
    }
    await comm.barrier();
  }
  x.dispose();
  await dispose();
  parentPort!.postMessage({ kind: 'done', rank, trainMs, loopMs, steps, commMs, samples: steps * batch } satisfies DemoWorkerMessage);
}

main().catch((e: unknown) => parentPort!.postMessage({ kind: 'error', rank, error: e instanceof Error ? e.message : String(e) } satisfies DemoWorkerMessage));
