/**
 * A pipeline job's plan: every check of a configuration (schedule, model, optimizer, data), done
 * once before any stage starts, and what each stage is given. Shared by the trainer of worker
 * threads and by stages started as processes (`sapipe launch`).
 */
import { availableParallelism } from 'node:os';

import { checkKernelThreads } from '../../kernel-threads.js';
import { OPTIMIZERS, checkOptimizerSpec, checkOptimizerValues } from '../../optim/registry.js';
import { DEFAULT_COMM_TIMEOUT_MS } from '../../comm/communicator.js';
import { resolveMode, type ResolvedMode } from '../../dataparallel/mode.js';
import { shuffledIndices } from '../../data/seeded-random.js';
import { chooseDevice } from '../../device/probe.js';
import { InvalidArgumentError, SizeMismatchError } from '../../errors.js';
import type { Device } from '../../nn/ops.js';
import { balancedBoundaries, checkLayers, layerParams, partRanges, type LayerSpec } from '../../nn/sequential.js';
import { checkInteger, checkKnownKeys, checkNumber, checkObject, checkOneOf, checkOptions, describeValue, optionKeys } from '../../validate.js';
import type { Schedule } from '../schedule.js';
import { WAVELET_FORMS, limits, type WaveletForm } from '../schedules/options.js';
import { generateSchedule, scheduleEntry, scheduleNames, type RuntimeSchedule, type ScheduleName, type ScheduleTrainerOption } from '../schedules/registry.js';
import { validateSchedule } from '../validate.js';
import { profileLayers } from './measure.js';
import { AVERAGING_LAYOUTS, type AveragingLayout, PIPELINE_LOSSES, type PipelineAveragingOptions, type PipelineData, type PipelineLoss, type PipelineDataParallelOptions, type PipelineModelSpec, type PipelineOptimizerSpec, type StageDescription, buildStageModel } from './stage-host.js';
import { RUNTIME_SCHEDULES, runtimeSchedule, type RuntimeScheduleName } from './weights.js';

/**
 * The model: sapipe's layers (`layers`, cut at `boundaries`: explicit layer indices, `'measured'`
 * (default: balanced by each layer's measured time) or `'params'` (balanced by parameter count)),
 * or a user module exporting `createStage(part, parts, options)`.
 *
 * @category Pipeline runtime
 */
export type PipelineModelOptions =
  | { layers: readonly LayerSpec[]; seed?: number; boundaries?: readonly number[] | 'measured' | 'params' }
  | { module: string | URL; options?: unknown };

const DATA_PARALLEL_KEYS = optionKeys<PipelineDataParallelOptions>({ mode: true, staleness: true, compensation: true, estimate: true, compensateEstimate: true, overlapUpdate: true });

/**
 * The schedules parallel pipelines run coupled by data parallelism (their registry entry's
 * `runtime.coupling`): synchronous ones, one step per round on every part. @category Pipeline runtime
 */
export const DATA_PARALLEL_SCHEDULES: readonly RuntimeScheduleName[] = RUNTIME_SCHEDULES.filter((name) => runtimeSchedule(name)!.coupling === 'data-parallel');
/** The schedules whose parallel pipelines are coupled by elastic averaging (AvgPipe). */
const AVERAGED_SCHEDULES: readonly RuntimeScheduleName[] = RUNTIME_SCHEDULES.filter((name) => runtimeSchedule(name)!.coupling === 'elastic-averaging');
/** Which schedule takes each of the trainer options that belong to one (`runtime.trainerOptions`). */
const OPTION_OWNERS: ReadonlyMap<ScheduleTrainerOption, RuntimeScheduleName> = new Map(
  RUNTIME_SCHEDULES.flatMap((name) => runtimeSchedule(name)!.trainerOptions.map((key) => [key, name] as const)),
);

