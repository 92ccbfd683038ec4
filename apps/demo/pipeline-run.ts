/**
 * A whole pipeline-training run on the MNIST digits, as `sapipe train pipeline`, `sapipe bench
 * pipeline` and the accuracy study run it: train for some epochs with one schedule, test accuracy
 * after each, and the measured timeline of a round next to what the simulator predicts from the
 * stage costs the runtime measured.
 */
import { AVERAGING_LAYOUTS, type AveragingLayout, calibrateProfile, checkLayers, cnnLayers, type Dataset, DATA_PARALLEL_MODES, type LayerSpec, profileOnMachine, generatorLimits, type RuntimeSchedule, type ScheduleTrainerOption, SCHEDULES, type SmallBatchHyperparameters, type DataParallelMode, InvalidArgumentError, layerParams, measuredCosts, measuredResult, mlpLayers, OPTIMIZER_KINDS, type OptimizerKindName, OPTIMIZERS, partRanges, type PerPart, pipelinedBackpropScaling, type PipelineOptimizerSpec, type PipelineProfile, PipelineTrainer, type PipelineTrainerOptions, type RoundReport, RUNTIME_SCHEDULES, type RuntimeScheduleName, type Schedule, simulateSchedule, type SimulationCosts, type SimulationResult, WAVELET_FORMS, type WaveletForm, waveletMemory, type WaveletMemory } from 'sapipe';
import { checkInteger, checkNumber, checkOneOf } from 'sapipe/validate';
import { modelDataSets } from './datasets.js';
import { checkGptSize, describeGpt, type GptSize, gptSizeLayers } from './gpt-size.js';

/** The layer widths of the pipeline demo's MLP: deep enough that 4 stages each hold real work. */
export const PIPELINE_DEMO_SIZES = [784, 256, 256, 256, 256, 10] as const;

/** The most stages a demo run starts: each is a worker thread of this process. */
const MAX_DEMO_STAGES = 64;

/** @internal */
export interface MnistPipelineConfig {
  schedule: RuntimeScheduleName;
  stages: number;
  microBatches: number;
  microBatchSize: number;
  epochs: number;
  optimizer: OptimizerKindName;
  lr: number;
  momentum: number;
  seed: number;
  /** Training samples to use (the rest of the 80 % split is left out), or all. */
  trainSamples?: number;
  /** Batches per round (2BW). */
  iterations?: number;
  boundaries: 'measured' | 'params' | number[];
  /**
   * The model and its data: `mlp` (default), an MLP of `sizes` on the MNIST digits (80/20 split);
   * `cnn`, sapipe's small CNN (cnnLayers with `channels`, default 8,16) on Fashion-MNIST's
   * 60 000 training and 10 000 test images (Debian's dataset-fashion-mnist).
   */
  model?: PipelineModelName;
  sizes: readonly number[];
  /** `cnn`: the convolutions' output channels. */
  channels?: readonly number[];
  /** `gpt`: a byte-level GPT (gptLayers) on the text of Debian's fortunes, windows of `context` bytes. */
  gpt?: PipelineGptConfig;
  /** N parallel pipelines coupled by the data-parallel mode `dataParallel` (default 1, sync). */
  pipelines?: number;
  dataParallel?: DataParallelMode;
  /** AvgPipe: advance forward propagation depth A (default S-1). */
  advance?: number;
  /** AvgPipe: where its pipelines run (default `shared-stages`: the N pipelines share the S stage workers; `worker-per-replica`: N x S workers). */
  averagingLayout?: AveragingLayout;
  /** Wavelet: its form (default `model-parallel`; `data-parallel`: `stages` workers, each with a tick and a tock replica of the whole model). */
  form?: WaveletForm;
  /** Pipelined Backpropagation: spike compensation and linear weight prediction (default on). */
  spikeCompensation?: boolean;
  weightPrediction?: boolean;
  /** Where the stages run: `cpu` (default), `cuda:N`, or `auto` (see PipelineTrainerOptions.device). */
  device?: PipelineTrainerOptions['device'];
  /** Each worker thread's native kernel threads (see PipelineTrainerOptions.kernelThreads). */
  kernelThreads?: PipelineTrainerOptions['kernelThreads'];
}

