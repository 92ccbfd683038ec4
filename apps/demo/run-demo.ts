/**
 * The driver of `sapipe demo`: loads MNIST once into shared memory, then for each mode in turn
 * spawns the worker ranks (compiled worker.js, as the all-reduce benchmark does), collects the
 * per-epoch test accuracy from rank 0 and every rank's timings, and summarises them per mode.
 * Modes run one after another so they never compete for the cores (or the GPUs). On GPUs the
 * workers are NCCL ranks, one per GPU, whose unique id goes through a rendezvous store this
 * thread serves for the mode.
 */
import type { Worker } from 'node:worker_threads';

import { createRendezvous, type Dataset, InvalidArgumentError, type Rendezvous, spawnLocalRanks } from 'sapipe';
import { checkDemoConfig, type DemoConfig, type DemoVariant } from './config.js';
import { DEMO_CPU, type DemoDevice } from './device.js';
import { modelDataSets } from './datasets.js';
import { DEMO_GPT_DEFAULTS, demoModelParams, describeDemoModel, type DemoModelName } from './models.js';
// Types only: importing worker.ts for real would run a rank in this thread.
import type { DemoWorkerData, DemoWorkerMessage } from './worker.js';

export interface DemoModeResult {
  /** The variant's label: the mode, or e.g. `sapipe-wp:local+dc`. */
  mode: string;
  variant: DemoVariant;
  /** Test accuracy after each epoch (index 0: epoch 1). */
  epochAccuracy: number[];
  /** The models that say (the CNN, the GPT): mean cross-entropy on the test data after each epoch, and after the last. */
  epochLoss?: number[];
  finalLoss?: number;
  finalAccuracy: number;
  /** Training wall time: the slowest rank's, evaluation excluded. */
  wallMs: number;
  /** Training samples processed per second over all workers. */
  samplesPerSec: number;
  /** Wall time of sync divided by this mode's (undefined when sync did not run). */
  speedup: number | undefined;
  /** Sum over steps of the time step() waited for communication, per worker, averaged over workers. */
  exposedCommMs: number;
  /** Per step, averaged over workers: time waiting for communication and the rest (compute, update). */
  stepMs: { compute: number; comm: number };
  /**
   * Steady-state step time: the time in the step loop per step, averaged over workers, without the
   * end-of-epoch flush (which exposes one whole all-reduce per epoch) and without evaluation.
   */
  loopStepMs: number;
  steps: number;
}

export interface DemoResult {
  /** The configuration run; `gpt`, the GPT's size, is there whenever the model is the GPT (defaults filled in). */
  config: DemoConfig & { model: DemoModelName; description: string; params: number; trainSamples: number; testSamples: number; device: DemoDevice };
  modes: DemoModeResult[];
}

export interface DemoProgress {
  /** The variant's label. */
  mode: string;
  epoch: number;
  epochs: number;
  accuracy: number;
}

/** @internal A copy of `a` in a SharedArrayBuffer, so N worker threads read one copy of the data set. */
export function sharedCopy<T extends Float32Array | Uint8Array>(a: T): T {
  const out = new (a.constructor as new (b: SharedArrayBuffer) => T)(new SharedArrayBuffer(a.byteLength));
  out.set(a);
  return out;
}

function shared(d: Dataset): { inputs: Float32Array; labels: Uint8Array; features: number } {
  return { inputs: sharedCopy(d.inputs), labels: sharedCopy(d.labels), features: d.features };
}