/** @category Pipeline runtime */
export interface PipelineTrainerOptions {
  /** A schedule the runtime executes (see {@link RUNTIME_SCHEDULES}). */
  schedule: RuntimeScheduleName;
  /** S: stages (one worker each); for `sapipe`, its data-parallel workers (one row each, the whole model on each). */
  stages: number;
  /** M: micro-batches per round (a round is one pass over the schedule; for 2BW, per batch). */
  microBatches: number;
  /** Samples per micro-batch. */
  microBatchSize: number;
  /**
   * Batches per round (PipeDream-2BW). Default 3, as the schedule generator's: a round starts from
   * the weights the last one ended with, so at 1 every batch would read them fresh and 2BW would
   * train exactly as 1F1B; from 2 on, every batch after a round's first reads weights one update old.
   */
  iterations?: number;
  /** Model chunks per stage (interleaved 1F1B). Default 2. */
  virtualStages?: number;
  model: PipelineModelOptions;
  /** The optimizer of every part; the schedule adds its weight prediction (PipeOptim, SpecTrain). */
  optimizer: PipelineOptimizerSpec;
  /**
   * Training data: `inputs` holds samples of `features` values; `labels` the targets of the loss:
   * with `cross-entropy`, a class index per sample, or P per sample (a language model's next
   * tokens, the last part's output then P rows of logits); with `mse`, the last part's outputSize
   * reals per sample.
   */
  data: { inputs: Float32Array; labels: ArrayLike<number>; features: number };
  /** The last stage's loss: `cross-entropy` (default) or `mse` (see PipelineLoss). */
  loss?: PipelineLoss;
  /** Shuffle the samples every epoch (default true). */
  shuffle?: boolean;
  /** Seed of the shuffle (default 0). */
  seed?: number;
  /** Bound of every wait between stages, and of the trainer's waits for them, in ms. Default 30 000. */
  timeoutMs?: number;
  /**
   * N: parallel pipelines (N x S workers), each on its own micro-batches of every round (pipeline p
   * takes the p-th M x microBatchSize samples), their stage replicas combined by `dataParallel`, or
   * for `avgpipe` by elastic averaging (`averaging`). Default: the schedule's registry entry's
   * `runtime.defaultPipelines` (1; avgpipe 2). `sapipe` takes none: its workers are its `stages`.
   */
  pipelines?: number;
  /** AvgPipe: A, the advance forward propagation depth. Default S-1. */
  advance?: number;
  /**
   * Wavelet: its form (one of WAVELET_FORMS). `model-parallel` (default): S stages, the model cut
   * in S parts, every stage running every part. `data-parallel`: S workers (`stages`), each holding
   * the tick and the tock replica of the whole model with an optimizer each; each round, worker x's
   * wave w (pipeline 2x + w) takes the (2x + w)-th M x microBatchSize samples.
   */
  form?: WaveletForm;
  /**
   * AvgPipe: elastic averaging of each stage's replicas with their center copy, and where the
   * pipelines run (`layout`: `shared-stages`, the default, S workers each running its row for
   * every pipeline; or `worker-per-replica`, N x S workers).
   */
  averaging?: PipelineAveragingOptions;
  /**
   * How each stage's replicas combine gradients (default, with pipelines > 1: `{ mode: 'sync' }`,
   * which equals one pipeline on the concatenated batch). Synchronous schedules only
   * ({@link DATA_PARALLEL_SCHEDULES}); in the staleness-1 modes every part's update applies the
   * previous round's averaged gradient, with SAPipe's compensation and prediction. For `sapipe`,
   * the workers' mode: a staleness-1 one, default `{ mode: 'sapipe-wp' }`; each round is M
   * iterations whose all-reduce overlaps the next one, the last applied at the round's end.
   */
  dataParallel?: PipelineDataParallelOptions;
  /**
   * Pipelined Backpropagation: switch off spike compensation or linear weight prediction (both on
   * by default; off, a stage's step is plain SGD-momentum on a gradient `2(S-k)-1` updates late),
   * to measure what each buys.
   */
  pipelinedBackprop?: PipelinedBackpropOptions;
  /**
   * Where the stages run: `cpu` (default; a worker thread per stage), `cuda:N` (every stage on that
   * GPU, in this process: weights, gradients, optimizer state, activations, stashed and predicted
   * versions in device memory, transfers between stages device-to-device copies), or `auto`
   * (`cuda:0` where it is usable, see chooseDevice, else `cpu`). On a device: sapipe's layers,
   * one pipeline, schedules without all-reduces between stages; the rest is planned.
   */
  device?: Device | 'auto';
  /**
   * The native kernel threads of each worker thread (docs/pipeline.md, "Stages sharing cores"):
   * `auto` (default) splits this process's cores among the workers, `floor(cores / workers)` each
   * and at least 1, so each worker computes on a core set of its own; a number gives every worker
   * that many; `shared` leaves every worker on the process-wide pool, where their kernels take
   * turns job by job. Stages on a device run in this process and take none. A launched stage
   * (trainPipelineStage) is a process: `auto` splits the cores among the launcher's
   * `LOCAL_WORLD_SIZE` processes on its machine.
   */
  kernelThreads?: number | 'auto' | 'shared';
}