/** How the runtime runs a schedule: its registry entry's runtime part. */
const runtimeOf = (schedule: RuntimeScheduleName): RuntimeSchedule => SCHEDULES[schedule].runtime;

/** Refuses an option of `schedule` that only some schedules' runs take (their registry entry's trainerOptions), naming them. */
function requireOwner(schedule: RuntimeScheduleName, option: ScheduleTrainerOption, message: (owners: RuntimeScheduleName[]) => string): void {
  if (runtimeOf(schedule).trainerOptions.includes(option)) return;
  throw new InvalidArgumentError(message(RUNTIME_SCHEDULES.filter((name) => runtimeOf(name).trainerOptions.includes(option))));
}

/** The reference of Pipelined Backpropagation's small-batch rule, from its registry entry (bench/RESULTS.md). */
export const PIPELINED_BACKPROP_REFERENCE: SmallBatchHyperparameters = (() => {
  const sgd = runtimeOf('pipelined-backprop').defaultSgd;
  if (!('smallBatchRule' in sgd)) throw new Error('the registry gives pipelined-backprop no small-batch rule');
  return sgd.smallBatchRule;
})();

/**
 * @internal The learning rate and momentum a run takes when the user gives neither, and why:
 * Adam and AdamW 0.001; SGD the schedule's rate above; Pipelined Backpropagation with SGD the
 * small-batch rule of ALGORITHMS.md section 4 from PIPELINED_BACKPROP_REFERENCE to the
 * micro-batch size (at 16: lr 8.2e-4, momentum 0.9869, 94.25 % after 3 epochs where lr 0.05 and
 * 0.02 diverge; at 1: lr 3.2e-6, momentum 0.99918).
 */
export function pipelineDefaults(schedule: RuntimeScheduleName, optimizer: MnistPipelineConfig['optimizer'], microBatchSize: number): { lr: number; momentum: number; note: string } {
  if (optimizer !== 'sgd') return { lr: OPTIMIZERS[optimizer].defaultLr, momentum: 0.9, note: `lr ${OPTIMIZERS[optimizer].defaultLr}, the default for ${optimizer}` };
  const sgd = runtimeOf(schedule).defaultSgd;
  if ('smallBatchRule' in sgd) {
    const r = sgd.smallBatchRule;
    const scaled = pipelinedBackpropScaling(r, microBatchSize);
    return {
      lr: scaled.lr,
      momentum: scaled.momentum,
      note: `lr ${scaled.lr.toPrecision(4)} and momentum ${scaled.momentum.toPrecision(6)}: the small-batch rule from lr ${r.lr}, momentum ${r.momentum} at batch ${r.batch} to the micro-batch of ${microBatchSize} (one update per micro-batch); give --lr and --momentum to override`,
    };
  }
  return { lr: sgd.lr, momentum: 0.9, note: `lr ${sgd.lr}, the default SGD rate for ${schedule}` };
}

/** @internal The models `train pipeline --model` takes. */
export const PIPELINE_MODELS = ['mlp', 'cnn', 'gpt'] as const;
/** @internal */
export type PipelineModelName = (typeof PIPELINE_MODELS)[number];
/** @internal The GPT's size: transformer blocks, width, attention heads, context (bytes). */
export type PipelineGptConfig = GptSize;
/** @internal The GPT the study asks for: 4 blocks of width 128, 4 heads, 128 bytes of context. */
export const PIPELINE_GPT_DEFAULTS: PipelineGptConfig = { blocks: 4, dim: 128, heads: 4, context: 128 };
/** @internal The CNN's default convolution channels. */
export const PIPELINE_CNN_CHANNELS = [8, 16] as const;

/** @internal The layers of the run's model. */
export function modelLayers(c: MnistPipelineConfig): LayerSpec[] {
  const model = c.model ?? 'mlp';
  if (model === 'mlp') return mlpLayers(c.sizes);
  if (model === 'gpt') return gptSizeLayers(c.gpt ?? PIPELINE_GPT_DEFAULTS);
  return cnnLayers({ channels: 1, height: 28, width: 28 }, c.channels ?? PIPELINE_CNN_CHANNELS, 10);
}