async function runMode(
  variant: DemoVariant,
  config: DemoConfig,
  train: { inputs: Float32Array; labels: Uint8Array; features: number },
  test: { inputs: Float32Array; labels: Uint8Array; features: number },
  onProgress: (p: DemoProgress) => void,
): Promise<Omit<DemoModeResult, 'speedup'>> {
  const ext = import.meta.url.endsWith('.ts') ? 'ts' : 'js';
  const mode = variant.label;
  const device = config.device ?? DEMO_CPU;
  // The driver is the store's rank 0, worker r its rank r + 1; a fresh store per mode, so the
  // ranks of one mode never meet the keys of the last.
  const store: Rendezvous | undefined = device.kind === 'cuda' ? await createRendezvous({ rank: 0, worldSize: config.workers + 1, port: 0 }) : undefined;
  const workerData: Omit<DemoWorkerData, 'sapipeLocal'> = {
    model: config.model ?? 'mlp',
    gpt: config.gpt,
    variant,
    lambda: config.lambda,
    dcKind: config.dcKind,
    overlap: config.overlap ?? true,
    topk: config.topk,
    epochs: config.epochs,
    batch: config.batch,
    lr: config.lr,
    momentum: config.momentum,
    seed: config.seed,
    emulate: config.emulate,
    features: train.features,
    trainInputs: train.inputs,
    trainLabels: train.labels,
    testInputs: test.inputs,
    testLabels: test.labels,
    gpu: store ? { ranks: device.ranks, storePort: store.port } : undefined,
  };
  let workers: Worker[];
  try {
    workers = spawnLocalRanks(new URL(`./worker.${ext}`, import.meta.url), config.workers, { workerData: workerData as unknown as Record<string, unknown> });
  } catch (error) {
    await store?.close();
    throw error;
  }
  const epochAccuracy: number[] = [];
  const epochLoss: number[] = [];
  try {
    const done = await gatherRanks<Extract<DemoWorkerMessage, { kind: 'done' }>>(workers, mode, (m: DemoWorkerMessage) => {
      if (m.kind !== 'epoch') return;
      epochAccuracy.push(m.accuracy);
      if (m.loss !== undefined) epochLoss.push(m.loss);
      onProgress({ mode, epoch: m.epoch, epochs: config.epochs, accuracy: m.accuracy });
    });
    const wallMs = Math.max(...done.map((d) => d.trainMs));
    const steps = done[0]!.steps;
    const exposedCommMs = done.reduce((a, d) => a + d.commMs, 0) / done.length;
    const samples = done.reduce((a, d) => a + d.samples, 0);
    const meanTrainMs = done.reduce((a, d) => a + d.trainMs, 0) / done.length;
    return {
      mode,
      variant,
      epochAccuracy,
      finalAccuracy: epochAccuracy[epochAccuracy.length - 1] ?? 0,
      ...(epochLoss.length > 0 ? { epochLoss, finalLoss: epochLoss[epochLoss.length - 1]! } : {}),
      wallMs,
      samplesPerSec: samples / (wallMs / 1000),
      exposedCommMs,
      stepMs: { comm: exposedCommMs / steps, compute: Math.max(0, meanTrainMs - exposedCommMs) / steps },
      loopStepMs: done.reduce((a, d) => a + d.loopMs, 0) / done.length / steps,
      steps,
    };
  } finally {
    await Promise.all(workers.map((w) => w.terminate()));
    await store?.close();
  }
}

/**
 * @internal Waits until every worker rank has posted its `{ kind: 'done', rank }` message; an
 * `{ kind: 'error' }` message, an error event or a rank exiting before it is done fails the wait.
 * Other messages go to `onOther`.
 */
export function gatherRanks<D extends { kind: 'done'; rank: number }>(workers: readonly Worker[], label: string, onOther: (message: never) => void = () => {}): Promise<D[]> {
  return new Promise<D[]>((resolve, reject) => {
    const results: D[] = [];
    workers.forEach((w, rank) => {
      w.on('error', reject);
      w.on('exit', (code) => {
        if (!results.some((r) => r.rank === rank)) reject(new Error(`demo worker ${rank} (${label}) exited with code ${code} before finishing`));
      });
      w.on('message', (m: { kind: string; rank?: number; error?: string }) => {
        if (m.kind === 'error') reject(new Error(`demo worker ${m.rank} (${label}): ${m.error}`));
        else if (m.kind === 'done') {
          results.push(m as unknown as D);
          if (results.length === workers.length) resolve(results);
        } else onOther(m as never);
      });
    });
  });
}

