/**
 * PipelineTrainer: trains a model cut into stages by executing a schedule from
 * `lib/pipeline/schedules/` on one worker per stage. This file is the trainer's side: it checks
 * the whole configuration before any worker starts, starts the stage workers (threads over the
 * `local` backend), feeds them rounds of micro-batches, gathers their measured timelines, and
 * fails the whole job with the first stage's error.
 */
import { performance } from 'node:perf_hooks';

import { spawnLocalRanks } from '../../comm/local.js';
import { BusyError, DisposedError, InvalidArgumentError, RankFailedError, SapipeError, SizeMismatchError, TimeoutError } from '../../errors.js';
import type { Device } from '../../nn/ops.js';
import { Sequential, checkLayers, partRanges } from '../../nn/sequential.js';
import { softmaxCrossEntropy } from '../../nn/softmax-cross-entropy.js';
import { FlatBuffer } from '../../tensor.js';
import { describeValue } from '../../validate.js';
import type { Schedule } from '../schedule.js';
import type { PipelineCoupling } from '../schedules/registry.js';
import type { TimedAction } from '../timeline.js';
import { type ScheduleAnalysis, validateSchedule } from '../validate.js';
import { startDeviceStages, type StageWorker } from './in-process.js';
import { epochOrder, planPipeline, type PipelineTrainerOptions } from './plan.js';
import type { AveragingLayout, CenterCheckpointState, DataParallelPartState, FromStage, PartCheckpointState, PipelineLoss, PipelineModelSpec, ToStage } from './stage-host.js';
import type { OptimizerState } from '../../optim/optimizer.js';
import type { StageRoundResult, VersionRead } from './stage-runner.js';

/** One round: every stage's measured timeline and what it saw. @category Pipeline runtime */
export interface RoundReport {
  /** Rounds run before this one. */
  readonly round: number;
  /** Mean loss over the round's micro-batches. */
  readonly loss: number;
  /** Loss per micro-batch (with parallel pipelines: pipeline 0's micro-batches, then pipeline 1's, ...). */
  readonly losses: readonly number[];
  /** Wall time of the round on the trainer's clock, ms. */
  readonly wallMs: number;
  /**
   * The measured timeline, per worker row, ms from the round's start, in the simulator's format:
   * per stage of pipeline 0 where each pipeline runs on its own workers; where one worker runs a
   * row, that row's actions (SAPipe's data-parallel workers; AvgPipe's `shared-stages` layout:
   * every pipeline's passes on its stage's row, as the generator interleaved them).
   */
  readonly timeline: readonly (readonly TimedAction[])[];
  /** Weight versions read, per stage of pipeline 0 (absolute optimizer-step counts; AvgPipe's shared stages: of every pipeline, each read naming its pipeline). */
  readonly versions: readonly (readonly VersionRead[])[];
  /** Per stage of pipeline 0 (AvgPipe's shared stages: per stage, every pipeline's replicas together). */
  readonly peakActivations: readonly number[];
  /**
   * Per worker row that holds a replica per pipeline (Wavelet's data-parallel form: the worker's
   * tick and tock; AvgPipe's shared stages: every pipeline's), each replica's own peak stored
   * micro-batches and bytes. `peakActivations` is the peak of their sum; compare it with
   * `peakActivations` of plain data parallelism (waveletMemory). Absent for the other schedules.
   */
  readonly replicaPeaks?: readonly (NonNullable<StageRoundResult['replicaPeaks']>)[];
  readonly peakStashed: readonly number[];
  /** Per stage of pipeline 0: predicted weight copies kept beside the weights (PipeOptim, SpecTrain, ...). */
  readonly predictedCopies: readonly number[];
  /** Per stage of pipeline 0, in bytes: see StageRoundResult. Their sum bounds a worker's peak training memory. */
  readonly peakActivationBytes: readonly number[];
  readonly peakStashedBytes: readonly number[];
  readonly modelBytes: readonly number[];
  /** Over every stage of every pipeline. */
  readonly skippedSteps: number;
}

/** @category Pipeline runtime */
export interface EpochReport {
  readonly epoch: number;
  readonly rounds: number;
  /** Mean loss over the epoch's micro-batches. */
  readonly loss: number;
  readonly wallMs: number;
}

/** How long a stage's "peer lost" waits for the failure that caused it before failing the job itself. */
const SECONDARY_GRACE_MS = 250;

/**
 * How a trainer's pipelines are coupled, which a state must match: the schedule registry's
 * couplings as the trainer runs them (`none` for one pipeline, `data-parallel` for N pipelines
 * whose stage replicas combine gradients, `elastic-averaging` for AvgPipe, `workers` for SAPipe's
 * rows), and `waves`: Wavelet's data-parallel form (S workers, each the tick and tock pipelines 2x
 * and 2x+1 of the one part). @category Pipeline runtime
 */
export type PipelineStateCoupling = PipelineCoupling | 'waves';
/** Every PipelineStateCoupling (the record makes the compiler hold it complete): what a checkpoint file may name. @category Pipeline runtime */
export const PIPELINE_STATE_COUPLINGS = Object.keys({ none: true, 'data-parallel': true, 'elastic-averaging': true, workers: true, waves: true } satisfies Record<PipelineStateCoupling, true>) as readonly PipelineStateCoupling[];

/**
 * One replica's state in a PipelineTrainerState: pipeline `pipeline`'s copy of part `part`, its
 * weights, optimizer state and counters (the version counter the schedule's weight versions count
 * from), and where its replicas combine gradients, its DataParallelTrainer's state less the
 * weights and optimizer state (a staleness-1 mode's averaged gradient in flight included).
 * @category Pipeline runtime
 */
export interface PipelineReplicaState {
  /** Version 2 (absent in version 1, where `parts[j]` is part j of the one pipeline). */
  pipeline?: number;
  part?: number;
  weights: Float32Array;
  optimizer: OptimizerState;
  updates: number;
  skipped: number;
  dataParallel?: DataParallelPartState;
}

