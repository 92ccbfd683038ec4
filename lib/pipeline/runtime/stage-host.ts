/**
 * What runs around a {@link StageRunner} on one stage, wherever the stage lives (a worker thread
 * over `local`, a launched process over `ucx`): building the stage's model parts and optimizers
 * from a plain-data description, serving micro-batches from the data set, and the messages the
 * trainer and the stage exchange. The description is data (no functions) so it crosses threads
 * and processes unchanged.
 */
import { pathToFileURL } from 'node:url';

import type { Communicator } from '../../comm/communicator.js';
import { DeviceParamSet } from '../../device/param-set.js';
import type { CudaDevice } from '../../device/device-spec.js';
import { InvalidArgumentError, SizeMismatchError } from '../../errors.js';
import type { Device, Tensor } from '../../nn/ops.js';
import { Sequential, type LayerSpec } from '../../nn/sequential.js';
import type { StageModel } from '../../nn/stage-model.js';
import { STATE_BUFFER_NAMES, type Optimizer, type OptimizerState } from '../../optim/optimizer.js';
import { createOptimizer, type OptimizerSpecWithout } from '../../optim/registry.js';
import { FlatBuffer } from '../../tensor.js';
import type { DataParallelModeOptions, DataParallelOptimizerSpec } from '../../dataparallel/mode.js';
import { DataParallelTrainer, type DataParallelTrainerState } from '../../dataparallel/trainer.js';
import type { Schedule } from '../schedule.js';
import type { AveragingLayout } from '../schedules/avgpipe.js';
import { type CenterState, DeviceSharedElasticCenter, ElasticCenter, type PartCenter, SharedElasticCenter } from './averaging.js';
import { type MicroBatchSource, type PipelineLoss, type StagePart, type StageRoundResult, type StageTransport, StageRunner } from './stage-runner.js';

export { PIPELINE_LOSSES, type PipelineLoss } from './stage-runner.js';
import { backwardPredictionRatio, predictionFor, spikeDelayFor } from './weights.js';

/** The optimizer each part gets; the schedule adds its weight prediction. @category Pipeline runtime */
export type PipelineOptimizerSpec = OptimizerSpecWithout<'prediction' | 'queue'>;

/**
 * The model, as data. `sequential`: sapipe's own layers cut at `boundaries` (one part per entry
 * plus one). `module`: a user's ES module (a path or file URL) exporting
 * `createStage(part, parts, options)` that returns a {@link StageModel}.
 *
 * @category Pipeline runtime
 */
export type PipelineModelSpec =
  | { kind: 'sequential'; layers: readonly LayerSpec[]; seed?: number; boundaries: readonly number[] }
  | { kind: 'module'; module: string; parts: number; options?: unknown };

/**
 * How the replicas of each stage in parallel pipelines combine their gradients: a data-parallel
 * mode of DataParallelTrainer (its options), run by a trainer per part over the replicas.
 *
 * @category Pipeline runtime
 */
export interface PipelineDataParallelOptions extends DataParallelModeOptions {
  /** See DataParallelTrainerOptions.overlapUpdate. */
  overlapUpdate?: boolean;
}

export { AVERAGING_LAYOUTS, type AveragingLayout } from '../schedules/avgpipe.js';

/**
 * AvgPipe's elastic averaging (ALGORITHMS.md section 5): after every `every`-th update each
 * replica x_i of a stage moves towards the center c by d_i = alpha*(x_i - c) and c moves by the
 * sum of the d_i. Default alpha 0.9/N, every update, layout `shared-stages`.
 *
 * @category Pipeline runtime
 */
export interface PipelineAveragingOptions {
  alpha?: number;
  every?: number;
  /** Where the pipelines run: see {@link AveragingLayout}. */
  layout?: AveragingLayout;
}


/** @internal The data set, shared between stages without copies (SharedArrayBuffer-backed arrays on threads). */
export interface PipelineData {
  inputs: Float32Array;
  /** Targets, `targetsPerSample` per sample: class indices (cross-entropy) or reals (mse). */
  labels: Int32Array | Float32Array;
  features: number;
  targetsPerSample: number;
  loss: PipelineLoss;
}

