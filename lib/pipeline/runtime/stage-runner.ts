/**
 * Executes one stage's action list of a validated schedule, in order, on real model parts: the
 * interpreter at the centre of the pipeline runtime. It knows nothing of threads or processes: it
 * is given a communicator (any backend), the model part(s) this stage holds with their optimizers,
 * and where micro-batches come from; the worker (thread or launched process) around it does the rest.
 *
 * Weights. A forward, backward or weight-gradient action reads, in this order of precedence: the
 * predicted weights when a `predictWeights` action for the same micro-batch came before it
 * (PipeOptim, SpecTrain); a stashed copy when its `version` is older than the current one
 * (PipeDream's stash, 2BW's double buffer); else the current weights. Stashing is driven by the
 * versions alone: before an optimizer step, the current weights are copied (one native copy)
 * exactly when a later action still reads that version, and a copy is freed after its last
 * reader. So `stashWeights`/`restoreWeights` actions need no work of their own, and a schedule
 * that reads old versions without them (2BW) holds the same buffers.
 *
 * Gradients. Each part accumulates the gradients of its backwards into its ParamSet's gradient
 * buffer (the first backward after a step overwrites, the next ones add, inside the same SGEMM);
 * an optimizer step applies the mean over the micro-batches accumulated (`gradScale / count`), so
 * GPipe over M micro-batches of b samples equals one step on the batch of M*b samples.
 *
 * All-reduces. A schedule whose stages each hold a replica of a part (Wavelet's model-parallel
 * form) sums the part's accumulated gradients over every stage of the pipeline with an
 * `allReduce` action, started without waiting; the part's next `optimizerStep` waits for it and
 * applies the mean over every micro-batch any stage accumulated (a count the schedule fixes, so
 * no count is exchanged). Every stage must name the same reductions in the same order.
 *
 * Data-parallel workers. Where the schedule's rows are workers (SAPipe: row x holds pipeline x's
 * passes and the reductions every row joins, named pipeline 0), a runner runs its whole row, and
 * its part's replicas are a DataParallelTrainer over the workers in a staleness-1 mode: an
 * `allReduce` action calls its step() (which starts the all-reduce of this iteration's gradient and
 * applies the previous one, compensated, when it lands), the next `optimizerStep` waits for that
 * step, and an `optimizerStep` with no step before it (the round's last) flushes the one in flight.
 * Passes read the trainer's forward weights (predicted in `sapipe-wp`), so `predictWeights` is the
 * trainer's work.
 *
 * Two waves per worker (Wavelet's data-parallel form: 2S pipelines, worker x's row holding
 * pipelines 2x (tick) and 2x+1 (tock) of the one part, and `allReduce` actions naming wave 0 or 1).
 * Given `pipeline: 'every'` and the worker's two replicas, a runner runs its row: a wave's
 * `allReduce` keeps a copy of the wave's gradient (its latest), averages the gradient with the
 * other wave's latest of the round on this worker (none before the tock's first backward: the
 * tick's first goes alone), and starts a sum over `comm` (the S workers; tick and tock reductions
 * alternate in the same order on every worker); the wave's next `optimizerStep` waits for it and
 * applies the sum over S. Wave w's micro-batch m is the source's micro-batch `w x M + m`.
 *
 * Every pipeline of a row (AvgPipe's `shared-stages` layout). Given `pipeline: 'every'`, a runner
 * executes its whole row as the generator interleaved it, holding a replica of each of its parts
 * per pipeline (`StagePart.pipeline`): each action goes to its pipeline's replica, its messages
 * travel over that pipeline's transport (`comm`: one per pipeline, so that the pipelines' messages
 * between two stages never wait on each other's order), and pipeline p's micro-batch m is the
 * source's micro-batch `p x M + m` (so are its loss's index and its data).
 */
import { performance } from 'node:perf_hooks';

import { Communicator } from '../../comm/communicator.js';
import { commBackendEntry } from '../../comm/registry.js';
import { DataParallelTrainer, type DataParallelStepResult } from '../../dataparallel/trainer.js';
import { DeviceParamSet } from '../../device/param-set.js';
import { DeviceEvents } from '../../device/events.js';
import type { DeviceStream } from '../../device/stream.js';
import { BusyError, DisposedError, InternalError, InvalidArgumentError, InvalidScheduleError } from '../../errors.js';
import { callNative, nativeAddon } from '../../native.js';
import { sgemm } from '../../nn/gemm.js';
import { modelDevice, softmaxXent, type ModelDevice, type Tensor } from '../../nn/ops.js';
import type { StageModel } from '../../nn/stage-model.js';
import { softmaxCrossEntropy } from '../../nn/softmax-cross-entropy.js';
import { Optimizer, STATE_BUFFER_NAMES } from '../../optim/optimizer.js';
import { FlatBuffer } from '../../tensor.js';
import { checkInteger, checkNumber, checkObject, describeValue } from '../../validate.js';
import { validateSchedule } from '../validate.js';
import { type Action, type Schedule, formatAction, hasTwoWaves } from '../schedule.js';
import { messageOf, type TimedAction } from '../timeline.js';

/**
 * What the last stage's loss compares the model's output with (`data.labels`):
 * - `cross-entropy` (default): softmax cross-entropy against class indices, one per sample, or P
 *   per sample (a language model's next tokens: the output is P rows of outputSize/P logits, the
 *   loss their mean over every row);
 * - `mse`: mean squared error, (1/n) sum (y - t)^2 over the n = batch x outputSize outputs, against
 *   outputSize real targets per sample.
 *
 * @category Pipeline runtime
 */
export type PipelineLoss = (typeof PIPELINE_LOSSES)[number];
/** The losses of {@link PipelineLoss}. @category Pipeline runtime */
export const PIPELINE_LOSSES = ['cross-entropy', 'mse'] as const;

/** Where a stage's micro-batches come from. @category Pipeline runtime */
export interface MicroBatchSource {
  /** Samples per micro-batch. */
  readonly batch: number;
  /**
   * The input of a micro-batch (batch x the first part's inputSize); asked of the stage holding
   * part 0. A host buffer; on a device stage the runner copies it in.
   */
  input(microBatch: number): FlatBuffer;
  /**
   * Its targets, asked of the stage holding the last part: with the (default) cross-entropy, class
   * indices, one per sample or P per sample (the output then holds P rows of outputSize/P logits per
   * sample); with `mse`, outputSize reals per sample.
   */
  labels(microBatch: number): ArrayLike<number>;
  /** The last stage's loss (default `cross-entropy`; see PipelineLoss). */
  readonly loss?: PipelineLoss;
}

/** One part of the model on this stage, with its optimizer. @category Pipeline runtime */
export interface StagePart {
  readonly part: number;
  /** With a runner of every pipeline of its row (`pipeline: 'every'`): the pipeline whose replica of the part this is. */
  readonly pipeline?: number;
  /** A host model (`StageModel<FlatBuffer>`, e.g. a CPU `Sequential`), or one on `device`'s memory. */
  readonly model: StageModel | StageModel<FlatBuffer>;
  readonly optimizer: Optimizer;
  /** SpecTrain: the backward prediction's share of the forward one (0: the backward reads no prediction). */
  readonly backwardPredictionRatio: number;
  /**
   * Parallel pipelines: the data-parallel trainer over this part's replicas (its optimizer is
   * `optimizer`). The part's steps go through it, and its passes read its forward weights.
   */
  readonly replicas?: DataParallelTrainer;
  /**
   * AvgPipe: the `elasticAverage` action, averaging this part's weights with its replicas' center.
   * On a device it must be synchronous: the runner calls it on the pipeline's stream, and the
   * device work it enqueues goes there.
   */
  readonly average?: () => Promise<void> | void;
  /**
   * A part whose model runs on a device (`model.device` is `cuda:N`): its weights, gradients and
   * optimizer state there (made from `model.params` and `optimizer`). Every pass reads and writes
   * them, the optimizer step and the prediction run there, and the stashed versions live there.
   */
  readonly device?: DeviceParamSet;
}