/**
 * A pipeline trainer's state between rounds: every replica's weights, optimizer state and
 * counters, AvgPipe's centers, and the position in the data. Importing it into a trainer of the
 * same configuration (schedule, stages, pipelines, coupling, AvgPipe's layout; model and
 * optimizer) continues exactly as if training had not stopped. exportState() writes version 2;
 * importState() also reads version 1 (one pipeline, `parts` indexed by part). @category Pipeline runtime
 */
export interface PipelineTrainerState {
  version: 1 | 2;
  /** The schedule's name, stages and parts: a state fits a trainer with the same. */
  schedule: string;
  stages: number;
  /** Version 2: the pipelines whose replicas `parts` holds (N; SAPipe: its S workers; Wavelet's data-parallel form: 2S). */
  pipelines?: number;
  /** Version 2: how the pipelines are coupled (see PipelineStateCoupling). */
  coupling?: PipelineStateCoupling;
  /** Version 2, AvgPipe: where its pipelines run. */
  averagingLayout?: AveragingLayout;
  rounds: number;
  epochs: number;
  /** Samples of the current epoch's order already trained on. */
  orderPosition: number;
  /** Index = pipeline x parts + part (Wavelet's data-parallel form, of its one part: the pipeline). */
  parts: PipelineReplicaState[];
  /**
   * Version 2, AvgPipe: its centers, ordered by pipeline then part. `shared-stages`: one per part
   * (pipeline 0), `updates` counting each pipeline's elasticAverage calls; `worker-per-replica`:
   * each pipeline's copy of each part's center (identical by construction; `updates` of that one).
   */
  centers?: { pipeline: number; part: number; weights: Float32Array; updates: number[] }[];
}

interface Pending {
  readonly type: 'round' | 'weights' | 'ready' | 'state' | 'imported';
  readonly replies: Map<number, FromStage>;
  resolve(replies: FromStage[]): void;
  reject(error: unknown): void;
  timer: NodeJS.Timeout;
}

/**
 * Trains a model cut into pipeline stages with a schedule, one worker thread per stage over the
 * `local` backend. Every weight operation (updates, predictions, stashes) is a native kernel on
 * native buffers; activations and gradients travel through `Communicator.send`/`recv`.
 *
 * ```ts
 * const trainer = await PipelineTrainer.create({
 *   schedule: '1f1b', stages: 4, microBatches: 8, microBatchSize: 16,
 *   model: { layers: mlpLayers([784, 256, 256, 256, 10]) },
 *   optimizer: { kind: 'sgd', lr: 0.05, momentum: 0.9 },
 *   data: { inputs, labels, features: 784 },
 * });
 * await trainer.trainEpoch();
 * console.log(await trainer.evaluate(testInputs, testLabels));
 * await trainer.dispose();
 * ```
 *
 * @category Pipeline runtime
 */
export class PipelineTrainer {
  /** Set by the constructor: what `instanceof` checks (below), so an object that only borrows the prototype is not taken for a trainer. */
  readonly #constructed = true;
  /** `x instanceof PipelineTrainer` holds for trainers the class built, not for `Object.create(PipelineTrainer.prototype)`. */
  static [Symbol.hasInstance](value: unknown): boolean {
    return typeof value === 'object' && value !== null && #constructed in value;
  }
  /** The analysis of the schedule (peak activations, versions, staleness per stage). */
  readonly analysis: ScheduleAnalysis;
  private readonly pending = new Set<Pending>();
  private failure: unknown;
  private secondary: NodeJS.Timeout | undefined;
  private isDisposed = false;
  private busy = false;
  private roundsRun = 0;
  private epochsRun = 0;
  private order: Int32Array;
  private orderPosition = 0;
  /** Each part's ParamSet length and optimizer kind (index = part), from the stages' ready replies. */
  private partLengths: number[] = [];
  private partOptimizers: OptimizerState['kind'][] = [];
  private partBuffers: string[][] = [];
  /** Each part's stages (several in Wavelet's model-parallel form). */
  private partHolders: number[][] = [];
  /** Each part's data-parallel trainers, where its replicas combine gradients: what their states must fit. */
  private partDataParallel: ({ mode: string; staleness: 0 | 1; overlapped: boolean } | undefined)[] = [];
  /** The learning rate of every part's optimizer, as last set. */
  private learningRate: number;

  private constructor(
    readonly schedule: Schedule,
    /** The model as the stages build it (layer boundaries resolved). */
    readonly model: PipelineModelSpec,
    private readonly workers: StageWorker[],
    private readonly samples: number,
    private readonly options: Required<Pick<PipelineTrainerOptions, 'microBatchSize' | 'shuffle' | 'seed' | 'timeoutMs' | 'pipelines' | 'loss'>> & { rowsAreWorkers: boolean; averagingLayout: AveragingLayout | undefined; coupling: PipelineStateCoupling },
    lr: number,
    /** Where the stages run (`auto` resolved), and why there. */
    readonly device: { readonly device: Device; readonly reason: string },
    /** Each worker thread's kernel threads (`auto` resolved), or `shared` (the process-wide pool). */
    readonly kernelThreads: number | 'shared',
  ) {
    this.learningRate = lr;
    this.analysis = validateSchedule(schedule);
    this.order = this.epochOrder(0);
    workers.forEach((worker, index) => {
      worker.on('message', (message: FromStage) => this.onMessage(index, message));
      worker.on('error', (error: Error) => this.fail(new RankFailedError(`${this.workerName(index)} threw: ${error.message}`, { cause: error, rank: index })));
      worker.on('exit', (code: number) => {
        if (!this.isDisposed) this.fail(new RankFailedError(`${this.workerName(index)} exited${code ? ` with code ${code}` : ''} while the trainer was running`, { rank: index }));
      });
    });
  }