/** @internal Everything one stage needs to start. */
export interface StageDescription {
  stage: number;
  schedule: Schedule;
  model: PipelineModelSpec;
  optimizer: PipelineOptimizerSpec;
  microBatchSize: number;
  /** The parts this stage holds (from the schedule's actions). */
  parts: number[];
  /** Parallel pipelines: how this stage's replicas combine their gradients (a DataParallelTrainer per part). */
  dataParallel?: PipelineDataParallelOptions;
  /** AvgPipe: elastic averaging of this stage's replicas with their center (with `shared-stages`, the N replicas are all on this stage). */
  averaging?: Required<PipelineAveragingOptions>;
  /**
   * Wavelet's data-parallel form: this worker holds two replicas of the whole model (tick =
   * pipeline 2 x stage, tock = 2 x stage + 1), an optimizer each, and all-reduces each wave's
   * gradient over the workers' communicator.
   */
  waves?: boolean;
  /** Pipelined Backpropagation: which of its delay compensations are on. */
  pipelinedBackprop?: { spikeCompensation: boolean; weightPrediction: boolean };
  /** The device the stage runs on (absent: the CPU). */
  device?: CudaDevice;
}

/** @internal Trainer -> stage. */
export type ToStage =
  | { type: 'round'; startAt: number; samples: Int32Array }
  | { type: 'weights' }
  | { type: 'lr'; lr: number }
  | { type: 'exportState' }
  | { type: 'importState'; parts: PartCheckpointState[]; centers: CenterCheckpointState[] }
  | { type: 'stop' };

/** @internal Stage -> trainer. */
export type FromStage =
  | { type: 'ready'; stage: number; pipeline: number; parts: { part: number; inputSize: number; outputSize: number; numParams: number; length: number; optimizer: OptimizerState['kind']; buffers: string[]; dataParallel?: { mode: DataParallelTrainer['mode']; staleness: 0 | 1; overlapped: boolean } }[] }
  | { type: 'round'; pipeline: number; result: StageRoundResult }
  | { type: 'weights'; stage: number; parts: { part: number; weights: Float32Array }[] }
  | { type: 'state'; stage: number; parts: PartCheckpointState[]; centers: CenterCheckpointState[] }
  | { type: 'imported'; stage: number }
  | { type: 'error'; stage: number; error: { name: string; code?: string; message: string; stack?: string } };

/** @internal Builds part `part` of the model described by `spec`. */
export async function buildStageModel(spec: PipelineModelSpec, part: number, device?: Device): Promise<StageModel> {
  if (spec.kind === 'sequential') return Sequential.part<Tensor>(spec.layers, spec.boundaries, part, { ...(spec.seed === undefined ? {} : { seed: spec.seed }), ...(device ? { device } : {}) });
  const url = spec.module.startsWith('file:') ? spec.module : pathToFileURL(spec.module).href;
  const mod = (await import(url)) as { createStage?: unknown };
  if (typeof mod.createStage !== 'function')
    throw new InvalidArgumentError(`model module ${spec.module} must export createStage(part, parts, options) returning a StageModel`);
  const model = (await (mod.createStage as (part: number, parts: number, options: unknown) => unknown)(part, spec.parts, spec.options)) as StageModel;
  if (model === null || typeof model !== 'object' || typeof model.forward !== 'function' || typeof model.backward !== 'function' || typeof model.dispose !== 'function')
    throw new InvalidArgumentError(`model module ${spec.module}: createStage(${part}, ${spec.parts}) must return a StageModel (params, inputSize, outputSize, forward, backward, dispose)`);
  for (const key of ['inputSize', 'outputSize'] as const)
    if (!Number.isInteger(model[key]) || model[key] < 1)
      throw new SizeMismatchError(`model module ${spec.module}: part ${part}'s ${key} must be a positive integer, got ${String(model[key])}`);
  return model;
}