/** Pipelined Backpropagation's delay compensations, each on (true) by default. @category Pipeline runtime */
export interface PipelinedBackpropOptions {
  spikeCompensation?: boolean;
  weightPrediction?: boolean;
}
const PIPELINED_BACKPROP_KEYS = optionKeys<PipelinedBackpropOptions>({ spikeCompensation: true, weightPrediction: true });

/** @internal Every option of PipelineTrainer.create. */
export const TRAINER_OPTION_KEYS = optionKeys<PipelineTrainerOptions>({
  schedule: true,
  stages: true,
  microBatches: true,
  microBatchSize: true,
  iterations: true,
  virtualStages: true,
  model: true,
  optimizer: true,
  data: true,
  shuffle: true,
  seed: true,
  timeoutMs: true,
  pipelines: true,
  dataParallel: true,
  advance: true,
  averaging: true,
  form: true,
  pipelinedBackprop: true,
  device: true,
  loss: true,
  kernelThreads: true,
});

const isSequential = (m: PipelineModelOptions): m is Extract<PipelineModelOptions, { layers: readonly LayerSpec[] }> =>
  m !== null && typeof m === 'object' && Object.hasOwn(m, 'layers');

/** @internal A checked configuration and what each stage is given. */
export interface PipelinePlan {
  schedule: Schedule;
  model: PipelineModelSpec;
  descriptions: StageDescription[];
  data: PipelineData;
  samples: number;
  microBatchSize: number;
  shuffle: boolean;
  seed: number;
  timeoutMs: number;
  /** N parallel pipelines. */
  pipelines: number;
  /** How stage replicas combine gradients (when pipelines > 1 or asked for; with `workers`, always). */
  dataParallel: PipelineDataParallelOptions | undefined;
  /**
   * The schedule's rows are data-parallel workers (the `workers` coupling, SAPipe): one worker per
   * row, worker x runs row x as pipeline x (its share of each round's samples), and every worker's
   * part joins one DataParallelTrainer over all of them. Else N x S workers, worker p x S + s running
   * stage s of pipeline p.
   */
  rowsAreWorkers: boolean;
  /** AvgPipe: how stage replicas average with their center, and where the pipelines run. */
  averaging: Required<PipelineAveragingOptions> | undefined;
  /**
   * Workers: one per row (S) where the rows are workers or AvgPipe's pipelines share the stages
   * (`shared-stages`), else N x S, worker p x S + s running stage s of pipeline p.
   */
  workers: number;
  /** Where the stages run (`auto` resolved), and why. */
  device: Device;
  deviceReason: string;
  /** Each worker thread's kernel threads (`auto` resolved), or `shared`: the process-wide pool. */
  kernelThreads: number | 'shared';
}

/**
 * @internal Checks a configuration (a typed error names what is wrong) and plans the stages. `what`
 * names the caller in messages; `averagingLayout` is AvgPipe's layout where none is given.
 */