  /**
   * Checks the configuration (a typed error names what is wrong, before any worker starts),
   * starts one worker per stage and resolves once every stage has built its model part.
   */
  static async create(options: PipelineTrainerOptions): Promise<PipelineTrainer> {
    const plan = await planPipeline(options, 'PipelineTrainer');
    const { schedule, model, descriptions, data, microBatchSize, shuffle, seed, timeoutMs, pipelines, rowsAreWorkers, device, kernelThreads } = plan;
    // Worker p x S + s runs stage s of pipeline p; where the rows are workers (SAPipe) or AvgPipe's
    // pipelines share the stages, worker x runs row x. On a device every stage runs in this process, on that device.
    const averagingLayout = plan.averaging?.layout;
    const coupling: PipelineStateCoupling = descriptions.some((d) => d.waves) ? 'waves' : rowsAreWorkers ? 'workers' : plan.averaging ? 'elastic-averaging' : pipelines > 1 ? 'data-parallel' : 'none';
    const workers: StageWorker[] =
      device === 'cpu'
        ? spawnLocalRanks(new URL('./stage-thread.js', import.meta.url), plan.workers, { workerData: { descriptions, data, timeoutMs, pipelines, rowsAreWorkers, kernelThreads } })
        : startDeviceStages(descriptions, data, timeoutMs);
    const trainer = new PipelineTrainer(schedule, model, workers, plan.samples, { microBatchSize, shuffle, seed, timeoutMs, pipelines, rowsAreWorkers, averagingLayout, coupling, loss: data.loss }, options.optimizer.lr, { device, reason: plan.deviceReason }, kernelThreads);
    try {
      for (const reply of await trainer.request('ready', undefined))
        if (reply.type === 'ready' && reply.pipeline === 0)
          for (const p of reply.parts) {
            trainer.partLengths[p.part] = p.length;
            trainer.partOptimizers[p.part] = p.optimizer;
            trainer.partBuffers[p.part] = p.buffers;
            trainer.partDataParallel[p.part] = p.dataParallel;
            (trainer.partHolders[p.part] ??= []).push(reply.stage);
          }
    } catch (error) {
      await trainer.dispose();
      throw error;
    }
    return trainer;
  }

  get disposed(): boolean {
    return this.isDisposed;
  }
  /** Rounds run so far. */
  get rounds(): number {
    return this.roundsRun;
  }
  /** Parallel pipelines (N). */
  get pipelines(): number {
    return this.options.pipelines;
  }
  /** AvgPipe: where its pipelines run (`averaging.layout`, default `shared-stages`); undefined for the other schedules. */
  get averagingLayout(): AveragingLayout | undefined {
    return this.options.averagingLayout;
  }
  /** Rounds in one epoch: the data set's samples over one round's samples (every pipeline's), rounded down. */
  get roundsPerEpoch(): number {
    return Math.floor(this.samples / this.samplesPerRound);
  }
  private get samplesPerRound(): number {
    // (Wavelet's data-parallel workers: two waves each, the schedule's 2S pipelines.)
    const pipelines = this.options.rowsAreWorkers ? this.schedule.pipelines : this.options.pipelines;
    return pipelines * this.schedule.microBatches * this.options.microBatchSize;
  }

  /** Runs one round (one pass over the schedule) on the next samples. */
  async trainRound(): Promise<RoundReport> {
    this.checkUsable('trainRound');
    this.busy = true;
    try {
      return await this.runRound();
    } finally {
      this.busy = false;
    }
  }

  /** Runs the rounds of one epoch; the data are reshuffled (when `shuffle`) at its start. */
  async trainEpoch(onRound?: (report: RoundReport) => void): Promise<EpochReport> {
    this.checkUsable('trainEpoch');
    if (onRound !== undefined && typeof onRound !== 'function') throw new InvalidArgumentError('PipelineTrainer.trainEpoch(onRound): onRound must be a function');
    this.busy = true;
    try {
      const start = performance.now();
      this.order = this.epochOrder(this.epochsRun);
      this.orderPosition = 0;
      let total = 0;
      let count = 0;
      const rounds = this.roundsPerEpoch;
      for (let r = 0; r < rounds; r++) {
        const report = await this.runRound();
        for (const l of report.losses) {
          total += l;
          count++;
        }
        onRound?.(report);
      }
      const epoch = this.epochsRun++;
      return { epoch, rounds, loss: count > 0 ? total / count : NaN, wallMs: performance.now() - start };
    } finally {
      this.busy = false;
    }
  }

  /** Copies of every part's weights, index = part (with a staleness-1 data-parallel mode, the gradient still in flight is not applied). */
  async weights(): Promise<Float32Array[]> {
    this.checkUsable('weights');
    this.busy = true;
    try {
      // Every pipeline holds the same weights (their replicas step alike): pipeline 0's.
      const replies = (await this.request('weights', { type: 'weights' })).slice(0, this.stagesPerPipeline);
      const out: Float32Array[] = [];
      for (const r of replies) if (r.type === 'weights') for (const p of r.parts) out[p.part] = p.weights;
      return out;
    } finally {
      this.busy = false;
    }
  }

  /**
   * A copy of the trainer's state between rounds (see PipelineTrainerState, version 2); for
   * checkpoints, savePipelineCheckpoint writes it to a file. Every configuration but Wavelet's
   * model-parallel form (whose stages each hold a copy of a part): one pipeline, parallel pipelines
   * coupled by dataParallel (sync or a staleness-1 mode: its averaged gradient in flight is kept),
   * AvgPipe in either layout (its centers too), SAPipe's workers and Wavelet's data-parallel form.
   */
  async exportState(): Promise<PipelineTrainerState> {
    this.checkUsable('exportState');
    this.checkCheckpointable('exportState');
    this.busy = true;
    try {
      const parts: PartCheckpointState[] = [];
      const centers: CenterCheckpointState[] = [];
      for (const r of await this.request('state', { type: 'exportState' }))
        if (r.type === 'state') {
          parts.push(...r.parts);
          centers.push(...r.centers);
        }
      const order = (a: { pipeline: number; part: number }, b: { pipeline: number; part: number }): number => a.pipeline - b.pipeline || a.part - b.part;
      parts.sort(order);
      centers.sort(order);
      const { coupling, averagingLayout } = this.options;
      return {
        version: 2,
        schedule: this.schedule.name,
        stages: this.schedule.stages,
        pipelines: this.replicaPipelines,
        coupling,
        ...(averagingLayout ? { averagingLayout } : {}),
        rounds: this.roundsRun,
        epochs: this.epochsRun,
        orderPosition: this.orderPosition,
        parts,
        ...(coupling === 'elastic-averaging' ? { centers } : {}),
      };
    } finally {
      this.busy = false;
    }
  }