/**
 * How a stage reaches its pipeline's other stages: a {@link Communicator} (threads, processes), or
 * the in-process device links of stages sharing one device. Only send/recv are asked of a
 * transport that is not a Communicator.
 *
 * @category Pipeline runtime
 */
export interface StageTransport<B extends Tensor = Tensor> {
  /** Stages joined. */
  readonly size: number;
  send(buffer: B, peer: number): Promise<void>;
  recv(buffer: B, peer: number): Promise<void>;
  allreduce?(buffer: B, options: { op: 'sum' }): Promise<unknown>;
  /**
   * Whether a send may be posted ahead of the receives its row puts before it (default false):
   * true where each send waits for its receiver on its own, holding up nothing else. The runner
   * then posts every send as soon as its message exists (see StageRunner.runRound). A transport
   * that runs its sends and receives in one order (NCCL's stream) must leave it false: a send
   * posted before a receive its peer is waiting to complete first would deadlock.
   */
  readonly independentSends?: boolean;
  /**
   * The stage's own stream, where stages share a device in one process (DeviceLinks): the runner
   * enqueues its device work on it (see StageRunner's `onStream`), and the transport orders its
   * copies against it with events.
   */
  readonly stream?: DeviceStream;
  /** With `stream`: resolves once the stream has run everything enqueued so far, bounded by the transport's timeout. */
  idle?(): Promise<void>;
}

/** The weight version each compute action read, for tests and reports. @category Pipeline runtime */
export interface VersionRead {
  readonly kind: 'forward' | 'backward' | 'weightGrad';
  readonly part: number;
  /** The pipeline whose replica read it, where a runner runs every pipeline of its row (AvgPipe's shared stages). */
  readonly pipeline?: number;
  readonly microBatch: number;
  /** Optimizer steps of the part applied to the weights read (absolute, counted from the start of training). */
  readonly version: number;
  readonly predicted: boolean;
}

/** What a stage reports after a round. @category Pipeline runtime */
export interface StageRoundResult {
  readonly stage: number;
  /** Start and end of every action, milliseconds from the round's start. */
  readonly timeline: TimedAction[];
  /** The loss of every micro-batch whose last part ran here (index = micro-batch; a runner of every pipeline: pipeline x M + micro-batch), else empty. */
  readonly losses: number[];
  readonly versions: VersionRead[];
  /** Most stashed weight copies held at once (beside the current and predicted weights). */
  readonly peakStashed: number;
  /** Predicted weight copies the stage's parts keep beside their weights (one per part whose optimizer predicts). */
  readonly predictedCopies: number;
  /** Most micro-batch activations held at once. */
  readonly peakActivations: number;
  /** Most bytes of stored activations held at once (0 when the models do not say: StageModel.activationFloats). */
  readonly peakActivationBytes: number;
  /**
   * A runner of every pipeline of its row (Wavelet's data-parallel worker: tick, tock; AvgPipe's
   * shared stages): each replica's own peak stored micro-batches and bytes, by pipeline. The
   * stage's `peakActivations` is the peak of their sum (held at once), at most the sum of these.
   */
  readonly replicaPeaks?: readonly { readonly pipeline: number; readonly peakActivations: number; readonly peakActivationBytes: number }[];
  /** Most bytes of stashed weight copies held at once. */
  readonly peakStashedBytes: number;
  /** Bytes of the parts' weights, gradients and optimizer state (held throughout). */
  readonly modelBytes: number;
  /** Steps the non-finite guard skipped in this round, over this stage's parts. */
  readonly skippedSteps: number;
}

interface PartState {
  readonly spec: StagePart;
  /** Optimizer steps run by this stage on the part (applied or skipped by the non-finite guard): the version counter. */
  updates: number;
  /** `updates` at the start of this round (the absolute version of round version 0). */
  base: number;
  /** Steps the non-finite guard skipped. */
  skipped: number;
  /** Backwards accumulated since the last step. */
  accumulated: number;
  /** Round version -> stashed copy. */
  readonly stash: Map<number, Tensor>;
  /** Round version -> index of the last action on this stage that reads it. */
  lastRead: Map<number, number>;
  /** SpecTrain's backward prediction, and the step count it was computed at. */
  backwardPrediction: Tensor | undefined;
  backwardPredictionAt: number;
}

/** A part's weights, gradients and forward (predicted) weights where it runs: its DeviceParamSet's on a device. */
const weightsOf = (p: StagePart): Tensor => p.device?.weights ?? p.model.params.weights;
const gradsOf = (p: StagePart): Tensor => p.device?.grads ?? p.model.params.grads;
const forwardWeightsOf = (p: StagePart): Tensor => p.device?.forwardWeights ?? p.optimizer.forwardWeights;
/** The part's model, taking the tensors of its memory (the runner hands each model only those: see `memory`). */
const modelOf = (p: StagePart): StageModel => p.model as StageModel;

const now = (): number => performance.timeOrigin + performance.now();

/**
 * Runs one stage of a schedule, round after round (a round is one pass over the schedule's
 * micro-batches). Not reentrant: one round at a time.
 *
 * @category Pipeline runtime
 */
export class StageRunner {
  private readonly actions: readonly Action[];
  /** Positions of the row's sends, in row order. */
  private readonly sendIndices: readonly number[];
  private readonly parts = new Map<number, PartState>();
  private readonly lastPart: number;
  private readonly classes: number;
  /** Where this stage's parts run (one memory per stage): buffers, copies and the loss go there. */
  private readonly memory: ModelDevice;
  /** A device stage's own stream (its transport's), or undefined: the device's default stream. */
  private readonly stream: DeviceStream | undefined;
  /** Its transport's wait for the stream to run dry (see StageTransport.idle). */
  private readonly streamIdle: (() => Promise<void>) | undefined;
  /**
   * AvgPipe's shared stages on a device: pipeline p's stream (its transport's), where its replica's
   * work goes, or undefined. Buffers the runner reuses and its scratch are then kept per pipeline,
   * so that no two streams touch one buffer.
   */
  private readonly pipelineStreams: readonly { stream: DeviceStream; idle?: () => Promise<void> }[] | undefined;
  /** Elastic averaging on several streams: an event behind the last exchange, the stream it was on. */
  private averagingOrder: { event: DeviceEvents; stream: DeviceStream } | undefined;
  /** Reusable buffers by pipeline (one list where the stage has one stream or none). */
  private readonly pools = new Map<number, Tensor[]>();
  /** A device stage's scratch (by pipeline, as the pools): the labels of one micro-batch, and a 1 for scaled adds. */
  private readonly deviceScratch = new Map<number, { labels: Tensor; one: Tensor }>();
  private disposed = false;
  private running = false;
  /** The i-th allReduce action's count of micro-batch gradients summed over every stage. */
  private readonly reductionCounts: readonly number[] = [];
  /** Parts whose replicas' exchange the row's allReduce actions drive (data-parallel workers). */
  private readonly workerExchange = new Set<number>();
  /** The runner runs every pipeline of its row (`pipeline: 'every'`), AvgPipe's: one transport per pipeline. */
  private readonly shared: boolean;
  /** Wavelet's data-parallel worker: its row's two waves (`pipeline: 'every'`), one communicator over the workers. */
  private readonly waves: boolean;
  /** Parts are keyed by pipeline and part (`pipeline: 'every'`). */
  private readonly byPipeline: boolean;
  private readonly partCount: number;
  /** The schedule's rows (Wavelet's data-parallel form: its workers, over which each wave sums). */
  private readonly workers: number;
  private readonly microBatches: number;
  /** Each part's input and output widths (any replica's). */
  private readonly sizes = new Map<number, { inputSize: number; outputSize: number }>();