export async function planPipeline(
  options: PipelineTrainerOptions,
  what: string,
  keys: readonly string[] = TRAINER_OPTION_KEYS,
  averagingLayout: AveragingLayout = AVERAGING_LAYOUTS[0],
): Promise<PipelinePlan> {
  checkOptions(options, keys, `${what}(options)`);
  const name = checkOneOf(options.schedule, `${what}: schedule`, scheduleNames) as ScheduleName;
  const entry = scheduleEntry(name)!;
  if ('planned' in entry.runtime)
    throw new InvalidArgumentError(`${what}: the runtime does not run '${name}' yet (${entry.runtime.planned}); use one of ${RUNTIME_SCHEDULES.join(', ')}`);
  const runtime: RuntimeSchedule = entry.runtime;
  const stages = checkInteger(options.stages, `${what}: stages`, 1, limits.stages);
  // Wavelet's data-parallel form: its rows are workers too, each with two replicas (tick, tock).
  const form = options.form === undefined || !runtime.trainerOptions.includes('form') ? undefined : checkOneOf(options.form, `${what}: form`, WAVELET_FORMS);
  const waves = runtime.trainerOptions.includes('form') && (form ?? runtime.generatorOptions?.form) === 'data-parallel';
  const rowsAreWorkers = runtime.coupling === 'workers' || waves;
  if (rowsAreWorkers && options.pipelines !== undefined && options.pipelines !== stages)
    throw new InvalidArgumentError(`${what}: '${name}' runs one data-parallel worker per row, its stages (${stages}); leave out pipelines (got ${describeValue(options.pipelines)})`);
  const pipelines = rowsAreWorkers ? stages : checkInteger(options.pipelines ?? runtime.defaultPipelines, `${what}: pipelines`, 1, limits.pipelines);
  for (const [key, owner] of OPTION_OWNERS)
    if (options[key] !== undefined && !runtime.trainerOptions.includes(key))
      throw new InvalidArgumentError(`${what}: ${key} is an option of the ${owner} schedule, not of '${name}'`);
  const microBatches = checkInteger(options.microBatches, `${what}: microBatches`, 1, limits.microBatches);
  const microBatchSize = checkInteger(options.microBatchSize, `${what}: microBatchSize`, 1, 1 << 20);
  const timeoutMs = checkInteger(options.timeoutMs ?? DEFAULT_COMM_TIMEOUT_MS, `${what}: timeoutMs`, 1, 2 ** 31 - 1);
  const seed = checkInteger(options.seed ?? 0, `${what}: seed`, 0, 2 ** 32 - 1);
  const shuffle = options.shuffle ?? true;
  if (typeof shuffle !== 'boolean') throw new InvalidArgumentError(`${what}: shuffle must be a boolean, got ${describeValue(shuffle)}`);
  const averaged = runtime.coupling === 'elastic-averaging';
  const schedule = generateSchedule(name, {
    stages,
    microBatches,
    ...(options.iterations !== undefined ? { iterations: options.iterations } : {}),
    ...(options.virtualStages !== undefined ? { virtualStages: options.virtualStages } : {}),
    // AvgPipe's N pipelines are in its action lists; parallel pipelines of the other schedules each
    // run the one-pipeline list. (advance belongs to AvgPipe: refused above for the others.)
    ...(averaged ? { pipelines } : {}),
    ...(options.advance !== undefined ? { advance: options.advance } : {}),
    ...runtime.generatorOptions,
    ...(form !== undefined ? { form } : {}),
  });
  validateSchedule(schedule);
  checkOptimizer(options.optimizer, name, runtime, what);
  if (waves && options.dataParallel !== undefined)
    throw new InvalidArgumentError(`${what}: Wavelet's data-parallel form all-reduces each wave's gradient itself (synchronous); leave out dataParallel`);
  const dataParallel = averaged || waves
    ? undefined
    : rowsAreWorkers
      ? checkWorkersMode(options.dataParallel, pipelines, name, options.optimizer, what)
      : checkDataParallel(options.dataParallel, pipelines, name, runtime, options.optimizer, what);
  if (averaged && options.dataParallel !== undefined)
    throw new InvalidArgumentError(`${what}: ${name} couples its pipelines by elastic averaging (averaging), not dataParallel`);
  const averaging = averaged ? checkAveraging(options.averaging, pipelines, what, averagingLayout) : undefined;
  const pipelinedBackprop = runtime.trainerOptions.includes('pipelinedBackprop') ? checkPipelinedBackprop(options.pipelinedBackprop, what) : undefined;

  // The data set.
  const loss = checkOneOf(options.loss ?? 'cross-entropy', `${what}: loss`, PIPELINE_LOSSES);
  checkObject(options.data, `${what}: data`);
  checkKnownKeys(options.data, ['inputs', 'labels', 'features'], `${what}: data`);
  const { inputs, labels } = options.data;
  if (!(inputs instanceof Float32Array)) throw new InvalidArgumentError(`${what}: data.inputs must be a Float32Array (rows of features)`);
  if (labels === null || typeof labels !== 'object' || typeof labels.length !== 'number') throw new InvalidArgumentError(`${what}: data.labels must be an array of ${loss === 'mse' ? 'targets' : 'class indices'}`);
  const features = checkInteger(options.data.features, `${what}: data.features`, 1, 1 << 24);
  const samples = inputs.length / features;
  if (!Number.isInteger(samples) || samples < 1) throw new SizeMismatchError(`${what}: data.inputs holds ${inputs.length} values, not a whole number of samples of ${features} features`);
  const targetsPerSample = labels.length / samples;
  if (!Number.isInteger(targetsPerSample) || targetsPerSample < 1)
    throw new SizeMismatchError(`${what}: data.labels holds ${labels.length} values for ${samples} samples (${inputs.length} values of data.inputs / ${features} features); give the same number of targets for every sample`);
  // (Wavelet's data-parallel workers: two waves each, 2S pipelines.)
  const perRound = (waves ? schedule.pipelines : pipelines) * schedule.microBatches * microBatchSize;
  if (samples < perRound)
    throw new InvalidArgumentError(
      `${what}: one round needs ${waves ? `${pipelines} workers x 2 waves x ` : pipelines > 1 ? `${pipelines} pipelines x ` : ''}${schedule.microBatches} micro-batches x ${microBatchSize} samples = ${perRound}, the data set holds ${samples}; use fewer or smaller micro-batches`,
    );

  // The model: resolved to data every stage can build, and checked part to part.
  const model = await resolveModel(options.model, schedule.parts, microBatchSize, what);
  const sizes = await partSizes(model, schedule.parts);
  if (sizes[0]!.inputSize !== features)
    throw new SizeMismatchError(`${what}: the model's first part takes ${sizes[0]!.inputSize} features, the data has ${features}`);
  for (let j = 0; j + 1 < sizes.length; j++)
    if (sizes[j]!.outputSize !== sizes[j + 1]!.inputSize)
      throw new SizeMismatchError(`${what}: part ${j} outputs ${sizes[j]!.outputSize} features but part ${j + 1} takes ${sizes[j + 1]!.inputSize}; make the stage models agree`);
  const outputs = sizes[sizes.length - 1]!.outputSize;
  if (loss === 'mse') {
    if (targetsPerSample !== outputs) throw new SizeMismatchError(`${what}: the mse loss takes the last part's ${outputs} outputs' targets per sample; data.labels holds ${targetsPerSample} per sample`);
    for (let i = 0; i < labels.length; i++)
      if (typeof labels[i] !== 'number' || !Number.isFinite(labels[i])) throw new InvalidArgumentError(`${what}: data.labels[${i}] = ${describeValue(labels[i])} is not a finite target`);
  } else {
    if (outputs % targetsPerSample !== 0)
      throw new SizeMismatchError(`${what}: ${targetsPerSample} class indices per sample must each take an equal share of the last part's ${outputs} outputs (P rows of logits); ${outputs} is not a multiple of ${targetsPerSample}`);
    const classes = outputs / targetsPerSample;
    for (let i = 0; i < labels.length; i++) {
      const l = labels[i];
      if (!Number.isInteger(l) || l! < 0 || l! >= classes)
        throw new InvalidArgumentError(`${what}: data.labels[${i}] = ${describeValue(l)} is not a class index in [0, ${classes}) (the last part outputs ${targetsPerSample > 1 ? `${targetsPerSample} rows of ${classes}` : classes} values)`);
    }
  }

  const { device, reason: deviceReason } = chooseDevice(options.device ?? 'cpu');
  if (device !== 'cpu') {
    const refuse = (why: string): never => {
      throw new InvalidArgumentError(`${what}: on ${device}, ${why} is planned; run it with device 'cpu'`);
    };
    if (model.kind !== 'sequential') refuse('a model module of your own (createStage)');
    // AvgPipe's shared stages run there: N pipelines sharing the S stages, each pipeline's work on a stream of its own.
    const sharedStages = averaging?.layout === 'shared-stages';
    if (rowsAreWorkers || dataParallel || (pipelines > 1 && !sharedStages)) refuse(`'${name}' with parallel pipelines or data-parallel workers (but AvgPipe's shared-stages layout)`);
    if (schedule.actions.some((row) => row.some((a) => a.kind === 'allReduce'))) refuse(`'${name}', whose stages all-reduce a part between them,`);
  }
  if (device !== 'cpu' && loss !== 'cross-entropy') throw new InvalidArgumentError(`${what}: on ${device}, the ${loss} loss is planned; run it with device 'cpu'`);
  const data: PipelineData = { inputs: shared(inputs, Float32Array), labels: loss === 'mse' ? shared(labels, Float32Array) : shared(labels, Int32Array), features, targetsPerSample, loss };
  const descriptions: StageDescription[] = schedule.actions.map((row, stage) => ({
    stage,
    schedule,
    model,
    optimizer: options.optimizer,
    microBatchSize,
    // What it runs or steps (a Wavelet stage steps every part, whether or not it ran it this round).
    parts: [...new Set(row.filter((a) => a.kind === 'forward' || a.kind === 'optimizerStep').map((a) => a.part))].sort((a, b) => a - b),
    ...(dataParallel ? { dataParallel } : {}),
    ...(averaging ? { averaging } : {}),
    ...(pipelinedBackprop ? { pipelinedBackprop } : {}),
    ...(waves ? { waves: true } : {}),
    ...(device !== 'cpu' ? { device } : {}),
  }));
  const workers = rowsAreWorkers || averaging?.layout === 'shared-stages' ? schedule.stages : pipelines * schedule.stages;
  const kernelThreads = resolveKernelThreads(options.kernelThreads, workers, device, what);
  return { schedule, model, descriptions, data, samples, microBatchSize, shuffle, seed, timeoutMs, pipelines, dataParallel, averaging, workers, rowsAreWorkers, device, deviceReason, kernelThreads };
}