  /**
   * Restores exportState()'s state into a trainer of the same configuration, model and optimizer
   * (typically a new one, to resume). Everything is checked before any stage changes; a state of
   * another configuration (schedule, stages, pipelines, coupling, AvgPipe's layout, data-parallel
   * mode) is an InvalidArgumentError naming both.
   */
  async importState(state: PipelineTrainerState): Promise<void> {
    this.checkUsable('importState');
    this.checkCheckpointable('importState');
    if (state === null || typeof state !== 'object' || (state.version !== 1 && state.version !== 2) || !Array.isArray(state.parts))
      throw new InvalidArgumentError('PipelineTrainer.importState: not a state from exportState() (version 1 or 2)');
    const { coupling, averagingLayout } = this.options;
    const pipelines = this.replicaPipelines;
    const mine = `'${this.schedule.name}' on ${this.schedule.stages} stages, ${pipelines} pipeline(s) coupled by ${coupling}${averagingLayout ? ` (${averagingLayout})` : ''}`;
    if (state.version === 1 && coupling !== 'none')
      throw new InvalidArgumentError(`PipelineTrainer.importState: a version 1 state is of one pipeline; this trainer runs ${mine}`);
    const theirs = state.version === 1 ? { pipelines: 1, coupling: 'none', averagingLayout: undefined } : state;
    if (state.schedule !== this.schedule.name || state.stages !== this.schedule.stages || theirs.pipelines !== pipelines || theirs.coupling !== coupling || theirs.averagingLayout !== averagingLayout)
      throw new InvalidArgumentError(
        `PipelineTrainer.importState: the state is of ${describeValue(state.schedule)} on ${describeValue(state.stages)} stages, ${describeValue(theirs.pipelines)} pipeline(s) coupled by ${describeValue(theirs.coupling)}${theirs.averagingLayout !== undefined ? ` (${describeValue(theirs.averagingLayout)})` : ''}; this trainer runs ${mine}`,
      );
    const keys = this.replicaKeys();
    if (state.parts.length !== keys.length)
      throw new InvalidArgumentError(`PipelineTrainer.importState: the state holds ${state.parts.length} replica(s); this trainer's ${pipelines} pipeline(s) hold ${keys.length} (${this.partLengths.length} part(s))`);
    for (const key of ['rounds', 'epochs', 'orderPosition'] as const)
      if (!Number.isSafeInteger(state[key]) || state[key] < 0) throw new InvalidArgumentError(`PipelineTrainer.importState: ${key} must be a non-negative integer, got ${describeValue(state[key])}`);
    if (state.orderPosition > this.samples) throw new InvalidArgumentError(`PipelineTrainer.importState: orderPosition ${state.orderPosition} is past the ${this.samples} samples of an epoch`);
    const replicas = keys.map(({ pipeline, part }, i) => {
      const p = state.parts[i]!;
      const name = coupling === 'none' ? `part ${part}` : `pipeline ${pipeline}'s part ${part}`;
      if (p === null || typeof p !== 'object') throw new InvalidArgumentError(`PipelineTrainer.importState: ${name}'s state is missing`);
      if (state.version === 2 && (p.pipeline !== pipeline || p.part !== part))
        throw new InvalidArgumentError(`PipelineTrainer.importState: parts[${i}] must be ${name}'s state (pipeline x parts + part), got pipeline ${describeValue(p.pipeline)}, part ${describeValue(p.part)}`);
      this.checkReplica(name, part, p);
      return { ...p, pipeline, part };
    });
    const centers = this.checkCenters(state.centers);
    this.busy = true;
    try {
      const byWorker = new Map<number, { parts: PartCheckpointState[]; centers: CenterCheckpointState[] }>();
      this.workers.forEach((_, w) => byWorker.set(w, { parts: [], centers: [] }));
      for (const r of replicas) byWorker.get(this.workerOf(r.pipeline, r.part))!.parts.push(r);
      for (const c of centers) byWorker.get(this.workerOf(c.pipeline, c.part))!.centers.push(c);
      await this.requestEach('imported', (w) => ({ type: 'importState', ...byWorker.get(w)! }));
      this.roundsRun = state.rounds;
      this.epochsRun = state.epochs;
      this.learningRate = state.parts[0]!.optimizer.lr;
      this.order = this.epochOrder(state.epochs);
      this.orderPosition = state.orderPosition;
    } finally {
      this.busy = false;
    }
  }