/** @internal The run's model and data in words: `MLP 784-256-10 on MNIST`, `CNN conv 8,16 on Fashion-MNIST`. */
export function describeModel(c: MnistPipelineConfig): string {
  const model = c.model ?? 'mlp';
  if (model === 'gpt') return describeGpt(c.gpt ?? PIPELINE_GPT_DEFAULTS);
  return model === 'mlp' ? `MLP ${c.sizes.join('-')} on MNIST` : `CNN (conv ${(c.channels ?? PIPELINE_CNN_CHANNELS).join(',')}, 3x3, max-pool 2; linear to 10) on Fashion-MNIST`;
}

/** The training and test sets of the run's model. */
function modelData(c: MnistPipelineConfig): { train: Dataset; test: Dataset } {
  return modelDataSets(c.model ?? 'mlp', c.seed, (c.gpt ?? PIPELINE_GPT_DEFAULTS).context);
}

/** @internal */
export const MNIST_PIPELINE_DEFAULTS: MnistPipelineConfig = {
  schedule: '1f1b',
  stages: 4,
  microBatches: 8,
  microBatchSize: 16,
  epochs: 3,
  optimizer: 'sgd',
  lr: 0.05,
  momentum: 0.9,
  seed: 1,
  boundaries: 'measured',
  sizes: PIPELINE_DEMO_SIZES,
};

/**
 * @internal What the measured-vs-simulated comparison means with parallel pipelines: the runtime
 * runs each on its own workers and measures pipeline 0; the simulator puts AvgPipe's N pipelines
 * on the same S devices (as the paper and the tuner do) and the other schedules' one pipeline.
 */
export function parallelPipelinesNote(c: MnistPipelineConfig): string | undefined {
  const runtime = runtimeOf(c.schedule);
  if (runtime.coupling === 'workers') return `measured and simulated: every one of the ${c.stages} data-parallel workers (a row each, the whole model on each)`;
  if (c.form === 'data-parallel') return `measured and simulated: every one of the ${c.stages} data-parallel workers (a row each, its tick and tock replicas of the whole model)`;
  const n = c.pipelines ?? runtime.defaultPipelines;
  if (n === 1) return undefined;
  if (runtime.coupling === 'elastic-averaging' && averagingLayoutOf(c) === 'shared-stages')
    return typeof c.device === 'string' && c.device.startsWith('cuda')
      ? `measured and simulated: the ${n} pipelines sharing ${c.stages} stages on the device (layout shared-stages), each stage's row every pipeline's passes, a stream per stage and pipeline`
      : `measured and simulated: the ${n} pipelines sharing ${c.stages} stage worker threads (layout shared-stages), each worker's row every pipeline's passes`;
  return runtime.coupling === 'elastic-averaging'
    ? `measured: pipeline 0 of ${n}, each pipeline on its own ${c.stages} worker threads (layout worker-per-replica); simulated: the ${n} pipelines sharing ${c.stages} devices (per-device activations are ${n}x a worker's)`
    : `measured and simulated: pipeline 0 of ${n}, each on its own ${c.stages} worker threads`;
}

/** @internal AvgPipe's layout of a run: the one asked for, or the trainer's default; undefined for the other schedules. */
export function averagingLayoutOf(c: MnistPipelineConfig): AveragingLayout | undefined {
  return runtimeOf(c.schedule).coupling === 'elastic-averaging' ? (c.averagingLayout ?? AVERAGING_LAYOUTS[0]) : undefined;
}

/**
 * @internal How a run's parallel pipelines are combined, in words, or undefined for one pipeline:
 * AvgPipe's by elastic averaging, the others' stage replicas by their data-parallel mode.
 */