/** @internal The part's optimizer, with the schedule's prediction (and Pipelined Backpropagation's compensations, unless switched off). */
export function buildOptimizer(model: StageModel, spec: PipelineOptimizerSpec, schedule: Schedule, part: number, pipelinedBackprop?: StageDescription['pipelinedBackprop']): Optimizer {
  const prediction = pipelinedBackprop?.weightPrediction === false ? undefined : predictionFor(schedule.name, part, schedule.parts);
  const spikeDelay = pipelinedBackprop?.spikeCompensation === false ? undefined : spikeDelayFor(schedule.name, part, schedule.parts);
  return createOptimizer(model.params, spec, { ...(prediction ? { prediction } : {}), ...(spikeDelay !== undefined ? { spikeCompensation: { delay: spikeDelay } } : {}) });
}

/** @internal Micro-batches from the shared data set: round `samples[m*b + i]` is sample i of micro-batch m. */
export class SharedDataSource implements MicroBatchSource {
  private samples: Int32Array = new Int32Array(0);
  private readonly inputs = new Map<number, FlatBuffer>();
  private readonly pool: FlatBuffer[] = [];

  readonly loss: PipelineLoss;

  constructor(
    private readonly data: PipelineData,
    readonly batch: number,
  ) {
    this.loss = data.loss;
  }

  /** Starts a round: frees the previous round's inputs. */
  startRound(samples: Int32Array): void {
    for (const b of this.inputs.values()) this.pool.push(b);
    this.inputs.clear();
    this.samples = samples;
  }

  input(microBatch: number): FlatBuffer {
    const { features, inputs } = this.data;
    const buffer = this.pool.pop() ?? FlatBuffer.allocate(this.batch * features);
    const out = buffer.array;
    for (let i = 0; i < this.batch; i++) {
      const s = this.samples[microBatch * this.batch + i]!;
      out.set(inputs.subarray(s * features, (s + 1) * features), i * features);
    }
    this.inputs.set(microBatch, buffer);
    return buffer;
  }

  labels(microBatch: number): ArrayLike<number> {
    const { labels, targetsPerSample: per } = this.data;
    const out = labels instanceof Float32Array ? new Float32Array(this.batch * per) : new Int32Array(this.batch * per);
    for (let i = 0; i < this.batch; i++) {
      const s = this.samples[microBatch * this.batch + i]!;
      out.set(labels.subarray(s * per, (s + 1) * per), i * per);
    }
    return out;
  }

  dispose(): void {
    for (const b of [...this.inputs.values(), ...this.pool]) b.dispose();
    this.inputs.clear();
    this.pool.length = 0;
  }
}

/**
 * @internal A replica's state between rounds: what a pipeline checkpoint holds per (pipeline,
 * part). With parallel pipelines coupled by data parallelism (dataParallel, SAPipe's workers),
 * the part's DataParallelTrainer state beside it (its weights and optimizer state are `weights`
 * and `optimizer`, kept once).
 */
export interface PartCheckpointState {
  /** The pipeline whose replica this is (0 for one pipeline; Wavelet's data-parallel worker x: 2x tick, 2x+1 tock). */
  pipeline: number;
  part: number;
  weights: Float32Array;
  optimizer: OptimizerState;
  updates: number;
  skipped: number;
  dataParallel?: DataParallelPartState;
}

/** A replica's DataParallelTrainer state less what its checkpoint state already holds (weights, optimizer). @category Pipeline runtime */
export type DataParallelPartState = Omit<DataParallelTrainerState, 'weights' | 'optimizer'>;

/**
 * @internal AvgPipe: a center between rounds. `shared-stages`: the one center of a part on its
 * stage (pipeline 0, updates per pipeline); `worker-per-replica`: pipeline p's copy (updates: one).
 */
export interface CenterCheckpointState extends CenterState {
  pipeline: number;
  part: number;
}

/** @internal One stage's models, optimizers, runner and data, built from its description. */
export class StageHost {
  private constructor(
    readonly description: StageDescription,
    readonly parts: StagePart[],
    readonly runner: StageRunner,
    readonly source: SharedDataSource,
    /** AvgPipe: each part's center, by part. */
    private readonly centers: Map<number, PartCenter>,
    /** The pipeline this stage runs (a runner of every pipeline: 0; its parts name their own). */
    private readonly pipeline: number,
  ) {}