  /**
   * `pipeline`: which of the schedule's pipelines this runner executes (AvgPipe's action lists hold
   * N; in the `worker-per-replica` layout each pipeline's stages run on their own workers and
   * exchange through their own `comm`), or `'every'`: the whole row, every pipeline's actions on
   * its own replica of the part (`parts[].pipeline`), `comm` then one transport per pipeline (for
   * a Wavelet data-parallel worker, whose row holds its two waves: its tick and tock replicas, and
   * `comm` the one communicator over the workers).
   */
  constructor(
    readonly stage: number,
    schedule: Schedule,
    private readonly comm: Communicator<FlatBuffer> | StageTransport | readonly (Communicator<FlatBuffer> | StageTransport)[] | undefined,
    parts: readonly StagePart[],
    readonly pipeline: number | 'every' = 0,
  ) {
    const s = schedule as Partial<Schedule> | null;
    if (s === null || typeof s !== 'object' || !Number.isInteger(s.stages) || !Array.isArray(s.actions) || !Number.isInteger(s.parts))
      throw new InvalidArgumentError(`StageRunner: schedule must be a Schedule (from generateSchedule or createSchedule), got ${describeValue(schedule)}`);
    validateSchedule(schedule);
    checkInteger(stage, 'StageRunner: stage', 0, schedule.stages - 1);
    this.waves = pipeline === 'every' && hasTwoWaves(schedule);
    this.shared = pipeline === 'every' && !this.waves;
    this.byPipeline = pipeline === 'every';
    this.partCount = schedule.parts;
    this.workers = schedule.stages;
    this.microBatches = schedule.microBatches;
    if (!this.byPipeline) checkInteger(pipeline, 'StageRunner: pipeline', 0, schedule.pipelines - 1);
    const badLink = (x: unknown): boolean => {
      const link = x as Partial<StageTransport> | null;
      return link === null || typeof link !== 'object' || typeof link.send !== 'function' || typeof link.recv !== 'function' || !Number.isInteger(link.size);
    };
    if (this.shared) {
      if (comm !== undefined && (!Array.isArray(comm) || comm.length !== schedule.pipelines || comm.some(badLink)))
        throw new InvalidArgumentError(`StageRunner: a runner of every pipeline takes one transport per pipeline (${schedule.pipelines}) as comm, or undefined, got ${describeValue(comm)}`);
    } else if (comm !== undefined && (Array.isArray(comm) || badLink(comm)))
      throw new InvalidArgumentError(`StageRunner: comm must be a Communicator (or a stage transport with size, send and recv) or undefined, got ${describeValue(comm)}`);
    if (!Array.isArray(parts)) throw new InvalidArgumentError('StageRunner: parts must be an array of { part, model, optimizer, backwardPredictionRatio }');
    for (const [i, p] of parts.entries()) {
      checkObject(p, `StageRunner: parts[${i}]`);
      checkInteger(p.part, `StageRunner: parts[${i}].part`, 0, schedule.parts - 1);
      if (this.waves) checkInteger(p.pipeline, `StageRunner: parts[${i}].pipeline (a Wavelet data-parallel worker takes its tick and tock replicas)`, 2 * stage, 2 * stage + 1);
      else if (this.shared) checkInteger(p.pipeline, `StageRunner: parts[${i}].pipeline (a runner of every pipeline takes a replica per pipeline)`, 0, schedule.pipelines - 1);
      else if (p.pipeline !== undefined) throw new InvalidArgumentError(`StageRunner: parts[${i}].pipeline is for a runner of every pipeline (pipeline 'every'); leave it out`);
      if (!(p.optimizer instanceof Optimizer)) throw new InvalidArgumentError(`StageRunner: parts[${i}].optimizer must be an Optimizer (SGD, Adam, AdamW)`);
      const m = p.model as Partial<StageModel> | null;
      if (m === null || typeof m !== 'object' || typeof m.forward !== 'function' || typeof m.backward !== 'function' || m.params !== p.optimizer.params)
        throw new InvalidArgumentError(`StageRunner: parts[${i}].model must be a StageModel whose params the optimizer updates`);
      checkNumber(p.backwardPredictionRatio, `StageRunner: parts[${i}].backwardPredictionRatio`, 0, 1);
      if (p.average !== undefined && typeof p.average !== 'function') throw new InvalidArgumentError(`StageRunner: parts[${i}].average must be a function`);
      if (p.replicas !== undefined && (!(p.replicas instanceof DataParallelTrainer) || p.replicas.optimizer !== p.optimizer))
        throw new InvalidArgumentError(`StageRunner: parts[${i}].replicas must be the DataParallelTrainer whose optimizer is parts[${i}].optimizer`);
      const device = (m.device as unknown) ?? 'cpu';
      if (p.device !== undefined) {
        if (!(p.device instanceof DeviceParamSet) || p.device.params !== m.params || p.device.optimizer !== p.optimizer || p.device.device !== device)
          throw new InvalidArgumentError(`StageRunner: parts[${i}].device must be the DeviceParamSet of the part's params and optimizer on the model's device (${String(device)})`);
        if (p.replicas !== undefined || (p.average !== undefined && !this.shared))
          throw new InvalidArgumentError(`StageRunner: parts[${i}] runs on ${device}: parallel pipelines on devices run as AvgPipe's shared stages (a runner of every pipeline); data-parallel replicas and the worker-per-replica layout there are planned`);
        if (p.optimizer.readsLocalGrad)
          throw new InvalidArgumentError(`StageRunner: parts[${i}]'s optimizer reads a local gradient, which a pipeline part on a device does not keep`);
      } else if (device !== 'cpu') throw new InvalidArgumentError(`StageRunner: parts[${i}].model runs on ${String(device)}; give its DeviceParamSet as parts[${i}].device`);
    }
    const devices = new Set(parts.map((p) => p.model.device ?? 'cpu'));
    if (devices.size > 1) throw new InvalidArgumentError(`StageRunner: a stage's parts run in one memory, got ${[...devices].join(' and ')}`);
    this.memory = modelDevice([...devices][0] ?? 'cpu');
    const transport = this.memory.device !== 'cpu' && comm !== undefined && !Array.isArray(comm) ? (comm as StageTransport) : undefined;
    this.stream = transport?.stream;
    this.streamIdle = this.stream ? transport?.idle?.bind(transport) : undefined;
    // AvgPipe's shared stages on a device: each pipeline's work on its pipeline's stream (its transport's).
    if (this.memory.device !== 'cpu' && this.shared && Array.isArray(comm)) {
      const transports = comm as readonly StageTransport[];
      if (transports.some((t) => !t.stream)) throw new InvalidArgumentError('StageRunner: a runner of every pipeline on a device takes one transport per pipeline, each with a stream of its own (DeviceLinks)');
      this.pipelineStreams = transports.map((t) => ({ stream: t.stream!, ...(t.idle ? { idle: t.idle.bind(t) } : {}) }));
    }
    const row = schedule.actions[stage] ?? [];
    this.actions = this.byPipeline || rowsAreWorkers(schedule) ? row : row.filter((a) => a.pipeline === pipeline);
    this.sendIndices = this.actions.flatMap((a, i) => (a.kind === 'sendActivation' || a.kind === 'sendGradient' ? [i] : []));
    for (const spec of parts) {
      const key = this.key(spec.pipeline ?? 0, spec.part);
      if (this.parts.has(key)) throw new InvalidArgumentError(`StageRunner: part ${spec.part}${this.byPipeline ? ` of pipeline ${spec.pipeline}` : ''} is given twice`);
      this.sizes.set(spec.part, { inputSize: spec.model.inputSize, outputSize: spec.model.outputSize });
      this.parts.set(key, {
        spec,
        updates: 0,
        base: 0,
        skipped: 0,
        accumulated: 0,
        stash: new Map(),
        lastRead: new Map(),
        backwardPrediction: undefined,
        backwardPredictionAt: -1,
      });
    }
    this.lastPart = schedule.parts - 1;
    this.classes = parts.find((p) => p.part === this.lastPart)?.model.outputSize ?? 0;
    for (const a of this.actions) {
      if (a.kind === 'allReduce' && this.shared)
        throw new InvalidScheduleError(`stage ${stage}: ${formatAction(a)}: a runner of every pipeline of its row runs no all-reduces (AvgPipe's rows have none)`);
      if (a.kind === 'allReduce' && this.partOf(a) === undefined) throw new InvalidScheduleError(`stage ${stage}: ${formatAction(a)} concerns part ${a.part}, which this stage was not given`);
      if (a.kind === 'allReduce' && this.memory.device !== 'cpu')
        throw new InvalidScheduleError(`stage ${stage}: ${formatAction(a)}: all-reduces between stages on a device (Wavelet's model-parallel form) are planned; run the schedule on the CPU`);
      if (a.kind === 'allReduce' && this.partOf(a)!.spec.replicas) {
        if (!rowsAreWorkers(schedule))
          throw new InvalidScheduleError(`stage ${stage}: ${formatAction(a)} needs the part without data-parallel replicas of its own (a row of data-parallel workers excepted)`);
        if (this.parts.get(a.part)!.spec.replicas!.staleness !== 1)
          throw new InvalidScheduleError(`stage ${stage}: ${formatAction(a)} is applied after the next iteration; its part's data-parallel mode must be a staleness-1 one`);
        this.workerExchange.add(a.part);
      }
      if (a.kind === 'elasticAverage' && this.partOf(a)?.spec.average === undefined)
        throw new InvalidScheduleError(`stage ${stage}: ${formatAction(a)} needs the part's replicas (parts[].average; PipelineTrainer gives it for avgpipe)`);
      if ((a.kind === 'forward' || a.kind === 'backward' || a.kind === 'weightGrad' || a.kind === 'optimizerStep') && this.partOf(a) === undefined)
        throw new InvalidScheduleError(`stage ${stage}: ${formatAction(a)} concerns part ${a.part}${this.byPipeline ? ` of pipeline ${a.pipeline}` : ''}, which this stage was not given`);
    }
    if (this.waves && this.actions.some((a) => a.kind === 'allReduce')) {
      const link = comm as Partial<Communicator<FlatBuffer>> | undefined;
      if (link === undefined || link.size !== schedule.stages || typeof link.allreduce !== 'function')
        throw new InvalidScheduleError(`stage ${stage}: a Wavelet data-parallel worker all-reduces each wave over every worker: give the runner the workers' communicator (${schedule.stages} ranks)`);
      if (this.memory.device !== 'cpu') throw new InvalidScheduleError(`stage ${stage}: Wavelet's data-parallel form on a device is planned; run it on the CPU`);
    }
    if (comm === undefined && this.actions.some((a) => messageOf(a) !== undefined))
      throw new InvalidScheduleError(`stage ${stage} sends or receives but has no communicator`);
    if (!this.byPipeline && this.actions.some((a) => a.kind === 'allReduce' && !this.workerExchange.has(a.part)))
      this.reductionCounts = reductionCounts(schedule, stage, pipeline as number, comm as Communicator<FlatBuffer> | StageTransport | undefined);
  }