/**
 * `kernelThreads` resolved for `workers` worker threads: `auto` splits the cores this process may
 * use (`os.availableParallelism()`) among them, at least one each. Stages on a device run on the
 * calling thread and keep the shared pool.
 *
 * @internal
 */
export function resolveKernelThreads(given: unknown, workers: number, device: Device, what: string): number | 'shared' {
  if (given === 'shared') return 'shared';
  if (given === undefined || given === 'auto') return device === 'cpu' ? Math.max(1, Math.floor(availableParallelism() / workers)) : 'shared';
  if (typeof given !== 'number') throw new InvalidArgumentError(`${what}: kernelThreads must be 'auto', 'shared' or a number of threads per worker, got ${describeValue(given)}`);
  return checkKernelThreads(given, `${what}: kernelThreads`);
}

/** dataParallel.overlapUpdate: a boolean, and true only where the overlapped update applies (the DataParallelTrainer's rule, checked before any worker starts). */
function checkOverlap(options: PipelineDataParallelOptions, mode: ResolvedMode, what: string): void {
  if (options.overlapUpdate !== undefined && typeof options.overlapUpdate !== 'boolean')
    throw new InvalidArgumentError(`${what}: dataParallel.overlapUpdate must be a boolean, got ${describeValue(options.overlapUpdate)}`);
  if (options.overlapUpdate !== true) return;
  if (mode.staleness !== 1) throw new InvalidArgumentError(`${what}: dataParallel.overlapUpdate cannot apply: mode '${mode.mode}' applies each gradient at once; leave overlapUpdate unset`);
  if (mode.needsLocalGrad)
    throw new InvalidArgumentError(`${what}: dataParallel.overlapUpdate cannot apply: the '${options.estimate}' estimate reads the gradient the caller computes next; leave overlapUpdate unset`);
}