  /** The checks of one replica's state against its part (layout, optimizer, counters, data-parallel state); changes nothing. */
  private checkReplica(name: string, j: number, p: PipelineReplicaState): void {
    const length = this.partLengths[j]!;
    if (!(p.weights instanceof Float32Array) || p.weights.length !== length)
      throw new SizeMismatchError(`PipelineTrainer.importState: ${name}'s weights must be a Float32Array of ${length} values (the part's layout)`);
    if (p.optimizer === null || typeof p.optimizer !== 'object' || p.optimizer.length !== length || !Number.isSafeInteger(p.updates) || !Number.isSafeInteger(p.skipped))
      throw new InvalidArgumentError(`PipelineTrainer.importState: ${name}'s optimizer state or counters do not fit the part`);
    if (p.optimizer.kind !== this.partOptimizers[j])
      throw new InvalidArgumentError(`PipelineTrainer.importState: ${name}'s optimizer state is ${describeValue(p.optimizer.kind)}'s; this trainer's optimizer is '${this.partOptimizers[j]}'`);
    const buffers = p.optimizer.buffers !== null && typeof p.optimizer.buffers === 'object' ? Object.entries(p.optimizer.buffers).filter(([, d]) => d !== undefined) : [];
    const names = buffers.map(([n]) => n).sort();
    if (names.join() !== this.partBuffers[j]!.join() || buffers.some(([, d]) => !(d instanceof Float32Array) || d.length !== length))
      throw new InvalidArgumentError(`PipelineTrainer.importState: ${name}'s optimizer buffers are [${names.join(', ')}]; this trainer's optimizer keeps [${this.partBuffers[j]!.join(', ')}], each of ${length} values`);
    const o = p.optimizer;
    if (!Number.isSafeInteger(o.step) || o.step < 0 || !Number.isSafeInteger(o.skippedSteps) || o.skippedSteps < 0 || typeof o.lr !== 'number' || !Number.isFinite(o.lr) || o.lr < 0)
      throw new InvalidArgumentError(`PipelineTrainer.importState: ${name}'s optimizer counters or learning rate are not valid`);
    if (p.updates < 0 || p.skipped < 0 || p.skipped > p.updates) throw new InvalidArgumentError(`PipelineTrainer.importState: ${name}'s counters (updates ${p.updates}, skipped ${p.skipped}) are not counts`);
    const replicas = this.partDataParallel[j];
    const dp = p.dataParallel;
    if (replicas === undefined) {
      if (dp !== undefined) throw new InvalidArgumentError(`PipelineTrainer.importState: ${name}'s state holds data-parallel state; this trainer's part ${j} has no data-parallel replicas`);
      return;
    }
    const { mode, staleness, overlapped } = replicas;
    if (dp === null || typeof dp !== 'object' || dp.version !== 1 || dp.mode !== mode || !Number.isSafeInteger(dp.calls) || dp.calls < 0)
      throw new InvalidArgumentError(`PipelineTrainer.importState: ${name}'s replicas combine gradients in mode '${mode}'; the state's data-parallel state is ${dp === undefined ? 'missing' : `of mode ${describeValue(dp?.mode)}`} or not valid`);
    // What the part's DataParallelTrainer would refuse, refused here before any stage changes.
    const pending = dp.pending ?? null;
    const ahead = dp.ahead ?? null;
    if ((pending !== null && (staleness === 0 || overlapped)) || (ahead !== null && !overlapped))
      throw new InvalidArgumentError(
        `PipelineTrainer.importState: ${name}'s data-parallel state holds ${pending !== null ? 'a gradient not yet applied' : 'an update applied ahead'}, which this trainer's replicas (mode '${mode}', overlapUpdate ${overlapped ? 'on' : 'off'}) cannot hold; resume with the dataParallel options the state was saved with`,
      );
    if ((dp.residual ?? null) !== null || (dp.lossScale ?? null) !== null || (dp.accumulation ?? null) !== null)
      throw new InvalidArgumentError(`PipelineTrainer.importState: ${name}'s data-parallel state holds a compression residual, loss scale or accumulation, which a pipeline's replicas never keep`);
    const arrays = [...(pending ? [pending.averaged] : []), ...(ahead ? [ahead.weights] : []), ...(ahead?.predicted ? [ahead.predicted] : [])];
    if ((pending !== null && typeof pending !== 'object') || (ahead !== null && typeof ahead !== 'object') || arrays.some((a) => !(a instanceof Float32Array) || a.length !== length))
      throw new SizeMismatchError(`PipelineTrainer.importState: ${name}'s data-parallel arrays (gradient in flight, update ahead) must each be a Float32Array of ${length} values`);
  }

  /** AvgPipe's centers checked against this trainer's (one per part shared, one per replica otherwise); others have none. */
  private checkCenters(centers: PipelineTrainerState['centers']): CenterCheckpointState[] {
    const { coupling, averagingLayout } = this.options;
    if (coupling !== 'elastic-averaging') {
      if (centers !== undefined && (!Array.isArray(centers) || centers.length > 0)) throw new InvalidArgumentError('PipelineTrainer.importState: the state holds AvgPipe centers; this trainer averages nothing');
      return [];
    }
    const shared = averagingLayout === 'shared-stages';
    const keys = this.replicaKeys().filter(({ pipeline }) => !shared || pipeline === 0);
    if (!Array.isArray(centers) || centers.length !== keys.length)
      throw new InvalidArgumentError(`PipelineTrainer.importState: AvgPipe (${averagingLayout}) keeps ${keys.length} center(s) (${shared ? 'one per part' : 'one per pipeline and part'}); the state holds ${Array.isArray(centers) ? centers.length : 'none'}`);
    const counted = shared ? this.options.pipelines : 1;
    return keys.map(({ pipeline, part }, i) => {
      const c = centers[i]!;
      if (c === null || typeof c !== 'object' || c.pipeline !== pipeline || c.part !== part)
        throw new InvalidArgumentError(`PipelineTrainer.importState: centers[${i}] must be the center of pipeline ${pipeline}'s part ${part}`);
      if (!(c.weights instanceof Float32Array) || c.weights.length !== this.partLengths[part])
        throw new SizeMismatchError(`PipelineTrainer.importState: the center of pipeline ${pipeline}'s part ${part} must hold a Float32Array of ${this.partLengths[part]} weights`);
      if (!Array.isArray(c.updates) || c.updates.length !== counted || c.updates.some((u) => !Number.isSafeInteger(u) || u < 0))
        throw new InvalidArgumentError(`PipelineTrainer.importState: the center of pipeline ${pipeline}'s part ${part} must count ${counted} replica(s)' elasticAverage calls`);
      return { pipeline, part, weights: c.weights, updates: c.updates };
    });
  }