export function pipelinesCoupling(c: MnistPipelineConfig): string | undefined {
  const runtime = runtimeOf(c.schedule);
  if (runtime.coupling === 'workers') return `${c.stages} data-parallel workers, each holding the whole model, in data-parallel mode ${c.dataParallel ?? 'sapipe-wp'}`;
  if (c.form === 'data-parallel') return `${c.stages} data-parallel workers, each holding two replicas of the whole model (tick, tock), each wave all-reduced over the workers`;
  const n = c.pipelines ?? runtime.defaultPipelines;
  if (n === 1) return undefined;
  return runtime.coupling === 'elastic-averaging'
    ? `${n} parallel pipelines coupled by elastic averaging, layout ${averagingLayoutOf(c)}`
    : `${n} parallel pipelines whose stage replicas combine gradients in data-parallel mode ${c.dataParallel ?? 'sync'}`;
}

/** @internal */
export function checkMnistPipelineConfig(c: MnistPipelineConfig): MnistPipelineConfig {
  checkOneOf(c.schedule, '--schedule', RUNTIME_SCHEDULES);
  checkInteger(c.stages, '--stages', 1, MAX_DEMO_STAGES);
  checkInteger(c.microBatches, '--microbatches', 1, generatorLimits.microBatches);
  checkInteger(c.microBatchSize, '--microbatch-size', 1, 8192);
  checkInteger(c.epochs, '--epochs', 1, 1000);
  checkOneOf(c.optimizer, '--optimizer', OPTIMIZER_KINDS);
  checkNumber(c.lr, '--lr', 0, 10, { loOpen: true });
  checkNumber(c.momentum, '--momentum', 0, 1, { hiOpen: true });
  checkInteger(c.seed, '--seed', 0, 2 ** 31 - 1);
  if (c.trainSamples !== undefined) checkInteger(c.trainSamples, '--train-samples', 1, 1 << 24);
  if (c.iterations !== undefined) checkInteger(c.iterations, '--iterations', 1, generatorLimits.iterations);
  if (c.pipelines !== undefined) checkInteger(c.pipelines, '--pipelines', 1, generatorLimits.pipelines);
  if (c.advance !== undefined) checkInteger(c.advance, '--advance', 0, generatorLimits.microBatches);
  if (c.dataParallel !== undefined) checkOneOf(c.dataParallel, '--dp-mode', DATA_PARALLEL_MODES);
  if (c.averagingLayout !== undefined) {
    checkOneOf(c.averagingLayout, '--averaging-layout', AVERAGING_LAYOUTS);
    requireOwner(c.schedule, 'averaging', (owners) => `--averaging-layout sets where ${owners.join(', ')}'s pipelines run; use it with --schedule ${owners[0]}`);
  }
  if (c.form !== undefined) {
    checkOneOf(c.form, '--form', WAVELET_FORMS);
    requireOwner(c.schedule, 'form', (owners) => `--form picks ${owners.join(', ')}'s form; use it with --schedule ${owners[0]}`);
  }
  if (c.spikeCompensation === false || c.weightPrediction === false)
    requireOwner(c.schedule, 'pipelinedBackprop', (owners) => `--no-spike-compensation and --no-weight-prediction switch off parts of ${owners.join(', ')}; use them with --schedule ${owners[0]}`);
  if (c.sizes.length - 1 < 1) throw new InvalidArgumentError('the model needs at least one layer');
  if (c.model !== undefined) checkOneOf(c.model, '--model', PIPELINE_MODELS);
  if (c.gpt !== undefined) checkGptSize(c.gpt);
  if (c.channels !== undefined) {
    if (!Array.isArray(c.channels) || c.channels.length === 0) throw new InvalidArgumentError('--channels must list the convolutions\' output channels, e.g. 8,16');
    c.channels.forEach((n, i) => checkInteger(n, `--channels[${i}]`, 1, 1024));
  }
  if (c.device !== undefined && typeof c.device !== 'string') throw new InvalidArgumentError(`--device must be cpu, cuda:N or auto, got ${typeof c.device}`);
  return c;
}

/** @internal */
export interface MnistPipelineEpoch {
  epoch: number;
  loss: number;
  /** Test accuracy (the GPT: the share of next bytes predicted right). */
  accuracy: number;
  wallMs: number;
  /** The GPT: the mean loss per byte of the held-out text, and its perplexity. */
  validationLoss?: number;
  perplexity?: number;
}

