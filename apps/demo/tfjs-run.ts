/**
 * The driver of `sapipe demo --tfjs`: one TensorFlow.js CNN on the MNIST digits, trained
 *  - by tfjs alone (its own momentum optimizer, one thread, the global batch): the baseline;
 *  - data-parallel by sapipe through sapipe/tfjs, N ranks, in each mode asked for;
 *  - pipeline-parallel by sapipe's PipelineTrainer, the CNN cut into S TfjsStage parts, under
 *    each schedule asked for (M = N micro-batches of the per-rank batch: the same global batch).
 * Runs go one after another so they never compete for the cores. Every run starts from the same
 * seeded weights and sees the same number of samples per update.
 */
import { availableParallelism } from 'node:os';

import { InvalidArgumentError, loadMnist, PipelineTrainer, type RuntimeScheduleName, spawnLocalRanks, trainTestSplit } from 'sapipe';
import { checkDemoConfig, type DemoConfig } from './config.js';
import { gatherRanks, sharedCopy } from './run-demo.js';
import { CNN_MAX_STAGES, cnnAccuracy, disposeModel, loadTfjs, mnistCnn } from './tfjs-model.js';
// Types only: importing the worker for real would run a rank in this thread.
import type { TfjsDemoWorkerData, TfjsDemoWorkerMessage } from './tfjs-worker.js';

/** @internal */
export interface TfjsDemoConfig extends DemoConfig {
  /** Pipeline schedules to train the CNN with, cut into `stages` parts (none: data-parallel only). */
  schedules: RuntimeScheduleName[];
  stages: number;
}

/** @internal One trained configuration of the tfjs demo. */
export interface TfjsDemoRun {
  /** `tfjs alone`, a data-parallel mode's label, or `<schedule> x<S> stages`. */
  run: string;
  kind: 'tfjs' | 'data-parallel' | 'pipeline';
  accuracy: number;
  /** Training wall time (the slowest rank's), evaluation excluded. */
  wallMs: number;
  samplesPerSec: number;
  /** tfjs alone's wall time over this run's. */
  speedup: number | undefined;
  /** Data-parallel: the adapter's copies per step over tfjs's forward and backward per step (rank-averaged). */
  adapterShare: number | undefined;
  /** Data-parallel: per step, rank-averaged: tfjs's forward and backward, the adapter's copies, the wait in step(). */
  stepMs: { tfjs: number; adapter: number; comm: number } | undefined;
}

/** @internal */
export interface TfjsDemoResult {
  config: TfjsDemoConfig & { trainSamples: number; testSamples: number; cores: number; backend: string };
  runs: TfjsDemoRun[];
}

/** @internal The CLI's defaults where `--tfjs` differs from the MLP demo: a minute or two on the JS CPU backend. */
export const TFJS_DEMO_DEFAULTS = { modes: 'sync,sapipe-wp', schedules: '1f1b,pipeoptim', stages: 2, epochs: 2, batch: 16, trainSamples: 640 } as const;

/** @internal */
export function checkTfjsDemoConfig(c: TfjsDemoConfig): TfjsDemoConfig {
  checkDemoConfig(c);
  if (!Number.isInteger(c.stages) || c.stages < 2 || c.stages > CNN_MAX_STAGES)
    throw new InvalidArgumentError(`--stages: the demo's CNN cuts into 2 to ${CNN_MAX_STAGES} pipeline stages, got ${c.stages}`);
  return c;
}