  /** The pipelines whose replicas a state holds: N, SAPipe's workers, or Wavelet's 2S waves. */
  private get replicaPipelines(): number {
    return this.options.coupling === 'waves' ? this.schedule.pipelines : this.options.pipelines;
  }

  /** Every replica, in a state's order (pipeline, then part); Wavelet's data-parallel pipelines each hold its one part. */
  private replicaKeys(): { pipeline: number; part: number }[] {
    const keys: { pipeline: number; part: number }[] = [];
    for (let pipeline = 0; pipeline < this.replicaPipelines; pipeline++) for (let part = 0; part < this.partLengths.length; part++) keys.push({ pipeline, part });
    return keys;
  }

  /** The worker holding pipeline `pipeline`'s replica of `part` (and its center). */
  private workerOf(pipeline: number, part: number): number {
    switch (this.options.coupling) {
      case 'waves':
        return Math.floor(pipeline / 2);
      case 'workers':
        return pipeline;
      default: {
        const stage = this.partHolders[part]![0]!;
        return this.sharedStages ? stage : pipeline * this.schedule.stages + stage;
      }
    }
  }

  /** Sets the learning rate of every part's optimizer (for a schedule of your own, between rounds). */
  setLr(lr: number): void {
    this.checkUsable('setLr');
    if (typeof lr !== 'number' || !Number.isFinite(lr) || lr < 0) throw new InvalidArgumentError(`PipelineTrainer.setLr: lr must be a finite number >= 0, got ${describeValue(lr)}`);
    for (const w of this.workers) w.postMessage({ type: 'lr', lr } satisfies ToStage);
    this.learningRate = lr;
  }

  /**
   * The learning rate of every part's optimizer; setting it is setLr(). An LrScheduler drives a
   * PipelineTrainer through it (`new LrScheduler(trainer, schedule)`, `scheduler.step()` after each round).
   */
  get lr(): number {
    return this.learningRate;
  }
  set lr(lr: number) {
    this.setLr(lr);
  }

  /**
   * Accuracy of the whole model (sapipe's layers) on `inputs`/`labels`: the parts' weights are
   * gathered and the unpartitioned model is evaluated on this thread. With P class indices per
   * sample (a language model's next tokens), the share of the P rows predicted right.
   */
  async evaluate(inputs: Float32Array, labels: ArrayLike<number>): Promise<number> {
    this.checkUsable('evaluate');
    if (this.options.loss !== 'cross-entropy') throw new InvalidArgumentError(`PipelineTrainer.evaluate measures classification accuracy; with the ${this.options.loss} loss, read the rounds' losses`);
    const model = this.checkEvaluation('evaluate', inputs, labels);
    return evaluateSequential(model, await this.weights(), inputs, labels, 'accuracy');
  }

  /**
   * The mean loss of the whole model (sapipe's layers) on `inputs`/`labels`, as the last stage
   * computes it in training (cross-entropy over every row, or mse): a validation loss; with a
   * language model's per-token cross-entropy, exp(loss) is the perplexity.
   */
  async evaluateLoss(inputs: Float32Array, labels: ArrayLike<number>): Promise<number> {
    this.checkUsable('evaluateLoss');
    const model = this.checkEvaluation('evaluateLoss', inputs, labels);
    return evaluateSequential(model, await this.weights(), inputs, labels, this.options.loss);
  }

  /**
   * evaluate() and evaluateLoss() from one forward pass over the inputs (a classifier's test
   * accuracy and validation loss each epoch, at the cost of one).
   */
  async evaluateAccuracyAndLoss(inputs: Float32Array, labels: ArrayLike<number>): Promise<{ accuracy: number; loss: number }> {
    this.checkUsable('evaluateAccuracyAndLoss');
    if (this.options.loss !== 'cross-entropy') throw new InvalidArgumentError(`PipelineTrainer.evaluateAccuracyAndLoss measures classification accuracy; with the ${this.options.loss} loss, use evaluateLoss`);
    const model = this.checkEvaluation('evaluateAccuracyAndLoss', inputs, labels);
    const [accuracy, loss] = evaluateSequentialMetrics(model, await this.weights(), inputs, labels, ['accuracy', this.options.loss]);
    return { accuracy: accuracy!, loss: loss! };
  }

  /**
   * The checks evaluate() and evaluateLoss() share: a model of sapipe's layers, and inputs and
   * labels that fit it under the trainer's loss (1 or P class indices per sample, P dividing the
   * outputs; mse: a target per output). Returns the model.
   */
  private checkEvaluation(what: string, inputs: Float32Array, labels: ArrayLike<number>): Extract<PipelineModelSpec, { kind: 'sequential' }> {
    if (this.model.kind !== 'sequential')
      throw new InvalidArgumentError(`PipelineTrainer.${what} works for models of sapipe layers; evaluate your own stage models with the weights from weights()`);
    if (!(inputs instanceof Float32Array)) throw new InvalidArgumentError(`PipelineTrainer.${what}: inputs must be a Float32Array`);
    const mse = this.options.loss === 'mse';
    if (labels === null || typeof labels !== 'object' || typeof labels.length !== 'number' || labels.length === 0)
      throw new InvalidArgumentError(`PipelineTrainer.${what}: labels must be a non-empty array of ${mse ? 'targets' : 'class indices'}`);
    const widths = checkLayers(this.model.layers);
    const [features, outputs] = [widths[0]!, widths[widths.length - 1]!];
    const samples = inputs.length / features;
    const per = labels.length / samples;
    const fits = mse ? per === outputs : Number.isInteger(per) && per >= 1 && outputs % per === 0;
    if (!Number.isInteger(samples) || samples < 1 || !fits)
      throw new SizeMismatchError(
        `PipelineTrainer.${what}: inputs hold ${inputs.length} values (samples of ${features} features) and labels ${labels.length}, which do not fit the model's ${outputs} outputs under the ${this.options.loss} loss (${mse ? 'a target per output' : '1 or P class indices per sample, P dividing the outputs'})`,
      );
    return this.model;
  }