export async function runDemo(config: DemoConfig, onProgress: (p: DemoProgress) => void = () => {}): Promise<DemoResult> {
  checkDemoConfig(config);
  // Each worker is one thread; a multi-threaded GEMM per worker would oversubscribe the cores.
  process.env.SAPIPE_NUM_THREADS ??= '1';
  const model = config.model ?? 'mlp';
  const gpt = config.gpt ?? DEMO_GPT_DEFAULTS;
  // The MLP's digits are split 80/20 (seeded); Fashion-MNIST comes with its 60 000 / 10 000 split.
  const { train: fullTrain, test: testSet } = modelDataSets(model, config.seed, gpt.context);
  const trainSamples = Math.min(config.trainSamples ?? fullTrain.count, fullTrain.count);
  const train = shared({
    ...fullTrain,
    inputs: fullTrain.inputs.subarray(0, trainSamples * fullTrain.features),
    // One label per sample, or the GPT's `context` next bytes.
    labels: fullTrain.labels.subarray(0, trainSamples * (fullTrain.labels.length / fullTrain.count)),
    count: trainSamples,
  });
  if (Math.floor(trainSamples / config.workers) < 1)
    throw new InvalidArgumentError(`--train-samples ${trainSamples} leaves no sample for each of ${config.workers} workers`);
  const test = shared(testSet);
  const modes: Omit<DemoModeResult, 'speedup'>[] = [];
  for (const variant of config.modes) modes.push(await runMode(variant, config, train, test, onProgress));
  const sync = modes.find((m) => m.variant.mode === 'sync');
  return {
    config: {
      ...config,
      model,
      ...(model === 'gpt' ? { gpt: { ...gpt } } : {}),
      description: describeDemoModel(model, gpt),
      params: demoModelParams(model, gpt),
      trainSamples,
      testSamples: testSet.count,
      device: config.device ?? DEMO_CPU,
    },
    modes: modes.map((m) => ({ ...m, speedup: sync ? sync.wallMs / m.wallMs : undefined })),
  };
}

/**
 * How to read the exposed communication of a run on GPUs (empty on the CPU): the model's
 * operations are enqueued without waiting, and the NCCL step starts once the device has finished
 * the backward, so what step() waited for can hold some of the device's compute too.
 */
export function deviceWaitNote(result: DemoResult): string {
  if ((result.config.device as DemoDevice | undefined)?.kind !== 'cuda') return '';
  return 'On a GPU the forward and backward are enqueued without waiting and the all-reduce starts once the device has finished them, so the time step() waited can hold some of their compute as well.';
}

/**
 * What the measured speedups say, for the table's footnote and the report: the fastest staleness-1
 * mode against sync, within a 10 % band called "about the same" (this is one run on a shared
 * machine), and why.
 */
export function speedupNote(result: DemoResult): string {
  const pipelined = result.modes.filter((m) => m.speedup !== undefined && m.mode !== 'sync');
  if (pipelined.length === 0) return '';
  const best = pipelined.reduce((a, b) => (b.speedup! > a.speedup! ? b : a));
  const x = best.speedup!;
  // On GPUs there is no emulation to suggest: the link is NCCL's own. (Results made before the device
  // was recorded have none: the CPU.)
  const device = result.config.device as DemoDevice | undefined;
  const onGpu = device?.kind === 'cuda';
  const network = onGpu ? `NCCL on ${device.ranks.join(', ')}` : result.config.emulate ? 'the emulated network' : 'local shared-memory communication';
  const hint = result.config.emulate || onGpu ? '' : '; --gbps 1 (an emulated network) shows the overlap';
  if (x >= 1.1)
    return `The fastest staleness-1 mode (${best.mode}) ran ${x.toFixed(2)}x as fast as sync here: it overlaps each step's all-reduce with the next step's compute, which sync waits for, over ${network}.`;
  if (x > 0.9)
    return `The staleness-1 modes ran about as fast as sync here (best ${best.mode}, ${x.toFixed(2)}x): with ${network} there was little communication to hide${hint}.`;
  return `The staleness-1 modes ran slower than sync here (best ${best.mode}, ${x.toFixed(2)}x): their extra update work outweighed the little communication there was to hide over ${network}${hint}.`;
}