/** @internal */
export interface MnistPipelineResult {
  config: MnistPipelineConfig;
  /** Where the stages ran, and why there. */
  device: { readonly device: string; readonly reason: string };
  /** Each worker thread's kernel threads (`auto` resolved), or `shared`. */
  kernelThreads: number | 'shared';
  /** AvgPipe: the layout that ran (PipelineTrainer.averagingLayout); undefined for the other schedules. */
  averagingLayout: AveragingLayout | undefined;
  boundaries: readonly number[];
  epochs: MnistPipelineEpoch[];
  trainSamples: number;
  testSamples: number;
  /** A round of the last epoch (the median by wall time), measured. */
  measured: SimulationResult;
  /** The simulator's prediction from the stage costs measured over the last epoch. */
  simulated: SimulationResult;
  /** Wall time of training (all epochs), ms. */
  trainMs: number;
  /** Per-action overhead of the runtime on the measured round: time between actions, and in sends/stash bookkeeping. */
  overhead: { perActionMs: number; shareOfRound: number };
  peakStashed: readonly number[];
  /** Predicted weight copies per stage, in the typical round. */
  predictedCopies: readonly number[];
  /** Stored micro-batch activations per stage at their peak, in the typical round. */
  peakActivations: readonly number[];
  /**
   * Wavelet's data-parallel form, per worker in the typical round: each wave's peak stored
   * activations (micro-batches, bytes), the worker's, and the comparison with plain data
   * parallelism at the same micro-batch (waveletMemory; plain's peak: one replica's forward of b
   * samples, which is a wave's own peak). Absent for the other schedules and forms.
   */
  waves?: readonly { tick: { peakActivations: number; peakActivationBytes: number }; tock: { peakActivations: number; peakActivationBytes: number }; worker: { peakActivations: number; peakActivationBytes: number }; comparison: WaveletMemory | undefined }[];
  /** The run as a tuner profile (docs/pipeline.md): each stage's measured forward and backward per micro-batch, and its sizes. */
  profile: PipelineProfile;
}

/**
 * The tuner's profile of a run: per stage (the parts it holds), the measured median forward and
 * backward time of a micro-batch, the activation it sends, its weights and its optimizer state
 * (SGD with momentum: one buffer; Adam/AdamW: two), the activations a micro-batch keeps until its
 * backward (the parts' input and layer outputs), at the run's micro-batch size; a pipeline's batch
 * is the run's M micro-batches. `overheadMs`, the part of each pass that does not shrink with the
 * micro-batch, is the runtime's measured time between actions (bounded by the smallest pass).
 */
function runProfile(c: MnistPipelineConfig, schedule: Schedule, boundaries: readonly number[], costs: SimulationCosts, perActionMs: number): PipelineProfile {
  const layers = modelLayers(c);
  const params = layerParams(layers);
  const widths = checkLayers(layers);
  const ranges = partRanges(layers.length, boundaries);
  const stateCopies = OPTIMIZERS[c.optimizer].stateBuffers({ momentum: c.momentum });
  const stages = Array.from({ length: schedule.stages }, (_, k) => {
    const parts = ranges.map((_, j) => j).filter((j) => (schedule.actions[k] ?? []).some((a) => a.kind === 'forward' && a.part === j));
    const weightBytes = parts.reduce((n, j) => n + 4 * params.slice(ranges[j]![0], ranges[j]![1]).reduce((a, b) => a + b, 0), 0);
    const sum = (x: PerPart | undefined): number => parts.reduce((n, j) => n + (typeof x === 'number' ? x : (x?.[j] ?? 0)), 0);
    return {
      forwardMs: sum(costs.forward),
      backwardMs: sum(costs.backward),
      activationBytes: 4 * c.microBatchSize * widths[ranges[parts.at(-1) ?? 0]![1]]!,
      storedActivationBytes: parts.reduce((n, j) => n + 4 * c.microBatchSize * widths.slice(ranges[j]![0], ranges[j]![1] + 1).reduce((a, b) => a + b, 0), 0),
      weightBytes,
      optimizerStateBytes: stateCopies * weightBytes,
    };
  });
  const smallest = Math.min(...stages.flatMap((st) => [st.forwardMs, st.backwardMs]));
  return { stages, microBatchSize: c.microBatchSize, batchSize: c.microBatches * c.microBatchSize, overheadMs: Math.max(0, Math.min(perActionMs, smallest)) };
}

