/**
 * Every pipeline schedule, described once: the generator, the options it reads, how its pictures
 * label rows, which weights its passes read, and how the pipeline runtime runs it (the weight
 * prediction and spike compensation its optimizers are built with, what the optimizer must be able
 * to do, how parallel pipelines are coupled, the options only it takes, its defaults). The
 * runtime's plan and stages, the renderer, the CLI and the demo read the entry here instead of
 * comparing names; the name list is this table's keys.
 *
 * Adding a schedule: its generator file and one entry in SCHEDULES (docs/DESIGN.md lists the test
 * and docs that go with them).
 */
import { InvalidArgumentError } from '../../errors.js';
import { pipelinedBackpropDelay, pipeoptimStepsAhead, spectrainStepsAhead, type PredictionOptions, type SmallBatchHyperparameters } from '../../optim/options.js';
import type { OptimizerDescriptor } from '../../optim/registry.js';
import { describeValue } from '../../validate.js';
import type { Schedule } from '../schedule.js';
import { AVGPIPE_DEFAULT_PIPELINES, avgpipe } from './avgpipe.js';
import { gpipe } from './gpipe.js';
import { interleaved1F1B } from './interleaved-1f1b.js';
import { oneFOneB } from './one-f-one-b.js';
import type { ScheduleOptions } from './options.js';
import { pipedream } from './pipedream.js';
import { pipedream2BW } from './pipedream-2bw.js';
import { pipelinedBackprop } from './pipelined-backprop.js';
import { pipeoptim } from './pipeoptim.js';
import { sapipe } from './sapipe.js';
import { spectrain } from './spectrain.js';
import { wavelet } from './wavelet.js';
import { zbH1 } from './zb-h1.js';

export { avgpipe, gpipe, interleaved1F1B, oneFOneB, pipedream, pipedream2BW, pipelinedBackprop, pipeoptim, sapipe, spectrain, wavelet, zbH1 };

/** A generator option other than the two every schedule takes (`stages`, `microBatches`). @category Pipeline schedules */
export type ScheduleOptionName = Exclude<keyof ScheduleOptions, 'stages' | 'microBatches'>;

/**
 * Options of `PipelineTrainer.create` that belong to the schedules whose entry lists them in
 * `runtime.trainerOptions`; the others refuse them. (lib/pipeline/runtime/plan.ts holds the compiler
 * to these being trainer options.)
 *
 * @category Pipeline schedules
 */
export type ScheduleTrainerOption = 'advance' | 'averaging' | 'pipelinedBackprop' | 'form';

/**
 * Which weights a schedule's passes read, besides the current version:
 * - `current`: every pass reads the current weights (staleness 0);
 * - `stashed`: a forward stashes the version it read and its backward restores it (PipeDream: stage k keeps `S-k`);
 * - `double-buffered`: a batch reads the version before the newest (PipeDream-2BW: two versions, delay 1);
 * - `predicted`: a pass reads weights predicted ahead by the optimizer (`predictWeights` actions).
 *
 * @category Pipeline schedules
 */
export type ScheduleWeights = 'current' | 'stashed' | 'double-buffered' | 'predicted';

/** An optimizer property a schedule needs (read from the optimizer's entry in OPTIMIZERS). @category Pipeline schedules */
export type OptimizerProperty = keyof Pick<OptimizerDescriptor<unknown>, 'linearInStepsAhead' | 'predictsAlongMomentum' | 'compensatesSpikes'>;

/** What a schedule needs of its optimizer, and what to tell the user whose optimizer lacks it. @category Pipeline schedules */
export interface OptimizerNeed {
  readonly property: OptimizerProperty;
  /** The refusal, given the optimizer's class name (`AdamW`). */
  refusal(className: string): string;
}

/**
 * How parallel pipelines (the trainer's `pipelines`) of a schedule are coupled:
 * - `data-parallel`: each runs the one-pipeline schedule, and a part's replicas combine gradients
 *   through a DataParallelTrainer (`dataParallel`); the synchronous schedules;
 * - `elastic-averaging`: its generator lays out the N pipelines, and each part's replicas average
 *   with a center copy (`averaging`; AvgPipe);
 * - `workers`: its generator lays out one row per data-parallel worker (the trainer's `stages`),
 *   each holding the whole model as one part; the workers' replicas combine gradients through a
 *   DataParallelTrainer in a staleness-1 mode (`dataParallel`, default `sapipe-wp`), whose step the
 *   rows' `allReduce` actions start and their `optimizerStep` actions wait for (SAPipe);
 * - `none`: one pipeline only.
 *
 * @category Pipeline schedules
 */