/**
 * The data-parallel mode of a schedule whose rows are workers (SAPipe), checked: one of the
 * staleness-1 modes (default `sapipe-wp`), since its all-reduce of step t is laid out to overlap
 * step t+1 and be applied after it.
 */
function checkWorkersMode(given: PipelineDataParallelOptions | undefined, workers: number, schedule: ScheduleName, optimizer: PipelineOptimizerSpec, what: string): PipelineDataParallelOptions {
  const options: PipelineDataParallelOptions = given ?? { mode: 'sapipe-wp' };
  checkObject(options, `${what}: dataParallel`);
  checkKnownKeys(options, DATA_PARALLEL_KEYS, `${what}: dataParallel`);
  if (options.mode === 'sync')
    throw new InvalidArgumentError(
      `${what}: '${schedule}' applies each all-reduce one step late (staleness 1); give dataParallel.mode 'sapipe-wp' (default), 'sapipe-dc' or 'pipe-sgd', or run mode 'sync' as data-parallel pipelines of a synchronous schedule (e.g. gpipe with pipelines)`,
    );
  checkOverlap(options, resolveMode(options, workers), what);
  if (Object.hasOwn(optimizer, 'compensation'))
    throw new InvalidArgumentError(`${what}: with '${schedule}', delay compensation comes from its mode (dataParallel.compensation); remove optimizer.compensation`);
  return { ...options };
}