  /** AvgPipe's `shared-stages` layout: this stage runs its row for every pipeline, with a replica of each part per pipeline. */
  get sharedStages(): boolean {
    return this.description.averaging?.layout === 'shared-stages';
  }

  /**
   * `comm` joins the stages of pipeline `pipeline`; `replicas` (parallel pipelines) this stage's
   * replicas in the other pipelines, over which each part's gradients are combined (dataParallel)
   * or its weights averaged (avgpipe). AvgPipe's `shared-stages` layout: `comm` is one transport
   * per pipeline (each joining the S stages) and there are no `replicas`: they are all here.
   */
  static async create(
    description: StageDescription,
    comm: Communicator<FlatBuffer> | StageTransport | readonly (Communicator<FlatBuffer> | StageTransport)[] | undefined,
    data: PipelineData,
    replicas?: Communicator<FlatBuffer>,
    pipeline = 0,
  ): Promise<StageHost> {
    const parts: StagePart[] = [];
    const centers = new Map<number, PartCenter>();
    try {
      if (description.averaging?.layout === 'shared-stages') {
        const runner = await StageHost.buildSharedStage(description, comm, parts, centers);
        return new StageHost(description, parts, runner, new SharedDataSource(data, description.microBatchSize), centers, 0);
      }
      if (Array.isArray(comm)) throw new InvalidArgumentError('StageHost: one transport per pipeline is for AvgPipe\'s shared-stages layout');
      if (description.waves) {
        const runner = await StageHost.buildWaves(description, comm as Communicator<FlatBuffer> | StageTransport | undefined, parts);
        return new StageHost(description, parts, runner, new SharedDataSource(data, description.microBatchSize), centers, 0);
      }
      if ((description.dataParallel || description.averaging) && !replicas)
        throw new InvalidArgumentError('StageHost: parallel pipelines need the communicator of the stage\'s replicas');
      for (const part of description.parts) {
        const model = await buildStageModel(description.model, part, description.device);
        const ratio = backwardPredictionRatio(description.schedule.name, part, description.schedule.parts);
        try {
          if (description.dataParallel) {
            // Every replica builds the part from the same seed; the trainer also broadcasts pipeline 0's.
            const { kind, ...options } = description.optimizer;
            const trainer = await DataParallelTrainer.create({ comm: replicas!, params: model.params, optimizer: { kind, ...options } as DataParallelOptimizerSpec, ...description.dataParallel });
            parts.push({ part, model, optimizer: trainer.optimizer, backwardPredictionRatio: ratio, replicas: trainer });
          } else {
            const optimizer = buildOptimizer(model, description.optimizer, description.schedule, part, description.pipelinedBackprop);
            let average: (() => Promise<void>) | undefined;
            if (description.averaging) {
              const center = new ElasticCenter(model.params, replicas!, description.averaging.alpha, description.averaging.every);
              centers.set(part, center);
              average = () => center.average();
            }
            // On a device the part's weights, gradients and optimizer state live there from now on.
            const device = description.device ? DeviceParamSet.create(model.params, { device: description.device, optimizer }) : undefined;
            parts.push({ part, model, optimizer, backwardPredictionRatio: ratio, ...(average ? { average } : {}), ...(device ? { device } : {}) });
          }
        } catch (error) {
          model.dispose();
          throw error;
        }
      }
      // AvgPipe's lists hold every pipeline's actions; data-parallel pipelines each run the one-pipeline list.
      const runner = new StageRunner(description.stage, description.schedule, comm as Communicator<FlatBuffer> | StageTransport | undefined, parts, description.schedule.pipelines > 1 ? pipeline : 0);
      return new StageHost(description, parts, runner, new SharedDataSource(data, description.microBatchSize), centers, pipeline);
    } catch (error) {
      await disposeParts(parts);
      for (const c of centers.values()) c.dispose();
      throw error;
    }
  }