  /**
   * Runs the stage's actions once. `startAt` is the round's start on the shared clock
   * (performance.timeOrigin + performance.now()), so that the stages' timelines line up.
   */
  async runRound(source: MicroBatchSource, startAt: number = now()): Promise<StageRoundResult> {
    if (this.disposed) throw new DisposedError('StageRunner.runRound: the runner was disposed; create a new one');
    const src = source as Partial<MicroBatchSource> | null;
    if (src === null || typeof src !== 'object' || typeof src.input !== 'function' || typeof src.labels !== 'function' || !Number.isInteger(src.batch) || src.batch! < 1)
      throw new InvalidArgumentError('StageRunner.runRound(source): source must be { batch, input(microBatch), labels(microBatch) }');
    checkNumber(startAt, 'StageRunner.runRound: startAt', 0, Number.MAX_VALUE);
    if (this.running) throw new BusyError('StageRunner.runRound: a round is running; await it first');
    this.running = true;
    try {
      return await this.round(source, startAt);
    } finally {
      this.running = false;
    }
  }

  private async round(source: MicroBatchSource, startAt: number): Promise<StageRoundResult> {
    const timeline: TimedAction[] = [];
    const versions: VersionRead[] = [];
    const losses: number[] = [];
    let skippedBefore = 0;
    for (const p of this.parts.values()) {
      skippedBefore += p.skipped;
      p.base = p.updates;
      p.accumulated = 0;
      p.lastRead = this.lastReads(p.spec);
    }
    // Message id -> buffer: received inputs, local outputs, gradients to send or consume.
    /** (`part`: the key of the part's replica that owns a model buffer.) */
    const messages = new Map<string, { buffer: Tensor; owner: 'runtime' | 'model'; part: number; pipeline: number }>();
    const onDevice = this.memory.device !== 'cpu';
    // A device stage keeps each micro-batch's loss on the device and reads them once, at the round's end.
    const deviceLosses = new Map<number, { buffer: Tensor; pipeline: number }>();
    const predicted = new Set<string>();
    const sends: Promise<void>[] = [];
    // Activation sends still in flight, by message id: the model may reuse an output buffer only
    // once its send is done (the peer can answer with the gradient before this side has seen the
    // send complete).
    const activationSends = new Map<string, Promise<void>>();
    let sendError: unknown;
    let peakStashed = 0;
    let live = 0;
    let peakActivations = 0;
    let liveBytes = 0;
    let peakActivationBytes = 0;
    let peakStashedBytes = 0;
    /** Per replica (a runner of every pipeline of its row): stored micro-batches and bytes now, and their peaks. */
    const replicaLive = new Map<number, { live: number; bytes: number; peak: number; peakBytes: number }>();
    const replicaOf = (pipeline: number): { live: number; bytes: number; peak: number; peakBytes: number } => {
      let r = replicaLive.get(pipeline);
      if (!r) replicaLive.set(pipeline, (r = { live: 0, bytes: 0, peak: 0, peakBytes: 0 }));
      return r;
    };
    /** Wavelet's waves: each replica's latest local gradient of the round (by replica key). */
    const latestGrads = new Map<number, FlatBuffer>();
    /** Stored activation bytes by pipeline:micro-batch:part, until the backward releases them. */
    const stored = new Map<string, number>();
    /** Part (its replica's key) -> its all-reduce in flight (and the count it sums), awaited by the part's next step. */
    const reductions = new Map<number, { done: Promise<unknown>; count: number }>();
    let reductionIndex = 0;
    /** Part -> the data-parallel step an allReduce started (data-parallel workers), awaited by the part's next step. */
    const replicaSteps = new Map<number, Promise<DataParallelStepResult>>();
    const settleReplicaStep = async (part: PartState): Promise<void> => {
      const stepping = replicaSteps.get(part.spec.part);
      if (!stepping) return;
      replicaSteps.delete(part.spec.part);
      const result = await stepping;
      if (result.updated && !result.applied) part.skipped++;
    };
    const versionOf = (p: PartState): number => p.updates - p.base;

    const weightsFor = (a: Action, index: number): { buffer: Tensor; version: number; predicted: boolean } => {
      const p = this.partOf(a)!;
      const current = versionOf(p);
      const key = `${a.pipeline}:${a.part}:${a.microBatch}`;
      if (predicted.has(key)) {
        predicted.delete(key);
        if (a.kind === 'forward') return { buffer: forwardWeightsOf(p.spec), version: p.base + current, predicted: true };
        return { buffer: this.backwardPrediction(p), version: p.base + current, predicted: true };
      }
      const version = a.version >= 0 ? a.version : current;
      if (version === current) {
        // A data-parallel trainer's forward weights are predicted in sapipe-wp while an update is in flight.
        const buffer = p.spec.replicas?.forwardWeights ?? weightsOf(p.spec);
        return { buffer, version: p.base + version, predicted: buffer !== weightsOf(p.spec) };
      }
      const stashed = p.stash.get(version);
      if (!stashed) throw new InvalidScheduleError(`stage ${this.stage}, action #${index} (${formatAction(a)}) reads version ${version}, which was never stashed (current: ${current})`);
      return { buffer: stashed, version: p.base + version, predicted: false };
    };
    const releaseStashes = (p: PartState, index: number): void => {
      for (const [v, buffer] of p.stash) {
        if ((p.lastRead.get(v) ?? -1) <= index) {
          p.stash.delete(v);
          this.release(buffer, p.spec.pipeline ?? 0);
        }
      }
    };
    const dropMessage = (id: string): void => {
      const m = messages.get(id);
      if (!m) return;
      messages.delete(id);
      if (m.owner === 'runtime') this.release(m.buffer, m.pipeline);
      else {
        const part = this.parts.get(m.part);
        if (part) modelOf(part.spec).recycle?.(m.buffer);
      }
    };

    const postSend = (a: Action, index: number): void => {
      const id = messageOf(a)!;
      const m = messages.get(id);
      if (!m) throw new InvalidScheduleError(`stage ${this.stage}, action #${index} (${formatAction(a)}): nothing to send (its producer has not run)`);
      const isGradient = a.kind === 'sendGradient';
      const sent = this.linkOf(a).send(m.buffer, a.peer).then(
        () => {
          // A sent gradient is not read again here; a sent activation stays with the model until its backward.
          if (isGradient) dropMessage(id);
        },
        (error: unknown) => {
          sendError ??= error;
        },
      );
      sends.push(sent);
      posted.add(index);
      if (!isGradient) {
        messages.delete(id);
        activationSends.set(id, sent);
      }
    };
    // Sends go out as soon as their message exists, not where the row puts them: a row may place a
    // gradient's send after a receive that waits for the next activation, which would hold the
    // gradient back for the whole wait (the simulator, like an isend, sends at once). Each peer's
    // sends keep their row order, so its receives match them in order; a transport whose sends
    // are not independent of its other operations (independentSends) sends in row order.
    const posted = new Set<number>();
    let sendCursor = 0;
    const postEarlySends = (): void => {
      const held = new Set<string>();
      let prefixPosted = true;
      for (let k = sendCursor; k < this.sendIndices.length; k++) {
        const i = this.sendIndices[k]!;
        if (posted.has(i)) {
          if (prefixPosted) sendCursor = k + 1;
          continue;
        }
        prefixPosted = false;
        const a = this.actions[i]!;
        const link = `${a.pipeline}>${a.peer}`;
        if (held.has(link)) continue;
        if (!this.independentSends(a) || !messages.has(messageOf(a)!)) held.add(link);
        else postSend(a, i);
      }
    };
    try {
      for (const [index, a] of this.actions.entries()) {
        if (sendError !== undefined) throw sendError;
        const start = now() - startAt;
        const p = this.partOf(a);
        switch (a.kind) {
          case 'forward': {
            const part = p!;
            const w = this.onStream(() => weightsFor(a, index), a.pipeline);
            versions.push({ kind: 'forward', part: a.part, ...this.pipelineOf(a), microBatch: a.microBatch, version: w.version, predicted: w.predicted });
            let input = a.part === 0 ? undefined : messages.get(`a${a.pipeline}:${a.microBatch}:${a.part}`)?.buffer;
            if (a.part === 0) {
              const host = source.input(this.sampleOf(a));
              if (onDevice) {
                // The data set is on the host: its micro-batch is copied in, the one copy of a step's input.
                input = this.take(source.batch * this.inputSizeOf(0), a.pipeline);
                this.onStream(() => this.memory.write(input!, host.array.subarray(0, input!.length)), a.pipeline);
                messages.set(`a${a.pipeline}:${a.microBatch}:0`, { buffer: input, owner: 'runtime', part: this.key(a.pipeline, 0), pipeline: a.pipeline });
              } else input = host;
            }
            if (!input) throw new InvalidScheduleError(`stage ${this.stage}, action #${index} (${formatAction(a)}): its input never arrived`);
            const from = input;
            const output = this.onStream(() => modelOf(part.spec).forward(a.microBatch, from, source.batch, w.buffer), a.pipeline);
            messages.set(`a${a.pipeline}:${a.microBatch}:${a.part + 1}`, { buffer: output, owner: 'model', part: this.key(a.pipeline, a.part), pipeline: a.pipeline });
            peakActivations = Math.max(peakActivations, ++live);
            const bytes = 4 * (part.spec.model.activationFloats?.(source.batch) ?? 0);
            stored.set(`${a.pipeline}:${a.microBatch}:${a.part}`, bytes);
            peakActivationBytes = Math.max(peakActivationBytes, (liveBytes += bytes));
            if (this.byPipeline) {
              const r = replicaOf(a.pipeline);
              r.peak = Math.max(r.peak, ++r.live);
              r.peakBytes = Math.max(r.peakBytes, (r.bytes += bytes));
            }
            break;
          }
          case 'backward':
          case 'weightGrad': {
            const part = p!;
            const split = a.kind === 'backward' && this.hasWeightGrad(a) && part.spec.model.weightGrad !== undefined;
            if (a.kind === 'weightGrad' && part.spec.model.weightGrad === undefined) break; // the backward did it all
            const w = this.onStream(() => weightsFor(a, index), a.pipeline);
            versions.push({ kind: a.kind, part: a.part, ...this.pipelineOf(a), microBatch: a.microBatch, version: w.version, predicted: w.predicted });
            const accumulate = part.accumulated > 0;
            if (a.kind === 'weightGrad') {
              this.onStream(() => modelOf(part.spec).weightGrad!(a.microBatch, { grads: gradsOf(part.spec), accumulate }), a.pipeline);
              dropMessage(`a${a.pipeline}:${a.microBatch}:${a.part}`);
            } else {
              let gradOutput: Tensor;
              const gradId = `g${a.pipeline}:${a.microBatch}:${a.part}`;
              if (a.part === this.lastPart) {
                const logits = messages.get(`a${a.pipeline}:${a.microBatch}:${a.part + 1}`)!.buffer;
                gradOutput = this.take(logits.length, a.pipeline);
                const targets = source.labels(this.sampleOf(a));
                if (logits instanceof FlatBuffer && gradOutput instanceof FlatBuffer) losses[this.sampleOf(a)] = this.hostLoss(logits, gradOutput, targets, source);
                else {
                  const out = gradOutput;
                  deviceLosses.set(this.sampleOf(a), { buffer: this.onStream(() => this.deviceLoss(logits, out, targets, source, a.microBatch, a.pipeline), a.pipeline), pipeline: a.pipeline });
                }
                messages.set(gradId, { buffer: gradOutput, owner: 'runtime', part: this.key(a.pipeline, a.part), pipeline: a.pipeline });
              } else {
                const m = messages.get(gradId);
                if (!m) throw new InvalidScheduleError(`stage ${this.stage}, action #${index} (${formatAction(a)}): its output gradient never arrived`);
                gradOutput = m.buffer;
              }
              const outputId = `a${a.pipeline}:${a.microBatch}:${a.part + 1}`;
              const sending = activationSends.get(outputId);
              if (sending) {
                await sending;
                activationSends.delete(outputId);
              }
              const gradIn = gradOutput;
              const inputGrad = this.onStream(() => modelOf(part.spec).backward(a.microBatch, gradIn, {
                grads: gradsOf(part.spec),
                weights: w.buffer,
                accumulate,
                inputGrad: a.part > 0,
                weightGrad: !split,
              }), a.pipeline);
              dropMessage(gradId);
              messages.delete(`a${a.pipeline}:${a.microBatch}:${a.part + 1}`); // the model's output, released by its backward
              // The received input: a split backward's weight gradient still reads it.
              if (!split) dropMessage(`a${a.pipeline}:${a.microBatch}:${a.part}`);
              if (inputGrad) messages.set(`g${a.pipeline}:${a.microBatch}:${a.part - 1}`, { buffer: inputGrad, owner: 'model', part: this.key(a.pipeline, a.part), pipeline: a.pipeline });
            }
            if (a.kind === 'weightGrad' || !split) {
              part.accumulated++;
              live--;
              const id = `${a.pipeline}:${a.microBatch}:${a.part}`;
              liveBytes -= stored.get(id) ?? 0;
              if (this.byPipeline) {
                const r = replicaOf(a.pipeline);
                r.live--;
                r.bytes -= stored.get(id) ?? 0;
              }
              stored.delete(id);
            }
            break;
          }
          case 'allReduce': {
            const part = p!;
            if (this.workerExchange.has(a.part)) {
              // One iteration's gradient per all-reduce: the trainer averages it over the workers.
              if (part.accumulated !== 1)
                throw new InvalidScheduleError(`stage ${this.stage}, action #${index} (${formatAction(a)}): a data-parallel worker's all-reduce follows exactly one backward of its part, not ${part.accumulated}`);
              await settleReplicaStep(part); // the previous step() (the first one, which only started its all-reduce)
              const stepping = part.spec.replicas!.step();
              stepping.catch(() => undefined); // awaited by the part's step, or at the end of the round
              replicaSteps.set(a.part, stepping);
              part.accumulated = 0;
              break;
            }
            if (this.waves) {
              // A wave's gradient, averaged with the other wave's latest on this worker, summed over the workers.
              if (part.accumulated !== 1)
                throw new InvalidScheduleError(`stage ${this.stage}, action #${index} (${formatAction(a)}): a Wavelet wave's all-reduce follows exactly one backward of its replica, not ${part.accumulated}`);
              const grads = part.spec.model.params.grads;
              const mine = this.keyOf(a);
              const other = this.key(2 * this.stage + 1 - a.pipeline, a.part);
              let latest = latestGrads.get(mine);
              if (!latest) latestGrads.set(mine, (latest = this.take(grads.length) as FlatBuffer));
              const otherLatest = latestGrads.get(other);
              const addon = nativeAddon();
              callNative(() => {
                addon.copy(latest.handle, grads.handle);
                if (otherLatest) {
                  addon.scale(grads.handle, 0.5);
                  addon.axpy(grads.handle, otherLatest.handle, 0.5);
                }
              });
              const done = (this.comm as Communicator<FlatBuffer>).allreduce(grads, { op: 'sum' });
              done.catch(() => undefined); // awaited by the wave's step, or at the end of the round
              reductions.set(mine, { done, count: this.workers });
              break;
            }
            const grads = part.spec.model.params.grads; // host only: the constructor refuses all-reduces on a device
            // A stage that ran no backward of the part since its last step adds zeros, not old gradients.
            if (part.accumulated === 0) grads.array.fill(0);
            const done = (this.comm as Communicator<FlatBuffer>).allreduce(grads, { op: 'sum' });
            done.catch(() => undefined); // awaited by the part's step, or at the end of the round
            reductions.set(this.keyOf(a), { done, count: this.reductionCounts[reductionIndex++]! });
            break;
          }
          case 'optimizerStep': {
            const part = p!;
            if (this.workerExchange.has(a.part)) {
              if (replicaSteps.has(a.part)) await settleReplicaStep(part);
              else {
                // The round's last step: apply the all-reduce still in flight, leaving the pipeline empty.
                const result = await part.spec.replicas!.flush();
                if (result && !result.applied) part.skipped++;
              }
              part.updates++;
              break;
            }
            const reduction = reductions.get(this.keyOf(a));
            if (reduction) {
              reductions.delete(this.keyOf(a));
              await reduction.done;
              part.accumulated = reduction.count;
            }
            const version = versionOf(part);
            if ((part.lastRead.get(version) ?? -1) > index) {
              const copy = this.take(part.spec.model.params.length, a.pipeline);
              this.onStream(() => this.memory.copy(copy, weightsOf(part.spec), copy.length), a.pipeline);
              part.stash.set(version, copy);
              peakStashed = Math.max(peakStashed, [...this.parts.values()].reduce((n, q) => n + q.stash.size, 0));
              peakStashedBytes = Math.max(peakStashedBytes, [...this.parts.values()].reduce((n, q) => n + [...q.stash.values()].reduce((b, x) => b + 4 * x.length, 0), 0));
            }
            if (part.accumulated > 0) {
              const opt = part.spec.optimizer;
              const scale = opt.gradScale;
              opt.gradScale = scale / part.accumulated;
              try {
                const replicas = part.spec.replicas;
                if (replicas) {
                  // A staleness-1 mode's first step only starts the all-reduce: nothing skipped.
                  const result = await replicas.step();
                  if (result.updated && !result.applied) part.skipped++;
                } else if (!(part.spec.device ? this.onStream(() => part.spec.device!.step(), a.pipeline) : await opt.step()).applied) part.skipped++;
              } finally {
                opt.gradScale = scale;
              }
              part.accumulated = 0;
            }
            part.updates++;
            break;
          }
          case 'predictWeights':
            if (!this.workerExchange.has(a.part)) predicted.add(`${a.pipeline}:${a.part}:${a.microBatch}`);
            break;
          case 'elasticAverage': {
            const stream = this.pipelineStreams ? this.streamOf(a.pipeline)! : undefined;
            if (!stream) {
              await p!.spec.average!();
              break;
            }
            // The part's center, the exchange's difference and sum are shared by the pipelines'
            // streams: each exchange waits on its stream for the one before it, on whichever stream
            // that ran, and leaves an event behind itself for the next.
            const order = (this.averagingOrder ??= { event: DeviceEvents.create(1, { device: stream.device }), stream });
            if (order.stream !== stream) stream.wait(order.event, 0);
            this.onStream(() => {
              if (p!.spec.average!() instanceof Promise) throw new InternalError('StageRunner: an elastic averaging on a device must be synchronous (its work goes on the pipeline\'s stream)');
            }, a.pipeline);
            stream.record(order.event, 0);
            order.stream = stream;
            break;
          }
          case 'stashWeights':
          case 'restoreWeights':
            break;
          case 'sendActivation':
          case 'sendGradient':
            if (!posted.has(index)) postSend(a, index);
            break;
          case 'recvActivation':
          case 'recvGradient': {
            const id = messageOf(a)!;
            const width = a.kind === 'recvActivation' ? this.inputSizeOf(a.part) : this.outputSizeOf(a.part);
            const buffer = this.take(source.batch * width, a.pipeline);
            messages.set(id, { buffer, owner: 'runtime', part: this.key(a.pipeline, a.part), pipeline: a.pipeline });
            await this.linkOf(a).recv(buffer, a.peer);
            break;
          }
          default:
            throw new InvalidScheduleError(`stage ${this.stage}: the runtime cannot run ${formatAction(a)} (${a.kind})`);
        }
        if (p && (a.kind === 'forward' || a.kind === 'backward' || a.kind === 'weightGrad')) releaseStashes(p, index);
        if (a.kind === 'forward' || a.kind === 'backward') postEarlySends();
        timeline.push({ action: a, start, end: now() - startAt, index });
      }
    } catch (error) {
      // Sends and reductions still in flight read buffers the caller frees next: let them settle
      // first (every wait is bounded by the communicator's timeout, and a lost peer fails them at once).
      await Promise.allSettled([...sends, ...[...reductions.values()].map((r) => r.done), ...replicaSteps.values()]);
      throw error;
    }
    if (replicaSteps.size > 0) {
      await Promise.allSettled(replicaSteps.values());
      throw new InvalidScheduleError(`stage ${this.stage}: the all-reduce of part(s) ${[...replicaSteps.keys()].join(', ')} has no optimizerStep after it in the round`);
    }
    if (reductions.size > 0) {
      await Promise.allSettled([...reductions.values()].map((r) => r.done));
      throw new InvalidScheduleError(`stage ${this.stage}: the all-reduce of part(s) ${[...reductions.keys()].join(', ')} has no optimizerStep after it in the round`);
    }
    await Promise.all(sends);
    if (sendError !== undefined) throw sendError;
    for (const id of [...messages.keys()]) dropMessage(id);
    for (const p of this.parts.values()) releaseStashes(p, Infinity);
    for (const buffer of latestGrads.values()) this.release(buffer);
    // The stage's stream is idle at the round's end: what reads or writes its memory between rounds
    // (the trainer's weights, evaluation, checkpoints) runs on the default stream, which a stage's
    // stream does not synchronise with. The wait polls, so the other stages keep issuing their
    // rounds' work meanwhile, and the loss reads below wait for nothing more.
    if (this.stream) {
      if (this.streamIdle) await this.streamIdle();
      else this.stream.synchronize();
    }
    for (const { stream, idle } of this.pipelineStreams ?? []) {
      if (idle) await idle();
      else stream.synchronize();
    }
    for (const [microBatch, { buffer, pipeline }] of deviceLosses) {
      const rows = this.onStream(() => this.memory.read(buffer, buffer.length), pipeline);
      losses[microBatch] = rows.reduce((a, b) => a + b, 0) / rows.length;
      this.release(buffer, pipeline);
    }
    const skippedSteps = [...this.parts.values()].reduce((n, q) => n + q.skipped, 0) - skippedBefore;
    const predictedCopies = [...this.parts.values()].filter((p) => p.spec.optimizer.stateBuffer('predicted') !== undefined).length;
    const replicaPeaks = this.byPipeline
      ? [...new Set([...this.parts.values()].map((p) => p.spec.pipeline!))].sort((a, b) => a - b).map((pipeline) => ({ pipeline, peakActivations: replicaLive.get(pipeline)?.peak ?? 0, peakActivationBytes: replicaLive.get(pipeline)?.peakBytes ?? 0 }))
      : undefined;
    return { stage: this.stage, timeline, losses, versions, peakStashed, predictedCopies, peakActivations, peakActivationBytes, ...(replicaPeaks ? { replicaPeaks } : {}), peakStashedBytes, modelBytes: this.modelBytes(), skippedSteps };
  }