export type PipelineCoupling = 'data-parallel' | 'elastic-averaging' | 'workers' | 'none';

/**
 * How the pipeline runtime (PipelineTrainer, `sapipe launch`) runs a schedule.
 *
 * @category Pipeline schedules
 */
export interface RuntimeSchedule {
  /** Generator options the runtime sets where the user gives none (Wavelet: its model-parallel form, unless the trainer's `form` says otherwise). */
  readonly generatorOptions?: Partial<Pick<ScheduleOptions, ScheduleOptionName>>;
  /** The trainer options only this schedule takes. */
  readonly trainerOptions: readonly ScheduleTrainerOption[];
  /** How its parallel pipelines are coupled. */
  readonly coupling: PipelineCoupling;
  /** N, parallel pipelines, when `pipelines` is not given (the `workers` coupling: 1, its workers are its rows). */
  readonly defaultPipelines: number;
  /** The weight prediction the optimizer of part `part` of `parts` is built with (ALGORITHMS.md section 3); none where absent. */
  prediction?(part: number, parts: number): PredictionOptions;
  /**
   * The backward's prediction as a share of the forward's, `s_b / s_f` (SpecTrain: the backward
   * reads `w + ratio * (w_hat - w)`); 0, the current weights, where absent.
   */
  backwardPredictionRatio?(part: number, parts: number): number;
  /** The delay that spike compensation corrects at part `part` (ALGORITHMS.md section 4); none where absent. The runtime then sets the optimizer's `spikeCompensation`. */
  spikeDelay?(part: number, parts: number): number;
  /** What its optimizer must be able to do, checked in this order before any stage starts. */
  readonly optimizerNeeds: readonly OptimizerNeed[];
  /**
   * SGD's learning rate (momentum 0.9) where the user gives none, measured on the demo's MLP
   * (bench/RESULTS.md, "learning rates per schedule"), or the reference that the small-batch rule
   * (`pipelinedBackpropScaling`) scales to the micro-batch size.
   */
  readonly defaultSgd: { readonly lr: number } | { readonly smallBatchRule: SmallBatchHyperparameters };
}

/** A schedule the runtime does not run yet, and why. @category Pipeline schedules */
export interface PlannedRuntimeSchedule {
  readonly planned: string;
}

/** What the rest of sapipe asks about a schedule. @category Pipeline schedules */
export interface ScheduleDescriptor {
  /** Its name as its paper writes it (`PipeDream-2BW`). */
  readonly title: string;
  /** One line on what it does, for listings and help. */
  readonly summary: string;
  /** The generator (which checks its options). */
  readonly generate: (options: ScheduleOptions) => Schedule;
  /** The generator options it reads beside stages and microBatches; it ignores the others. */
  readonly options: readonly ScheduleOptionName[];
  /** The simulation costs it reads beside `forward` and `backward`: `weightGrad` (split backwards) and `allReduce`. */
  readonly costs: readonly ('weightGrad' | 'allReduce')[];
  /** What a row of its timeline is for these params: a `worker` holding a whole model replica, or a pipeline `stage`. */
  rowName(params: Schedule['params']): 'worker' | 'stage';
  /** Which weights its passes read. */
  readonly weights: ScheduleWeights;
  /** How the pipeline runtime runs it, or why it does not yet. */
  readonly runtime: RuntimeSchedule | PlannedRuntimeSchedule;
}

const stage = (): 'stage' => 'stage';

/** The synchronous schedules' runtime: one step per round on every part, parallel pipelines by data parallelism. */
const synchronous: RuntimeSchedule = { trainerOptions: [], coupling: 'data-parallel', defaultPipelines: 1, optimizerNeeds: [], defaultSgd: { lr: 0.05 } };
/**
 * The asynchronous schedules' runtime. SGD at 0.02: the schedules that read stashed or predicted
 * weights diverge or lag at the synchronous ones' 0.05 (3 epochs, seed 1, at 0.05 then 0.02:
 * PipeOptim 84.55 % then 93.80 %, PipeDream 66.05 % then 93.05 %, 2BW 89.35 % then 91.35 %,
 * SpecTrain 90.40 % then 93.50 %, against 1F1B's 92.30 % and 92.40 %; bench/RESULTS.md).
 */