/** Runtime overhead of a round: on each stage, the time not spent in an action (gaps) plus in posting sends; the worst stage over the makespan. */
export function roundOverhead(report: RoundReport): { perActionMs: number; shareOfRound: number } {
  let worst = 0;
  let total = 0;
  let actions = 0;
  let makespan = 0;
  for (const row of report.timeline) for (const t of row) makespan = Math.max(makespan, t.end);
  for (const row of report.timeline) {
    let overhead = 0;
    let previous = row[0]?.start ?? 0;
    for (const t of row) {
      overhead += Math.max(0, t.start - previous);
      if (t.action.kind === 'sendActivation' || t.action.kind === 'sendGradient' || t.action.kind === 'stashWeights' || t.action.kind === 'restoreWeights' || t.action.kind === 'predictWeights')
        overhead += t.end - t.start;
      previous = t.end;
    }
    worst = Math.max(worst, overhead);
    total += overhead;
    actions += row.length;
  }
  return { perActionMs: actions > 0 ? total / actions : 0, shareOfRound: makespan > 0 ? worst / makespan : 0 };
}

/**
 * @internal Trains on MNIST with one schedule; `onEpoch` after each epoch's evaluation. With
 * `machineProfile` (and one pipeline of one part per stage), `profile` is the machine-aware one:
 * each part timed alone at several micro-batch sizes and fitted, the cores a pass uses and the
 * local link measured, then brought to the run's measured costs (calibrateProfile).
 */