/** Pipelined Backpropagation's switches, checked, with their defaults. */
function checkPipelinedBackprop(given: PipelinedBackpropOptions | undefined, what: string): Required<PipelinedBackpropOptions> {
  const options = given ?? {};
  checkObject(options, `${what}: pipelinedBackprop`);
  checkKnownKeys(options, PIPELINED_BACKPROP_KEYS, `${what}: pipelinedBackprop`);
  const flag = (key: keyof PipelinedBackpropOptions): boolean => {
    const value = options[key] ?? true;
    if (typeof value !== 'boolean') throw new InvalidArgumentError(`${what}: pipelinedBackprop.${key} must be a boolean, got ${describeValue(value)}`);
    return value;
  };
  return { spikeCompensation: flag('spikeCompensation'), weightPrediction: flag('weightPrediction') };
}

const AVERAGING_KEYS = optionKeys<PipelineAveragingOptions>({ alpha: true, every: true, layout: true });

/**
 * AvgPipe's elastic averaging, checked, with its defaults (ALGORITHMS.md section 5: alpha = 0.9/N,
 * every update; the layout `defaultLayout`, the trainer's `shared-stages`).
 */
function checkAveraging(given: PipelineAveragingOptions | undefined, pipelines: number, what: string, defaultLayout: AveragingLayout = AVERAGING_LAYOUTS[0]): Required<PipelineAveragingOptions> {
  const options = given ?? {};
  checkObject(options, `${what}: averaging`);
  checkKnownKeys(options, AVERAGING_KEYS, `${what}: averaging`);
  const layout: unknown = options.layout === undefined ? defaultLayout : options.layout;
  if (typeof layout !== 'string' || !(AVERAGING_LAYOUTS as readonly string[]).includes(layout))
    throw new InvalidArgumentError(
      `${what}: averaging.layout must be one of ${AVERAGING_LAYOUTS.map((l) => `'${l}'`).join(', ')} ('shared-stages': the N pipelines share the S stage workers, the paper's form; 'worker-per-replica': N x S workers), got ${describeValue(layout)}`,
    );
  return {
    alpha: checkNumber(options.alpha ?? 0.9 / pipelines, `${what}: averaging.alpha`, 0, 1),
    every: checkInteger(options.every ?? 1, `${what}: averaging.every`, 1, 1 << 20),
    layout: layout as AveragingLayout,
  };
}

/** The data-parallel coupling of parallel pipelines, checked (typed errors name what is wrong); undefined for one pipeline without it. */
function checkDataParallel(
  given: PipelineDataParallelOptions | undefined,
  pipelines: number,
  schedule: ScheduleName,
  runtime: RuntimeSchedule,
  optimizer: PipelineOptimizerSpec,
  what: string,
): PipelineDataParallelOptions | undefined {
  if (given === undefined && pipelines === 1) return undefined;
  const options: PipelineDataParallelOptions = given ?? { mode: 'sync' };
  checkObject(options, `${what}: dataParallel`);
  checkKnownKeys(options, DATA_PARALLEL_KEYS, `${what}: dataParallel`);
  if (runtime.coupling !== 'data-parallel')
    throw new InvalidArgumentError(
      `${what}: parallel pipelines coupled by data parallelism run the synchronous schedules (${DATA_PARALLEL_SCHEDULES.join(', ')}), not '${schedule}' (asynchronous pipelines coupled by elastic averaging: schedule ${AVERAGED_SCHEDULES.map((n) => `'${n}'`).join(', ')})`,
    );
  checkOverlap(options, resolveMode(options, pipelines), what);
  if (Object.hasOwn(optimizer, 'compensation'))
    throw new InvalidArgumentError(`${what}: with dataParallel, delay compensation comes from its mode (dataParallel.compensation); remove optimizer.compensation`);
  return { ...options };
}

/** @internal The sample order of an epoch: seeded per epoch, the same in every stage and process. */
export function epochOrder(samples: number, shuffle: boolean, seed: number, epoch: number): Int32Array {
  if (!shuffle) return Int32Array.from({ length: samples }, (_, i) => i);
  return Int32Array.from(shuffledIndices(samples, (seed * 7919 + epoch * 104729) >>> 0));
}