  /**
   * AvgPipe's `shared-stages` layout: every part of the stage built once per pipeline (the same
   * seed, an optimizer each), one center per part beside its replicas, and a runner of the whole row.
   */
  private static async buildSharedStage(
    description: StageDescription,
    comm: Communicator<FlatBuffer> | StageTransport | readonly (Communicator<FlatBuffer> | StageTransport)[] | undefined,
    parts: StagePart[],
    centers: Map<number, PartCenter>,
  ): Promise<StageRunner> {
    const { schedule, averaging } = description;
    if (comm !== undefined && !Array.isArray(comm)) throw new InvalidArgumentError('StageHost: the shared-stages layout takes one transport per pipeline');
    for (const part of description.parts) {
      // Each replica joins `parts` as soon as it is built (so a failure frees it), its averaging once the center exists.
      const first = parts.length;
      for (let pipeline = 0; pipeline < schedule.pipelines; pipeline++) parts.push(await StageHost.buildReplica(description, part, pipeline, description.device));
      const replicas = parts.slice(first);
      if (description.device) {
        // On a device the exchange is enqueued on the stream current at the call: the runner's, its pipeline's.
        const center = new DeviceSharedElasticCenter(replicas.map((r) => r.device!), averaging!.alpha, averaging!.every);
        centers.set(part, center);
        replicas.forEach((r, i) => (parts[first + i] = { ...r, average: () => center.average(r.pipeline!) }));
      } else {
        const center = new SharedElasticCenter(
          replicas.map((r) => r.model.params),
          averaging!.alpha,
          averaging!.every,
        );
        centers.set(part, center);
        replicas.forEach((r, i) => (parts[first + i] = { ...r, average: async () => center.average(r.pipeline!) }));
      }
    }
    return new StageRunner(description.stage, schedule, comm, parts, 'every');
  }

  /**
   * Wavelet's data-parallel form: the whole model built twice from the same seed (tick, then
   * tock), an optimizer each, and a runner of the worker's row, its waves' all-reduces over `comm`
   * (the S workers).
   */
  private static async buildWaves(
    description: StageDescription,
    comm: Communicator<FlatBuffer> | StageTransport | undefined,
    parts: StagePart[],
  ): Promise<StageRunner> {
    const { schedule, stage } = description;
    if (description.device) throw new InvalidArgumentError(`StageHost: Wavelet's data-parallel form on ${description.device} is planned`);
    for (const pipeline of [2 * stage, 2 * stage + 1]) parts.push(await StageHost.buildReplica(description, 0, pipeline));
    return new StageRunner(stage, schedule, comm, parts, 'every');
  }

  /**
   * One pipeline's replica of `part`, with an optimizer of its own (freed if that fails); on
   * `device`, its weights, gradients and optimizer state in a DeviceParamSet there.
   */
  private static async buildReplica(description: StageDescription, part: number, pipeline: number, device?: CudaDevice): Promise<StagePart> {
    const { schedule } = description;
    const model = await buildStageModel(description.model, part, device);
    let optimizer: Optimizer | undefined;
    try {
      optimizer = buildOptimizer(model, description.optimizer, schedule, part, description.pipelinedBackprop);
      const onDevice = device ? DeviceParamSet.create(model.params, { device, optimizer }) : undefined;
      return { part, pipeline, model, optimizer, backwardPredictionRatio: backwardPredictionRatio(schedule.name, part, schedule.parts), ...(onDevice ? { device: onDevice } : {}) };
    } catch (error) {
      optimizer?.dispose();
      model.dispose();
      throw error;
    }
  }

  /** One replica of each part (a runner of every pipeline holds one per pipeline): what describes the stage's parts. */
  get modelParts(): StagePart[] {
    const first = this.parts[0]?.pipeline ?? 0;
    return this.parts.filter((p) => (p.pipeline ?? 0) === first);
  }

  async runRound(samples: Int32Array, startAt: number): Promise<StageRoundResult> {
    this.source.startRound(samples);
    return this.runner.runRound(this.source, startAt);
  }

  /** Each part's weights; for AvgPipe, the center the pipelines average with (the model they agree on). */
  weights(): { part: number; weights: Float32Array }[] {
    for (const p of this.parts) p.device?.copyToHost();
    return this.modelParts.map((p) => ({ part: p.part, weights: (this.centers.get(p.part)?.weights ?? p.model.params.weights).array.slice() }));
  }