  /** @internal A part's counters between rounds (what a checkpoint keeps besides weights and optimizer state); a runner of every pipeline: of `pipeline`'s replica. */
  counters(part: number, pipeline = 0): { updates: number; skipped: number } {
    const p = this.parts.get(this.key(pipeline, part));
    if (!p) throw new InvalidArgumentError(`StageRunner.counters: this stage has no part ${part}${this.byPipeline ? ` of pipeline ${pipeline}` : ''}`);
    if (this.running) throw new BusyError('StageRunner.counters: a round is running');
    return { updates: p.updates, skipped: p.skipped };
  }

  /** @internal Restores counters() into a runner between rounds (`pipeline`: as for counters()). */
  setCounters(part: number, counters: { updates: number; skipped: number }, pipeline = 0): void {
    const p = this.parts.get(this.key(pipeline, part));
    if (!p) throw new InvalidArgumentError(`StageRunner.setCounters: this stage has no part ${part}${this.byPipeline ? ` of pipeline ${pipeline}` : ''}`);
    if (this.running) throw new BusyError('StageRunner.setCounters: a round is running');
    p.updates = checkInteger(counters.updates, 'StageRunner.setCounters: updates', 0, Number.MAX_SAFE_INTEGER);
    p.skipped = checkInteger(counters.skipped, 'StageRunner.setCounters: skipped', 0, p.updates);
    p.backwardPredictionAt = -1;
  }