const asynchronous: RuntimeSchedule = { trainerOptions: [], coupling: 'none', defaultPipelines: 1, optimizerNeeds: [], defaultSgd: { lr: 0.02 } };

const predictsAlongMomentum = (name: string): OptimizerNeed => ({
  property: 'predictsAlongMomentum',
  refusal: () => `${name} predicts along the momentum; give SGD a momentum > 0 (or use Adam)`,
});

/**
 * Every schedule and its entry, in the order messages and the CLI list them.
 *
 * @category Pipeline schedules
 */
export const SCHEDULES = {
  gpipe: {
    title: 'GPipe',
    summary: 'all forwards, then all backwards; one synchronous step (flush)',
    generate: gpipe,
    options: [],
    costs: [],
    rowName: stage,
    weights: 'current',
    runtime: synchronous,
  },
  '1f1b': {
    title: '1F1B',
    summary: 'one forward one backward with flush (PipeDream-Flush); one synchronous step',
    generate: oneFOneB,
    options: [],
    costs: [],
    rowName: stage,
    weights: 'current',
    runtime: synchronous,
  },
  'interleaved-1f1b': {
    title: 'Interleaved 1F1B',
    summary: '1F1B over V model chunks per stage (Megatron-LM); one synchronous step',
    generate: interleaved1F1B,
    options: ['virtualStages'],
    costs: [],
    rowName: stage,
    weights: 'current',
    runtime: synchronous,
  },
  pipedream: {
    title: 'PipeDream',
    summary: 'asynchronous 1F1B, a step after every backward, weight stashing',
    generate: pipedream,
    options: [],
    costs: [],
    rowName: stage,
    weights: 'stashed',
    runtime: asynchronous,
  },
  'pipedream-2bw': {
    title: 'PipeDream-2BW',
    summary: 'asynchronous 1F1B across batches, a step per batch, two weight versions',
    generate: pipedream2BW,
    options: ['iterations'],
    costs: [],
    rowName: stage,
    weights: 'double-buffered',
    runtime: asynchronous,
  },
  pipeoptim: {
    title: 'PipeOptim',
    summary: 'asynchronous 1F1B whose forwards read weights predicted S-k-1 updates ahead',
    generate: pipeoptim,
    options: [],
    costs: [],
    rowName: stage,
    weights: 'predicted',
    runtime: {
      ...asynchronous,
      prediction: (part, parts) => ({ kind: 'pipeoptim', stage: part, stages: parts }),
      optimizerNeeds: [predictsAlongMomentum('pipeoptim')],
    },
  },
  spectrain: {
    title: 'SpecTrain',
    summary: 'asynchronous 1F1B whose forwards and backwards read predicted weights',
    generate: spectrain,
    options: [],
    costs: [],
    rowName: stage,
    weights: 'predicted',
    runtime: {
      ...asynchronous,
      prediction: (part, parts) => ({ kind: 'spectrain', stage: part, stages: parts, pass: 'forward' }),
      // Both predictions are `w - lr*s*D` with the same D, so the backward's is derived from the
      // optimizer's fused forward one with no second prediction kernel; with s_f = 0 it is w.
      backwardPredictionRatio(part, parts) {
        const forward = spectrainStepsAhead(part, parts, 'forward');
        return forward === 0 ? 0 : spectrainStepsAhead(part, parts, 'backward') / forward;
      },
      optimizerNeeds: [
        {
          property: 'linearInStepsAhead',
          refusal: (className) => `SpecTrain's backward prediction is linear in the steps ahead, which ${className}'s weight decay is not; use SGD or Adam, or weightDecay 0`,
        },
        predictsAlongMomentum('spectrain'),
      ],
    },
  },
  avgpipe: {
    title: 'AvgPipe',
    summary: 'N parallel pipelines with advance forward propagation, coupled by elastic averaging',
    generate: avgpipe,
    options: ['pipelines', 'advance'],
    costs: [],
    rowName: stage,
    weights: 'current',
    runtime: { ...synchronous, trainerOptions: ['advance', 'averaging'], coupling: 'elastic-averaging', defaultPipelines: AVGPIPE_DEFAULT_PIPELINES },
  },
  wavelet: {
    title: 'Wavelet',
    summary: 'tick-tock waves; data-parallel (two replicas per worker) or model-parallel form',
    generate: wavelet,
    options: ['form'],
    costs: ['allReduce'],
    rowName: (params) => (params.form === 'data-parallel' ? 'worker' : 'stage'),
    weights: 'current',
    // Both forms run. The trainer's `form` picks one; model-parallel by default (S stages of one
    // model split in S parts, like every other schedule's `stages`). The data-parallel form's rows
    // are workers (S of them, each holding the tick and tock replica of the whole model), its
    // waves' all-reduces run by the runner itself (docs/pipeline.md, "Wavelet").
    runtime: { ...synchronous, trainerOptions: ['form'], generatorOptions: { form: 'model-parallel' }, coupling: 'none' },
  },
  'pipelined-backprop': {
    title: 'Pipelined Backpropagation',
    summary: 'batch size 1, a step after every backward; linear weight prediction and spike compensation',
    generate: pipelinedBackprop,
    options: [],
    costs: [],
    rowName: stage,
    weights: 'predicted',
    runtime: {
      ...asynchronous,
      trainerOptions: ['pipelinedBackprop'],
      // Part k's gradients arrive D_k = 2(S-k)-1 updates late: its forward reads weights predicted
      // D_k ahead, and its SGD-momentum step compensates for that delay ("SC+LWP").
      prediction: (part, parts) => ({ kind: 'linear', steps: pipelinedBackpropDelay(part, parts) }),
      spikeDelay: (part, parts) => pipelinedBackpropDelay(part, parts),
      optimizerNeeds: [
        {
          property: 'compensatesSpikes',
          refusal: () => 'Pipelined Backpropagation compensates SGD momentum for its delays (spike compensation); use SGD with momentum > 0, no dampening and no Nesterov',
        },
      ],
      // It updates after every micro-batch and diverges at 0.05 and 0.02 alike: the small-batch rule
      // (ALGORITHMS.md section 4) from lr 0.05, momentum 0.9 at batch 128 (at 16: lr 8.2e-4,
      // momentum 0.9869, 94.25 % after 3 epochs; bench/RESULTS.md).
      defaultSgd: { smallBatchRule: { lr: 0.05, momentum: 0.9, batch: 128 } },
    },
  },
  sapipe: {
    title: 'SAPipe',
    summary: 'data-parallel pipeline: the all-reduce of step t overlaps the computation of step t+1',
    generate: sapipe,
    options: [],
    costs: ['allReduce'],
    rowName: () => 'worker',
    weights: 'predicted',
    // Its rows are the data-parallel workers, each with a DataParallelTrainer over the others in a
    // staleness-1 mode (default sapipe-wp): the mode's update (delay compensation, weight
    // prediction) is the trainer's, the schedule says when each all-reduce starts and is waited for.
    runtime: { ...synchronous, coupling: 'workers' },
  },
  'zb-h1': {
    title: 'ZB-H1',
    summary: "zero-bubble pipeline (split backward), 1F1B's peak memory; one synchronous step",
    generate: zbH1,
    options: [],
    costs: ['weightGrad'],
    rowName: stage,
    weights: 'current',
    runtime: synchronous,
  },
} as const satisfies Record<string, ScheduleDescriptor>;

/** @category Pipeline schedules */
export type ScheduleName = keyof typeof SCHEDULES;

/** Names accepted by {@link generateSchedule} and the `sapipe schedule` command: the keys of {@link SCHEDULES}. @category Pipeline schedules */
export const scheduleNames = Object.keys(SCHEDULES) as ScheduleName[];

/** The entry of the schedule named `name`, or undefined for any other name (a custom schedule's). @category Pipeline schedules */
export function scheduleEntry(name: unknown): ScheduleDescriptor | undefined {
  return typeof name === 'string' && Object.hasOwn(SCHEDULES, name) ? SCHEDULES[name as ScheduleName] : undefined;
}

/** Builds the named schedule. @category Pipeline schedules */
export function generateSchedule(name: ScheduleName, options: ScheduleOptions): Schedule {
  const entry = scheduleEntry(name);
  if (entry === undefined) {
    throw new InvalidArgumentError(`unknown schedule ${typeof name === 'string' ? `"${name}"` : describeValue(name)}; use one of: ${scheduleNames.join(', ')}`);
  }
  return entry.generate(options);
}