/** @internal */
export async function runTfjsDemo(config: TfjsDemoConfig, onRun: (run: TfjsDemoRun) => void = () => {}): Promise<TfjsDemoResult> {
  checkTfjsDemoConfig(config);
  const tf = await loadTfjs(); // fails here, with what to install, before any thread starts
  const { train: fullTrain, test: testSet } = trainTestSplit(loadMnist(), { testFraction: 0.2, seed: config.seed });
  const trainSamples = Math.min(config.trainSamples ?? fullTrain.count, fullTrain.count);
  const global = config.batch * config.workers;
  if (trainSamples < global) throw new InvalidArgumentError(`--train-samples ${trainSamples} is less than one global batch (${config.workers} workers x batch ${config.batch})`);
  const train = { inputs: sharedCopy(fullTrain.inputs.subarray(0, trainSamples * 784)), labels: sharedCopy(fullTrain.labels.subarray(0, trainSamples)) };
  const test = { inputs: sharedCopy(testSet.inputs), labels: sharedCopy(testSet.labels) };
  const runs: TfjsDemoRun[] = [];
  const add = (run: Omit<TfjsDemoRun, 'speedup'>): void => {
    const base = run.kind === 'tfjs' ? run : runs.find((r) => r.kind === 'tfjs');
    const done = { ...run, speedup: base === undefined ? undefined : base.wallMs / run.wallMs };
    runs.push(done);
    onRun(done);
  };
  const ext = import.meta.url.endsWith('.ts') ? 'ts' : 'js';
  const ranks = async (variant: TfjsDemoWorkerData['variant'], size: number): Promise<Extract<TfjsDemoWorkerMessage, { kind: 'done' }>[]> => {
    const workerData: Omit<TfjsDemoWorkerData, 'sapipeLocal'> = {
      variant,
      batch: config.batch,
      globalRanks: config.workers,
      epochs: config.epochs,
      seed: config.seed,
      lr: config.lr,
      momentum: config.momentum,
      lambda: config.lambda,
      dcKind: config.dcKind,
      overlap: config.overlap,
      topk: config.topk,
      emulate: config.emulate,
      trainInputs: train.inputs,
      trainLabels: train.labels,
      testInputs: test.inputs,
      testLabels: test.labels,
    };
    const workers = spawnLocalRanks(new URL(`./tfjs-worker.${ext}`, import.meta.url), size, { workerData: workerData as unknown as Record<string, unknown> });
    try {
      return await gatherRanks(workers, variant?.label ?? 'tfjs alone');
    } finally {
      await Promise.all(workers.map((w) => w.terminate()));
    }
  };

  const [alone] = await ranks(undefined, 1);
  add({ run: 'tfjs alone', kind: 'tfjs', accuracy: alone!.accuracy!, wallMs: alone!.trainMs, samplesPerSec: alone!.samples / (alone!.trainMs / 1000), adapterShare: undefined, stepMs: undefined });
  for (const variant of config.modes) {
    const done = await ranks(variant, config.workers);
    const wallMs = Math.max(...done.map((d) => d.trainMs));
    const mean = (f: (d: (typeof done)[number]) => number): number => done.reduce((a, d) => a + f(d), 0) / done.length / done[0]!.steps;
    const stepMs = { tfjs: mean((d) => d.tfjsMs), adapter: mean((d) => d.adapterMs), comm: mean((d) => d.commMs) };
    add({
      run: variant.label,
      kind: 'data-parallel',
      accuracy: done.find((d) => d.rank === 0)!.accuracy!,
      wallMs,
      samplesPerSec: done.reduce((a, d) => a + d.samples, 0) / (wallMs / 1000),
      adapterShare: stepMs.adapter / stepMs.tfjs,
      stepMs,
    });
  }
  for (const schedule of config.schedules) {
    const trainer = await PipelineTrainer.create({
      schedule,
      stages: config.stages,
      microBatches: config.workers,
      microBatchSize: config.batch,
      model: { module: new URL(`./tfjs-model.${ext}`, import.meta.url), options: { seed: config.seed } },
      optimizer: { kind: 'sgd', lr: config.lr, momentum: config.momentum },
      data: { inputs: train.inputs, labels: train.labels, features: 784 },
      seed: config.seed,
    });
    try {
      let wallMs = 0;
      let rounds = 0;
      for (let e = 0; e < config.epochs; e++) {
        const r = await trainer.trainEpoch();
        wallMs += r.wallMs;
        rounds += r.rounds;
      }
      // The parts' weights into tfjs models of the same parts, chained: the whole CNN.
      const { TfjsParams } = await import('sapipe/tfjs');
      const weights = await trainer.weights();
      const parts = weights.map((_, k) => mnistCnn(tf, config.seed, k, config.stages));
      parts.forEach((m, k) => {
        const tp = TfjsParams.fromModel(tf, m);
        tp.params.weights.array.set(weights[k]!);
        tp.writeWeights();
        tp.params.dispose();
      });
      const accuracy = cnnAccuracy(tf, parts, test.inputs, test.labels);
      parts.forEach((m) => disposeModel(tf, m));
      add({ run: `${schedule} x${config.stages} stages`, kind: 'pipeline', accuracy, wallMs, samplesPerSec: (rounds * global) / (wallMs / 1000), adapterShare: undefined, stepMs: undefined });
    } finally {
      await trainer.dispose();
    }
  }
  return {
    config: { ...config, trainSamples, testSamples: testSet.count, cores: availableParallelism(), backend: tf.getBackend() },
    runs,
  };
}