  /** The parts' weights, gradients and optimizer state buffers, in bytes. */
  private modelBytes(): number {
    let bytes = 0;
    for (const { spec } of this.parts.values()) {
      const n = spec.model.params.length;
      const state = STATE_BUFFER_NAMES.filter((name) => spec.optimizer.stateBuffer(name) !== undefined).length;
      bytes += 4 * n * (2 + state);
    }
    return bytes;
  }

  /** Frees the runtime's buffers (not the models or optimizers, which their owner disposes). */
  dispose(): void {
    if (this.disposed) return;
    this.disposed = true;
    for (const pool of this.pools.values()) for (const b of pool) b.dispose();
    this.pools.clear();
    for (const scratch of this.deviceScratch.values()) for (const b of Object.values(scratch)) b.dispose();
    this.deviceScratch.clear();
    this.averagingOrder?.event.dispose();
    this.averagingOrder = undefined;
    for (const p of this.parts.values()) {
      for (const b of p.stash.values()) b.dispose();
      p.stash.clear();
      p.backwardPrediction?.dispose();
    }
  }

  /** For each round version of `spec`'s part, the index of the last action on this stage reading it. */
  private lastReads(spec: StagePart): Map<number, number> {
    const last = new Map<number, number>();
    let count = 0;
    const predictedNext = new Set<number>();
    this.actions.forEach((a, i) => {
      if (a.part !== spec.part || (this.byPipeline && a.pipeline !== spec.pipeline)) return;
      if (a.kind === 'optimizerStep') count++;
      else if (a.kind === 'predictWeights') predictedNext.add(a.microBatch);
      else if (a.kind === 'forward' || a.kind === 'backward' || a.kind === 'weightGrad') {
        if (predictedNext.delete(a.microBatch)) return;
        last.set(a.version >= 0 ? a.version : count, i);
      }
    });
    return last;
  }