export async function runMnistPipeline(config: MnistPipelineConfig, onEpoch?: (e: MnistPipelineEpoch) => void, options: { machineProfile?: boolean } = {}): Promise<MnistPipelineResult> {
  const c = checkMnistPipelineConfig(config);
  const { train, test } = modelData(c);
  const n = Math.min(train.count, c.trainSamples ?? train.count);
  const optimizer: PipelineOptimizerSpec = c.optimizer === 'sgd' ? { kind: 'sgd', lr: c.lr, momentum: c.momentum } : { kind: c.optimizer, lr: c.lr };
  const trainer = await PipelineTrainer.create({
    schedule: c.schedule,
    stages: c.stages,
    microBatches: c.microBatches,
    microBatchSize: c.microBatchSize,
    ...(c.iterations !== undefined ? { iterations: c.iterations } : {}),
    ...(c.pipelines !== undefined ? { pipelines: c.pipelines } : {}),
    ...(c.advance !== undefined ? { advance: c.advance } : {}),
    ...(c.dataParallel !== undefined ? { dataParallel: { mode: c.dataParallel } } : {}),
    ...(c.averagingLayout !== undefined ? { averaging: { layout: c.averagingLayout } } : {}),
    ...(c.form !== undefined ? { form: c.form } : {}),
    ...(runtimeOf(c.schedule).trainerOptions.includes('pipelinedBackprop') ? { pipelinedBackprop: { spikeCompensation: c.spikeCompensation ?? true, weightPrediction: c.weightPrediction ?? true } } : {}),
    model: { layers: modelLayers(c), seed: c.seed, boundaries: c.boundaries },
    optimizer,
    data: { inputs: train.inputs.subarray(0, n * train.features), labels: train.labels.subarray(0, n * (train.labels.length / train.count)), features: train.features },
    seed: c.seed,
    timeoutMs: 60_000,
    ...(c.device !== undefined ? { device: c.device } : {}),
    ...(c.kernelThreads !== undefined ? { kernelThreads: c.kernelThreads } : {}),
  });
  try {
    const epochs: MnistPipelineEpoch[] = [];
    let last: RoundReport[] = [];
    let lastWallMs = 0;
    let trainMs = 0;
    for (let e = 0; e < c.epochs; e++) {
      const rounds: RoundReport[] = [];
      const report = await trainer.trainEpoch((r) => rounds.push(r));
      trainMs += report.wallMs;
      let entry: MnistPipelineEpoch;
      if (c.model === 'gpt') {
        // the test accuracy and the validation loss from one pass over the test set
        const { accuracy, loss } = await trainer.evaluateAccuracyAndLoss(test.inputs, test.labels);
        entry = { epoch: e + 1, loss: report.loss, accuracy, wallMs: report.wallMs, validationLoss: loss, perplexity: Math.exp(loss) };
      } else entry = { epoch: e + 1, loss: report.loss, accuracy: await trainer.evaluate(test.inputs, test.labels), wallMs: report.wallMs };
      epochs.push(entry);
      onEpoch?.(entry);
      last = rounds;
      lastWallMs = report.wallMs;
    }
    const byWall = [...last].sort((a, b) => a.wallMs - b.wallMs);
    const typical = byWall[Math.floor(byWall.length / 2)]!;
    const measured = measuredResult(trainer.schedule, trainer.analysis, typical.timeline, typical);
    const costs = measuredCosts(trainer.schedule, last.map((r) => r.timeline));
    const simulated = simulateSchedule(trainer.schedule, costs);
    const boundaries = trainer.model.kind === 'sequential' ? trainer.model.boundaries : [];
    let profile = runProfile(c, trainer.schedule, boundaries, costs, roundOverhead(typical).perActionMs);
    const onePartPerStage = trainer.schedule.pipelines === 1 && trainer.schedule.parts === trainer.schedule.stages && trainer.schedule.stages > 1;
    if (options.machineProfile && onePartPerStage) {
      const machine = await profileOnMachine(modelLayers(c), boundaries, {
        microBatchSize: c.microBatchSize,
        batchSize: c.microBatches * c.microBatchSize,
        optimizerStateCopies: OPTIMIZERS[c.optimizer].stateBuffers({ momentum: c.momentum }),
        kernelThreads: trainer.kernelThreads,
      });
      profile = calibrateProfile(machine, trainer.schedule, last.map((r) => r.timeline));
      // what a round costs beyond its timeline (starting it on every worker, collecting its report)
      const timelines = last.reduce((n, r) => n + measuredResult(trainer.schedule, trainer.analysis, r.timeline).makespan, 0);
      profile = { ...profile, roundOverheadMs: Math.max(0, (lastWallMs - timelines) / Math.max(1, last.length)) };
    }
    return {
      config: c,
      device: trainer.device,
      kernelThreads: trainer.kernelThreads,
      averagingLayout: trainer.averagingLayout,
      boundaries,
      epochs,
      trainSamples: n,
      testSamples: test.count,
      measured,
      simulated,
      trainMs,
      overhead: roundOverhead(typical),
      peakStashed: typical.peakStashed,
      predictedCopies: typical.predictedCopies,
      peakActivations: typical.peakActivations,
      ...(c.form === 'data-parallel' && typical.replicaPeaks ? { waves: wavePeaks(typical, c.microBatchSize) } : {}),
      profile,
    };
  } finally {
    await trainer.dispose();
  }
}

/** @internal Wavelet's data-parallel workers' peaks in a round (see MnistPipelineResult.waves). */
export function wavePeaks(r: RoundReport, microBatchSize: number): NonNullable<MnistPipelineResult['waves']> {
  return r.replicaPeaks!.map((replicas, x) => {
    const [tick, tock] = replicas as [NonNullable<RoundReport['replicaPeaks']>[number][number], NonNullable<RoundReport['replicaPeaks']>[number][number]];
    const worker = { peakActivations: r.peakActivations[x]!, peakActivationBytes: r.peakActivationBytes[x]! };
    // Plain data parallelism at micro-batch b holds one replica's forward of b samples: a wave's own peak.
    const plain = Math.max(tick.peakActivationBytes, tock.peakActivationBytes);
    const comparison = plain > 0 ? waveletMemory({ waves: [tick.peakActivationBytes, tock.peakActivationBytes], worker: worker.peakActivationBytes, plain, microBatchSize }) : undefined;
    return { tick: { peakActivations: tick.peakActivations, peakActivationBytes: tick.peakActivationBytes }, tock: { peakActivations: tock.peakActivations, peakActivationBytes: tock.peakActivationBytes }, worker, comparison };
  });
}