  /** Stops the stage workers and frees everything; idempotent. The trainer cannot be used afterwards. */
  async dispose(): Promise<void> {
    if (this.isDisposed) return;
    this.isDisposed = true;
    clearTimeout(this.secondary);
    for (const p of this.pending) {
      clearTimeout(p.timer);
      p.reject(new DisposedError('PipelineTrainer was disposed while waiting for its stages'));
    }
    this.pending.clear();
    const exits = this.workers.map(
      (w) =>
        new Promise<void>((resolve) => {
          const timer = setTimeout(() => void w.terminate().then(() => resolve()), 2000);
          w.once('exit', () => {
            clearTimeout(timer);
            resolve();
          });
        }),
    );
    for (const w of this.workers) {
      try {
        if (this.failure === undefined) w.postMessage({ type: 'stop' } satisfies ToStage);
        else void w.terminate();
      } catch {
        void w.terminate();
      }
    }
    await Promise.all(exits);
  }

  private async runRound(): Promise<RoundReport> {
    const perRound = this.samplesPerRound;
    if (this.orderPosition + perRound > this.order.length) {
      this.order = this.epochOrder(++this.epochsRun);
      this.orderPosition = 0;
    }
    const samples = this.order.slice(this.orderPosition, this.orderPosition + perRound);
    this.orderPosition += perRound;
    const startAt = performance.timeOrigin + performance.now();
    const start = performance.now();
    const replies = await this.request('round', { type: 'round', startAt, samples });
    const wallMs = performance.now() - start;
    // In worker order: pipeline 0's stages first.
    const all = replies.map((r) => (r as Extract<FromStage, { type: 'round' }>).result);
    // The timeline's rows: pipeline 0's stages, or every worker where a worker runs a row.
    const results = all.slice(0, this.schedule.stages);
    const per = this.stagesPerPipeline;
    const dense: number[] = [];
    // The workers of each pipeline (AvgPipe's shared stages: one group, its losses indexed pipeline x M + micro-batch).
    const groups = this.sharedStages ? 1 : this.options.pipelines;
    for (let p = 0; p < groups; p++) {
      const losses: number[] = [];
      for (const r of all.slice(p * per, (p + 1) * per)) r.losses.forEach((l, m) => l !== undefined && (losses[m] = l));
      dense.push(...losses.filter((l) => l !== undefined));
    }
    return {
      round: this.roundsRun++,
      loss: dense.reduce((a, b) => a + b, 0) / Math.max(1, dense.length),
      losses: dense,
      wallMs,
      timeline: results.map((r) => r.timeline),
      versions: results.map((r) => r.versions),
      peakActivations: results.map((r: StageRoundResult) => r.peakActivations),
      ...(results.every((r) => r.replicaPeaks) ? { replicaPeaks: results.map((r) => r.replicaPeaks!) } : {}),
      peakStashed: results.map((r) => r.peakStashed),
      predictedCopies: results.map((r) => r.predictedCopies),
      peakActivationBytes: results.map((r) => r.peakActivationBytes),
      peakStashedBytes: results.map((r) => r.peakStashedBytes),
      modelBytes: results.map((r) => r.modelBytes),
      skippedSteps: all.reduce((n, r) => n + r.skippedSteps, 0),
    };
  }

  private epochOrder(epoch: number): Int32Array {
    return epochOrder(this.samples, this.options.shuffle, this.options.seed, epoch);
  }

  /** Sends `message` to every stage (none for 'ready') and waits for one reply of `type` from each. */
  private request(type: Pending['type'], message: ToStage | undefined): Promise<FromStage[]> {
    return this.requestEach(type, message && (() => message));
  }

  /** As request(), with a message of its own for each stage. */
  private requestEach(type: Pending['type'], messageFor: ((stage: number) => ToStage) | undefined): Promise<FromStage[]> {
    if (this.failure !== undefined) return Promise.reject(this.failure);
    return new Promise<FromStage[]>((resolve, reject) => {
      const entry: Pending = {
        type,
        replies: new Map(),
        resolve,
        reject,
        timer: setTimeout(() => {
          const missing = this.workers.map((_, s) => s).filter((s) => !entry.replies.has(s));
          this.fail(new TimeoutError(`PipelineTrainer: ${missing.map((i) => this.workerName(i)).join(', ')} did not answer (${type}) within ${this.options.timeoutMs} ms; every stage was stopped`));
        }, this.options.timeoutMs + 5000),
      };
      this.pending.add(entry);
      if (messageFor) this.workers.forEach((w, s) => w.postMessage(messageFor(s)));
    });
  }

  private onMessage(stage: number, message: FromStage): void {
    if (message.type === 'error') {
      const { name, code, message: text, stack } = message.error;
      const cause = Object.assign(new Error(text), { name, code, stack });
      const error = new RankFailedError(`${this.workerName(stage)} failed: ${code ? `${code}: ` : ''}${text}`, { cause, rank: stage });
      if (code === 'ERR_PEER_LOST' || code === 'ERR_TIMEOUT') {
        // A stage that lost its peer is a consequence; the stage that died or threw usually says so
        // a moment later, and the job should fail with that cause.
        this.secondary ??= setTimeout(() => this.fail(error), SECONDARY_GRACE_MS);
        return;
      }
      this.fail(error);
      return;
    }
    for (const p of this.pending) {
      if (p.type !== message.type || p.replies.has(stage)) continue;
      p.replies.set(stage, message);
      if (p.replies.size === this.workers.length) {
        clearTimeout(p.timer);
        this.pending.delete(p);
        p.resolve(this.workers.map((_, i) => p.replies.get(i)!));
      }
      return;
    }
  }