  setLr(lr: number): void {
    for (const p of this.parts) p.optimizer.lr = lr;
  }

  /**
   * Each replica's weights, optimizer state and counters (and data-parallel state), and each
   * center's, between rounds. A data-parallel part's export waits for its all-reduce in flight,
   * which every replica has issued, so every replica of the stage must be asked alike.
   */
  async exportState(): Promise<{ parts: PartCheckpointState[]; centers: CenterCheckpointState[] }> {
    for (const p of this.parts) p.device?.copyToHost();
    const parts: PartCheckpointState[] = [];
    for (const p of this.parts) {
      const pipeline = this.pipelineOf(p);
      const counters = this.runner.counters(p.part, pipeline);
      if (p.replicas) {
        const { weights, optimizer, ...dataParallel } = await p.replicas.exportState();
        parts.push({ pipeline, part: p.part, weights, optimizer, ...counters, dataParallel });
      } else parts.push({ pipeline, part: p.part, weights: p.model.params.weights.array.slice(), optimizer: p.optimizer.exportState(), ...counters });
    }
    const centers = [...this.centers].map(([part, c]) => ({ pipeline: this.pipeline, part, ...c.exportState() }));
    return { parts, centers };
  }

  /**
   * Restores exportState() into a stage of the same configuration, between rounds; checks every
   * replica and center before changing any. A data-parallel part's gradient in flight is applied
   * first (flush; every replica of the stage is asked alike), then replaced by the state's.
   */
  async importState(states: readonly PartCheckpointState[], centers: readonly CenterCheckpointState[]): Promise<void> {
    const byReplica = new Map(states.map((s) => [`${s.pipeline}:${s.part}`, s]));
    const name = (p: StagePart): string => `part ${p.part} of pipeline ${this.pipelineOf(p)}`;
    for (const p of this.parts) {
      const s = byReplica.get(`${this.pipelineOf(p)}:${p.part}`);
      if (!s) throw new InvalidArgumentError(`importState: no state for ${name(p)}`);
      if (!(s.weights instanceof Float32Array) || s.weights.length !== p.model.params.length)
        throw new SizeMismatchError(`importState: ${name(p)}'s weights hold ${s.weights?.length} values, the part ${p.model.params.length}`);
      if (s.optimizer?.kind !== p.optimizer.kind || s.optimizer.length !== p.model.params.length)
        throw new InvalidArgumentError(`importState: ${name(p)}'s optimizer state is of kind ${describeKind(s.optimizer?.kind)} over ${s.optimizer?.length} values; this part's optimizer is '${p.optimizer.kind}' over ${p.model.params.length}`);
      if (!Number.isSafeInteger(s.updates) || s.updates < 0 || !Number.isSafeInteger(s.skipped) || s.skipped < 0 || s.skipped > s.updates)
        throw new InvalidArgumentError(`importState: ${name(p)}'s counters (updates ${s.updates}, skipped ${s.skipped}) are not counts`);
      if ((s.dataParallel === undefined) !== (p.replicas === undefined))
        throw new InvalidArgumentError(`importState: ${name(p)} ${p.replicas ? 'combines its replicas\' gradients (dataParallel) and the state holds no data-parallel state' : 'has no data-parallel replicas and the state holds data-parallel state'}`);
      if (p.replicas && s.dataParallel!.mode !== p.replicas.mode)
        throw new InvalidArgumentError(`importState: ${name(p)}'s data-parallel state is of mode ${describeKind(s.dataParallel!.mode)}; this part's is '${p.replicas.mode}'`);
    }
    const byCenter = new Map(centers.map((c) => [c.part, c]));
    for (const [part, center] of this.centers) {
      const c = byCenter.get(part);
      if (!c || c.pipeline !== this.pipeline) throw new InvalidArgumentError(`importState: no state for the center of part ${part} (pipeline ${this.pipeline}); AvgPipe's state holds every center`);
      center.checkState(c);
    }
    if (centers.length !== this.centers.size) throw new InvalidArgumentError(`importState: the state holds ${centers.length} center(s) for this stage, which keeps ${this.centers.size}`);
    for (const p of this.parts) {
      const s = byReplica.get(`${this.pipelineOf(p)}:${p.part}`)!;
      if (p.replicas) {
        await p.replicas.flush();
        p.replicas.importState({ ...s.dataParallel!, weights: s.weights, optimizer: s.optimizer });
      } else {
        p.optimizer.importState(s.optimizer);
        p.model.params.weights.array.set(s.weights);
      }
      p.device?.copyFromHost();
      this.runner.setCounters(p.part, s, this.pipelineOf(p));
    }
    for (const [part, center] of this.centers) center.importState(byCenter.get(part)!);
  }