/** Copies into shared memory, so the stage threads read one copy of the data set. */
function shared<T extends Float32Array | Int32Array>(values: ArrayLike<number>, Ctor: { new (buffer: SharedArrayBuffer): T; BYTES_PER_ELEMENT: number }): T {
  if (ArrayBuffer.isView(values) && (values as unknown as { buffer: unknown }).buffer instanceof SharedArrayBuffer && values instanceof (Ctor as unknown as typeof Float32Array))
    return values as unknown as T;
  const out = new Ctor(new SharedArrayBuffer(values.length * Ctor.BYTES_PER_ELEMENT));
  for (let i = 0; i < values.length; i++) out[i] = values[i]!;
  return out;
}

/** The optimizer spec: a known kind with that optimizer's options, able to do what the schedule needs; prediction comes from the schedule. */
function checkOptimizer(spec: PipelineOptimizerSpec, schedule: ScheduleName, runtime: RuntimeSchedule, what: string): void {
  checkOptimizerSpec(spec, what, { keys: ['prediction', 'queue'], why: 'by the runtime from the schedule; remove it' });
  const entry = OPTIMIZERS[spec.kind];
  for (const need of runtime.optimizerNeeds) if (!entry[need.property](spec)) throw new InvalidArgumentError(`${what}: ${need.refusal(entry.className)}`);
  if (runtime.spikeDelay !== undefined && (spec as { spikeCompensation?: unknown }).spikeCompensation !== undefined)
    throw new InvalidArgumentError(`${what}: optimizer.spikeCompensation is set by the runtime from each stage's delay; remove it`);
  // Every value, as the stages' optimizers will check it: here, before any worker starts.
  checkOptimizerValues(spec, what);
}

/** The model option resolved to a description every stage can build. */
async function resolveModel(model: PipelineModelOptions, parts: number, microBatchSize: number, what: string): Promise<PipelineModelSpec> {
  checkObject(model, `${what}: model`);
  if (isSequential(model)) {
    checkKnownKeys(model, ['layers', 'seed', 'boundaries'], `${what}: model`);
    checkLayers(model.layers, `${what}: model.layers`);
    const seed = checkInteger(model.seed ?? 0, `${what}: model.seed`, 0, 2 ** 32 - 1);
    if (model.layers.length < parts)
      throw new InvalidArgumentError(`${what}: the model has ${model.layers.length} layers for ${parts} parts; every part needs at least one layer (use fewer stages or a deeper model)`);
    const how = model.boundaries ?? 'measured';
    let boundaries: number[];
    if (how === 'measured') boundaries = balancedBoundaries((await profileLayers(model.layers, microBatchSize, { seed })).costs, parts);
    else if (how === 'params') boundaries = balancedBoundaries(layerParams(model.layers).map((p) => p + 1), parts);
    else if (Array.isArray(how)) {
      if (how.length !== parts - 1) throw new InvalidArgumentError(`${what}: model.boundaries must hold ${parts - 1} layer indices for ${parts} parts, got ${how.length}`);
      partRanges(model.layers.length, how);
      boundaries = [...how];
    } else throw new InvalidArgumentError(`${what}: model.boundaries must be an array of layer indices, 'measured' or 'params', got ${describeValue(how)}`);
    return { kind: 'sequential', layers: model.layers.map((l) => ({ ...l })), seed, boundaries };
  }
  if (!Object.hasOwn(model, 'module')) throw new InvalidArgumentError(`${what}: model must be { layers, ... } (sapipe layers) or { module, options } (your createStage module)`);
  checkKnownKeys(model, ['module', 'options'], `${what}: model`);
  const m = (model as { module: unknown }).module;
  const module = m instanceof URL ? m.href : m;
  if (typeof module !== 'string' || module === '') throw new InvalidArgumentError(`${what}: model.module must be a path or file URL, got ${describeValue(m)}`);
  return { kind: 'module', module, parts, options: (model as { options?: unknown }).options };
}

/** Builds each part once on this thread to check that the parts fit together, then frees them. */
async function partSizes(model: PipelineModelSpec, parts: number): Promise<{ inputSize: number; outputSize: number }[]> {
  if (model.kind === 'sequential') {
    const widths = checkLayers(model.layers);
    return partRanges(model.layers.length, model.boundaries).map(([s, e]) => ({ inputSize: widths[s]!, outputSize: widths[e]! }));
  }
  const out: { inputSize: number; outputSize: number }[] = [];
  for (let j = 0; j < parts; j++) {
    const stage = await buildStageModel(model, j);
    out.push({ inputSize: stage.inputSize, outputSize: stage.outputSize });
    stage.dispose();
  }
  return out;
}