  /** The first failure ends the job: every stage is stopped and every wait rejects with it. */
  private fail(error: unknown): void {
    if (this.failure !== undefined || this.isDisposed) return;
    this.failure = error;
    clearTimeout(this.secondary);
    for (const p of this.pending) {
      clearTimeout(p.timer);
      p.reject(error);
    }
    this.pending.clear();
    for (const w of this.workers) void w.terminate();
  }

  /** Checkpoints cover every configuration whose parts each live on one stage of a pipeline. */
  private checkCheckpointable(what: string): void {
    if (this.partHolders.some((stages) => stages.length > 1))
      throw new InvalidArgumentError(
        `PipelineTrainer.${what}: checkpoints of '${this.schedule.name}', whose stages each hold a copy of a part (Wavelet's model-parallel form), are planned; ` +
          `supported: one pipeline, parallel pipelines (dataParallel, AvgPipe in either layout), SAPipe's workers and Wavelet's data-parallel form`,
      );
  }

  /** Workers per pipeline: its stages, or 1 where the schedule's rows are data-parallel workers (AvgPipe's shared stages: every worker is every pipeline's). */
  private get stagesPerPipeline(): number {
    return this.options.rowsAreWorkers ? 1 : this.schedule.stages;
  }

  /** AvgPipe's pipelines share the stage workers. */
  private get sharedStages(): boolean {
    return this.options.averagingLayout === 'shared-stages';
  }

  /** Worker `index` in messages: its stage, and its pipeline when there are several. */
  private workerName(index: number): string {
    if (this.options.rowsAreWorkers) return `data-parallel worker ${index}`;
    if (this.sharedStages) return `pipeline stage ${index} (every pipeline's)`;
    const stages = this.schedule.stages;
    return this.options.pipelines > 1 ? `pipeline ${Math.floor(index / stages)} stage ${index % stages}` : `pipeline stage ${index}`;
  }

  private checkUsable(what: string): void {
    if (this.isDisposed) throw new DisposedError(`PipelineTrainer.${what}: the trainer was disposed; create a new one`);
    if (this.failure !== undefined) throw this.failure instanceof SapipeError ? this.failure : new RankFailedError(`PipelineTrainer.${what}: the job failed earlier`, { cause: this.failure, rank: -1 });
    if (this.busy) throw new BusyError(`PipelineTrainer.${what}: another call is in flight; await it first`);
  }
}

/**
 * @internal A sequential model's `metric` from its parts' weights, on this thread: `accuracy` per
 * sample, or per row with P class indices per sample (a label outside the classes counts as
 * wrong); or its mean loss as the runtime's last stage computes it (`cross-entropy` over every row,
 * `mse` over every output).
 */
export function evaluateSequential(
  model: Extract<PipelineModelSpec, { kind: 'sequential' }>,
  parts: readonly Float32Array[],
  inputs: Float32Array,
  labels: ArrayLike<number>,
  metric: 'accuracy' | PipelineLoss,
): number {
  return evaluateSequentialMetrics(model, parts, inputs, labels, [metric])[0]!;
}

/** @internal {@link evaluateSequential} for several metrics from one forward pass over the inputs, in the order asked. */
export function evaluateSequentialMetrics(
  model: Extract<PipelineModelSpec, { kind: 'sequential' }>,
  parts: readonly Float32Array[],
  inputs: Float32Array,
  labels: ArrayLike<number>,
  metrics: readonly ('accuracy' | PipelineLoss)[],
): number[] {
  const whole = new Sequential(model.layers, { seed: model.seed ?? 0 });
  const ranges = partRanges(model.layers.length, model.boundaries);
  // Chunks of at most about 4M floats in the widest layer (a GPT's logits are context x vocab per sample).
  const widest = Math.max(...checkLayers(model.layers));
  const batch = Math.max(1, Math.min(1024, Math.floor((4 * 2 ** 20) / widest)));
  const x = FlatBuffer.allocate(batch * whole.inputSize);
  try {
    ranges.forEach(([s, e], j) => {
      const part = new Sequential(model.layers, { seed: model.seed ?? 0, range: [s, e] });
      try {
        part.params.weights.array.set(parts[j]!);
        for (const name of part.params.names) if (name !== 'unused') whole.params.view(whole.params.weights, name).set(part.params.view(part.params.weights, name));
      } finally {
        part.dispose();
      }
    });
    const [features, outputs] = [whole.inputSize, whole.outputSize];
    const samples = inputs.length / features;
    const per = labels.length / samples;
    const classes = outputs / per;
    const labelsOf = (first: number, count: number): ArrayLike<number> =>
      ArrayBuffer.isView(labels) ? (labels as unknown as Float32Array).subarray(first, first + count) : Array.prototype.slice.call(labels, first, first + count);
    const totals = new Float64Array(metrics.length);
    for (let start = 0; start < samples; start += batch) {
      const n = Math.min(batch, samples - start);
      x.array.set(inputs.subarray(start * features, (start + n) * features));
      const out = whole.forward(0, x, n, whole.params.weights).array.subarray(0, n * outputs);
      metrics.forEach((metric, k) => {
        let sum = 0;
        if (metric === 'cross-entropy') sum = n * per * softmaxCrossEntropy(out, labelsOf(start * per, n * per), n * per, classes);
        else if (metric === 'mse') for (let i = 0; i < n * outputs; i++) sum += (out[i]! - labels[start * outputs + i]!) ** 2;
        else
          for (let r = 0; r < n * per; r++) {
            let best = 0;
            for (let c = 1; c < classes; c++) if (out[r * classes + c]! > out[r * classes + best]!) best = c;
            if (best === labels[start * per + r]) sum++;
          }
        totals[k] = totals[k]! + sum;
      });
      whole.release(0);
    }
    return metrics.map((metric, k) => totals[k]! / (metric === 'mse' ? samples * outputs : labels.length));
  } finally {
    x.dispose();
    whole.dispose();
  }
}