  private hasWeightGrad(a: Action): boolean {
    return this.actions.some((b) => b.kind === 'weightGrad' && b.part === a.part && b.microBatch === a.microBatch && b.pipeline === a.pipeline);
  }

  /**
   * fn() with the stage's stream current, so that every device operation it makes goes there; fn
   * is synchronous (DeviceStream.run refuses a Promise), so the stream is never current while
   * another stage's code runs at one of this round's awaits. Without a stream (host stages, a
   * device stage given none), fn() as is.
   */
  private onStream<T>(fn: () => T, pipeline?: number): T {
    const stream = this.streamOf(pipeline);
    return stream ? stream.run(fn) : fn();
  }

  /** The stream an action of `pipeline` enqueues on: its pipeline's (shared stages on a device), else the stage's. */
  private streamOf(pipeline: number | undefined): DeviceStream | undefined {
    if (!this.pipelineStreams) return this.stream;
    if (pipeline === undefined) throw new InternalError('StageRunner: device work of a runner of every pipeline must name its pipeline');
    return this.pipelineStreams[pipeline]!.stream;
  }

  /** SpecTrain's backward weights: w + r * (w_f - w), recomputed once per optimizer step. */
  private backwardPrediction(p: PartState): Tensor {
    const { model, backwardPredictionRatio: r } = p.spec;
    const weights = weightsOf(p.spec);
    if (r === 0) return weights;
    if (p.backwardPrediction && p.backwardPredictionAt === p.updates) return p.backwardPrediction;
    const out = (p.backwardPrediction ??= this.memory.allocate(model.params.length));
    const forward = forwardWeightsOf(p.spec);
    if (out instanceof FlatBuffer && forward instanceof FlatBuffer && weights instanceof FlatBuffer) {
      const addon = nativeAddon();
      callNative(() => {
        addon.copy(out.handle, forward.handle);
        addon.scale(out.handle, r);
        addon.axpy(out.handle, weights.handle, 1 - r);
      });
    } else {
      // On a device: out = r w_f + (1 - r) w as the rank-1 product 1 x w scaled by 1 - r, added to r w_f (cuBLAS has no scaled add in the op table).
      const n = model.params.length;
      this.memory.copy(out, forward, n);
      sgemm({ m: 1, n, k: 1, a: this.scratch(1, p.spec.pipeline ?? 0).one, b: weights, c: out, alpha: 1 - r, beta: r });
    }
    p.backwardPredictionAt = p.updates;
    return out;
  }

  /**
   * The cross-entropy's rows and classes for a micro-batch of `targets`: one row per target (P per
   * sample), each of outputSize / P logits.
   */
  private crossEntropyShape(targets: ArrayLike<number>, batch: number): { rows: number; classes: number } {
    const rows = targets.length;
    const perSample = rows / batch;
    if (!Number.isInteger(perSample) || perSample < 1 || this.classes % perSample !== 0)
      throw new InvalidArgumentError(`the cross-entropy takes 1 or P class indices per sample, P dividing the last part's ${this.classes} outputs; got ${rows} for ${batch} samples`);
    return { rows, classes: this.classes / perSample };
  }

  /** A host stage's loss of one micro-batch, its gradient written into `gradOutput`. */
  private hostLoss(logits: FlatBuffer, gradOutput: FlatBuffer, targets: ArrayLike<number>, source: MicroBatchSource): number {
    const n = source.batch * this.classes;
    if ((source.loss ?? 'cross-entropy') === 'mse') {
      if (targets.length !== n) throw new InvalidArgumentError(`the mse loss takes ${this.classes} targets per sample (the last part's outputs), got ${targets.length} for ${source.batch} samples`);
      // L = (1/n) sum (y - t)^2, dL/dy = 2 (y - t) / n.
      const [y, g] = [logits.array, gradOutput.array];
      let sum = 0;
      for (let i = 0; i < n; i++) {
        const d = y[i]! - targets[i]!;
        sum += d * d;
        g[i] = (2 * d) / n;
      }
      return sum / n;
    }
    const { rows, classes } = this.crossEntropyShape(targets, source.batch);
    return softmaxCrossEntropy(logits.array.subarray(0, n), targets, rows, classes, gradOutput.array.subarray(0, n));
  }