  /** The pipeline whose replica `p` is: its own (a runner of every pipeline), else the stage's. */
  private pipelineOf(p: StagePart): number {
    return p.pipeline ?? this.pipeline;
  }

  /** Frees everything; a part's data-parallel trainer first waits for its all-reduce in flight. */
  async dispose(): Promise<void> {
    this.runner.dispose();
    this.source.dispose();
    await disposeParts(this.parts);
    for (const c of this.centers.values()) c.dispose();
  }
}

async function disposeParts(parts: readonly StagePart[]): Promise<void> {
  for (const p of parts) {
    if (p.replicas) await p.replicas.dispose();
    else p.optimizer.dispose();
    p.device?.dispose();
    p.model.dispose();
  }
}

function describeKind(kind: unknown): string {
  return typeof kind === 'string' ? `'${kind}'` : String(kind);
}

/** @internal The stage's `ready` reply: what each part it built is. */
export function readyMessage(host: StageHost, pipeline: number): FromStage {
  return {
    type: 'ready',
    stage: host.description.stage,
    pipeline,
    // (AvgPipe's shared stages hold a replica per pipeline: pipeline 0's describes the part.)
    parts: host.modelParts.map((p) => ({ part: p.part, inputSize: p.model.inputSize, outputSize: p.model.outputSize, numParams: p.model.params.numParams, length: p.model.params.length, optimizer: p.optimizer.kind, buffers: STATE_BUFFER_NAMES.filter((name) => p.optimizer.stateBuffer(name) !== undefined).sort(), ...(p.replicas ? { dataParallel: { mode: p.replicas.mode, staleness: p.replicas.staleness, overlapped: p.replicas.overlapped } } : {}) })),
  };
}

/**
 * @internal Runs one trainer request on a stage (all but `stop`, which its worker handles) and
 * returns the reply, if the request has one. `pipelines`: N, of which this stage is in `pipeline`.
 */
export async function answerStage(host: StageHost, message: ToStage, pipelines: number, pipeline: number): Promise<FromStage | undefined> {
  const stage = host.description.stage;
  switch (message.type) {
    case 'round': {
      // Pipeline p trains on the p-th share of the round's samples (AvgPipe's shared stages run every pipeline: all of them).
      if (host.sharedStages) return { type: 'round', pipeline, result: await host.runRound(message.samples, message.startAt) };
      const share = message.samples.length / pipelines;
      return { type: 'round', pipeline, result: await host.runRound(message.samples.subarray(pipeline * share, (pipeline + 1) * share), message.startAt) };
    }
    case 'weights':
      return { type: 'weights', stage, parts: host.weights() };
    case 'lr':
      host.setLr(message.lr);
      return undefined;
    case 'exportState':
      return { type: 'state', stage, ...(await host.exportState()) };
    case 'importState':
      await host.importState(message.parts, message.centers);
      return { type: 'imported', stage };
    case 'stop':
      return undefined;
  }
}

/** @internal Serialises an error for the trainer. */
export function describeError(stage: number, error: unknown): FromStage {
  const e = error as { name?: unknown; code?: unknown; message?: unknown; stack?: unknown } | null;
  return {
    type: 'error',
    stage,
    error: {
      name: typeof e?.name === 'string' ? e.name : 'Error',
      ...(typeof e?.code === 'string' ? { code: e.code } : {}),
      message: typeof e?.message === 'string' ? e.message : String(error),
      ...(typeof e?.stack === 'string' ? { stack: e.stack } : {}),
    },
  };
}