  /**
   * A device stage's loss of one micro-batch: the softmax cross-entropy's gradient into
   * `gradOutput` and the per-row losses into a buffer of their own, read at the round's end.
   */
  private deviceLoss(logits: Tensor, gradOutput: Tensor, targets: ArrayLike<number>, source: MicroBatchSource, microBatch: number, pipeline: number): Tensor {
    if ((source.loss ?? 'cross-entropy') !== 'cross-entropy') throw new InvalidArgumentError(`the ${String(source.loss)} loss on a device is planned; train it on the CPU`);
    const { rows, classes } = this.crossEntropyShape(targets, source.batch);
    const values = new Float32Array(rows);
    for (let i = 0; i < rows; i++) {
      const label = targets[i]!;
      if (!Number.isInteger(label) || label < 0 || label >= classes)
        throw new InvalidArgumentError(`label ${describeValue(label)} of micro-batch ${microBatch}, row ${i}, is not an integer class in [0, ${classes})`);
      values[i] = label;
    }
    const scratch = this.scratch(rows, pipeline);
    this.memory.write(scratch.labels, values);
    const rowLosses = this.take(rows, pipeline);
    softmaxXent({ buffer: logits }, { buffer: scratch.labels }, rows, classes, 1 / rows, { losses: { buffer: rowLosses }, dlogits: { buffer: gradOutput } });
    return rowLosses;
  }

  /** The reusable buffers of `pipeline`'s work: its own where each pipeline has a stream, else the stage's one list. */
  private poolOf(pipeline: number): Tensor[] {
    const key = this.pipelineStreams ? pipeline : 0;
    let pool = this.pools.get(key);
    if (!pool) this.pools.set(key, (pool = []));
    return pool;
  }

  /** A buffer of `length` elements for `pipeline`'s work from the runner's free list, or a new one in the stage's memory. */
  private take(length: number, pipeline = 0): Tensor {
    const pool = this.poolOf(pipeline);
    const i = pool.findIndex((b) => b.length === length);
    return i >= 0 ? pool.splice(i, 1)[0]! : this.memory.allocate(length);
  }

  /** Gives a buffer `pipeline`'s work took back to its free list. */
  private release(buffer: Tensor, pipeline = 0): void {
    this.poolOf(pipeline).push(buffer);
  }

  private scratch(batch = 1, pipeline = 0): { labels: Tensor; one: Tensor } {
    const key = this.pipelineStreams ? pipeline : 0;
    let scratch = this.deviceScratch.get(key);
    if (!scratch || scratch.labels.length < batch) {
      for (const b of Object.values(scratch ?? {})) b.dispose();
      const one = this.memory.allocate(1);
      this.memory.write(one, new Float32Array([1]));
      scratch = { labels: this.memory.allocate(batch), one };
      this.deviceScratch.set(key, scratch);
    }
    return scratch;
  }

  private inputSizeOf(part: number): number {
    return this.sizes.get(part)!.inputSize;
  }
  private outputSizeOf(part: number): number {
    return this.sizes.get(part)!.outputSize;
  }

  /** The key of a part's replica in `parts`: the part, or with a runner of every pipeline, (pipeline, part). */
  private key(pipeline: number, part: number): number {
    return this.byPipeline ? pipeline * this.partCount + part : part;
  }
  /** The key of the replica an action runs on (a Wavelet worker's `allReduce` names its wave, 0 or 1). */
  private keyOf(a: Action): number {
    return this.waves && a.kind === 'allReduce' ? this.key(2 * this.stage + a.pipeline, a.part) : this.key(a.pipeline, a.part);
  }
  /** The state of the replica an action runs on. */
  private partOf(a: Action): PartState | undefined {
    return this.parts.get(this.keyOf(a));
  }
  /**
   * The source's micro-batch of an action: its own, or with a runner of every pipeline, pipeline x
   * M + its own (a Wavelet worker: wave x M + its own).
   */
  private sampleOf(a: Action): number {
    if (this.waves) return (a.pipeline - 2 * this.stage) * this.microBatches + a.microBatch;
    return this.shared ? a.pipeline * this.microBatches + a.microBatch : a.microBatch;
  }
  private pipelineOf(a: Action): { pipeline?: number } {
    return this.byPipeline ? { pipeline: a.pipeline } : {};
  }
  /** The transport of an action's pipeline. */
  /** Whether `a`'s transport lets a send go ahead of its row (see StageTransport.independentSends). */
  private independentSends(a: Action): boolean {
    const link = this.linkOf(a) as StageTransport | Communicator<FlatBuffer>;
    if (link instanceof Communicator) return commBackendEntry(link.backend, 'StageRunner: comm').capabilities.independentSends;
    return link.independentSends === true;
  }

  private linkOf(a: Action): StageTransport {
    const comm = this.comm as StageTransport | readonly StageTransport[];
    return Array.isArray(comm) ? (comm as readonly StageTransport[])[a.pipeline]! : (comm as StageTransport);
  }
}

/**
 * Whether the schedule's rows are data-parallel workers (SAPipe): as many pipelines as rows, and
 * every action of row x but its all-reduces (which every row joins) of pipeline x.
 */
function rowsAreWorkers(schedule: Schedule): boolean {
  return schedule.pipelines === schedule.stages && schedule.actions.every((row, x) => row.every((a) => a.kind === 'allReduce' || a.pipeline === x));
}

/**
 * For each allReduce action of `stage`'s list (in order), how many micro-batch gradients the
 * reduction sums over every stage: on each stage, the backwards of the part since its previous
 * step. Checks what the runtime relies on: every stage names the same reductions in the same
 * order (they are collectives over the pipeline's communicator, whose ranks are the stages), and
 * no backward of a part runs between its all-reduce and its step.
 */
function reductionCounts(schedule: Schedule, stage: number, pipeline: number, comm: Communicator<FlatBuffer> | StageTransport | undefined): number[] {
  if (comm === undefined || comm.size !== schedule.stages)
    throw new InvalidScheduleError(`stage ${stage}: allReduce actions reduce over every stage: give the runner the pipeline's communicator (${schedule.stages} ranks, one per stage)`);
  const name = (a: Action): string => `${a.part}:${a.microBatch}`;
  const mine = schedule.actions[stage]!.filter((a) => a.kind === 'allReduce' && a.pipeline === pipeline).map(name);
  const counts = mine.map(() => 0);
  schedule.actions.forEach((row, s) => {
    const since = new Map<number, number>();
    const reduced = new Set<number>();
    let i = 0;
    for (const a of row) {
      if (a.pipeline !== pipeline) continue;
      if (a.kind === 'backward') {
        if (reduced.has(a.part)) throw new InvalidScheduleError(`stage ${s}: ${formatAction(a)} runs between its part's allReduce and optimizerStep`);
        since.set(a.part, (since.get(a.part) ?? 0) + 1);
      } else if (a.kind === 'allReduce') {
        if (mine[i] !== name(a)) throw new InvalidScheduleError(`stage ${s}: its allReduce #${i} (${formatAction(a)}) is not stage ${stage}'s (${mine[i] ?? 'none'}): every stage must name the same reductions in the same order`);
        counts[i++]! += since.get(a.part) ?? 0;
        reduced.add(a.part);
      } else if (a.kind === 'optimizerStep') {
        since.set(a.part, 0);
        reduced.delete(a.part);
      }
    }
    if (i !== mine.length) throw new InvalidScheduleError(`stage ${s} names ${i} allReduce actions, stage ${stage} ${mine.length}: every stage must name the same reductions`);
  });
  return counts;
}
