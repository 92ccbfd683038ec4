/**
 * Checkpoints of a PipelineTrainer (on worker threads): its exportState() between rounds, every
 * replica's weights and optimizer state and counters, its data-parallel state (a staleness-1
 * mode's gradient in flight), AvgPipe's centers, and the position in the data, in one safetensors
 * file in the layout of store.ts (one "rank": the trainer's process). Resuming continues exactly
 * as if training had not stopped.
 *
 * In the file: each part's flat weights under `<replica>/weights` (the part's ParamSet, aligned),
 * its optimizer buffers under `<replica>/optimizer/<buffer>`, its data-parallel arrays under
 * `<replica>/data-parallel/<array>` and AvgPipe's centers under `<replica>/center`, where
 * `<replica>` is `part<j>` for one pipeline (the layout of every earlier file) and
 * `pipeline<p>/part<j>` otherwise; in `__metadata__` the format, the schedule, the configuration,
 * the counters and `extra` as JSON.
 */
import type { LrScheduler } from '../optim/lr-schedule.js';
import { performance } from 'node:perf_hooks';

import { CheckpointError, InvalidArgumentError } from '../errors.js';
import type { OptimizerState, StateBufferName } from '../optim/optimizer.js';
import { STATE_BUFFER_NAMES } from '../optim/optimizer.js';
import { PIPELINE_STATE_COUPLINGS, PipelineTrainer, type PipelineStateCoupling, type PipelineReplicaState, type PipelineTrainerState } from '../pipeline/runtime/trainer.js';
import { AVERAGING_LAYOUTS, type AveragingLayout } from '../pipeline/runtime/stage-host.js';
import type { StepResult } from '../optim/optimizer.js';
import { checkInteger, checkOptions, describeValue, optionKeys } from '../validate.js';
import { decodeSafetensors, encodeSafetensors, type SafetensorsTensor } from './safetensors.js';
import {
  CHECKPOINT_FORMAT,
  CHECKPOINT_VERSION,
  checkCount,
  checkDirectory,
  checkRate,
  checkScheduler,
  chooseCheckpoint,
  ensureDirectory,
  pruneSteps,
  restoreScheduler,
  saveRankFile,
  savedSchedulerState,
  schedulerMetadata,
  stepDirectory,
  warnSkipped,
  writeFailure,
} from './store.js';
import type { CheckpointSave, LoadedCheckpoint, SavedCheckpoint } from './trainer.js';

const KIND = 'pipeline-trainer';

/** Options of {@link savePipelineCheckpoint}. @category Checkpoints */
export interface SavePipelineCheckpointOptions {
  dir: string;
  /** Complete checkpoints to keep. Default 2. */
  keep?: number;
  /** The caller's own state to restore: anything JSON.stringify keeps. */
  extra?: unknown;
  /** A learning-rate scheduler (of the trainer) whose position is kept with the checkpoint; pass it to loadPipelineCheckpoint to continue it. */
  scheduler?: LrScheduler;
}
const SAVE_OPTION_KEYS = optionKeys<SavePipelineCheckpointOptions>({ dir: true, keep: true, extra: true, scheduler: true });

/** A data-parallel state's scalars; its arrays are tensors (DATA_PARALLEL_ARRAYS). */
interface SavedDataParallel {
  version: 1;
  mode: string;
  calls: number;
  pending: { nonFiniteCount: number } | null;
  ahead: { result: StepResult; predicted: boolean } | null;
  residual: boolean;
  lossScale: { scale: number; goodSteps: number } | null;
  accumulation: { count: number } | null;
}

/** The arrays of a replica's data-parallel state, by their tensor name: one list, read by save and load. */
const DATA_PARALLEL_ARRAYS = ['pending', 'ahead-weights', 'ahead-predicted', 'residual', 'accumulation'] as const;
type DataParallelArray = (typeof DATA_PARALLEL_ARRAYS)[number];

interface SavedCounters {
  /** Absent in files of one pipeline written before version 2 of the state. */
  version?: 2;
  schedule: string;
  stages: number;
  pipelines?: number;
  coupling?: PipelineStateCoupling;
  averagingLayout?: AveragingLayout;
  rounds: number;
  epochs: number;
  orderPosition: number;
  parts: { pipeline?: number; part?: number; updates: number; skipped: number; optimizer: Omit<OptimizerState, 'buffers'>; dataParallel?: SavedDataParallel }[];
  centers?: { pipeline: number; part: number; updates: number[] }[];
}

/** Where a replica's tensors live in the file: `part<j>` for one pipeline (every earlier file's names), else `pipeline<p>/part<j>`. */
function replicaPrefix(coupling: PipelineStateCoupling | undefined, pipeline: number, part: number): string {
  return coupling === undefined || coupling === 'none' ? `part${part}` : `pipeline${pipeline}/part${part}`;
}

function dataParallelArrays(dp: NonNullable<PipelineReplicaState['dataParallel']>): Record<DataParallelArray, Float32Array | null | undefined> {
  return { pending: dp.pending?.averaged, 'ahead-weights': dp.ahead?.weights, 'ahead-predicted': dp.ahead?.predicted, residual: dp.residual, accumulation: dp.accumulation?.grads };
}

/**
 * Saves a PipelineTrainer between rounds: the state is gathered from the stages (copies), then the
 * file is written in the background (`written`). The step of the checkpoint is the trainer's
 * rounds so far. A save cut short leaves the previous checkpoint the newest complete one.
 *
 * @category Checkpoints
 */
export async function savePipelineCheckpoint(trainer: PipelineTrainer, options: SavePipelineCheckpointOptions): Promise<CheckpointSave> {
  checkPipelineTrainer(trainer, 'savePipelineCheckpoint');
  checkOptions(options, SAVE_OPTION_KEYS, 'savePipelineCheckpoint(trainer, options)');
  const dir = await checkDirectory(options.dir, 'savePipelineCheckpoint');
  const keep = checkInteger(options.keep ?? 2, 'savePipelineCheckpoint: keep', 1, 1 << 20);
  let extra: string;
  try {
    extra = JSON.stringify(options.extra ?? null);
  } catch (error) {
    throw new InvalidArgumentError(`savePipelineCheckpoint: extra must be JSON-serialisable (${(error as Error).message})`, { cause: error });
  }
  await ensureDirectory(dir);
  const start = performance.now();
  const state = await trainer.exportState();
  const snapshotMs = performance.now() - start;
  const tensors = new Map<string, SafetensorsTensor>();
  const put = (name: string, data: Float32Array): void => void tensors.set(name, { shape: [data.length], data });
  state.parts.forEach((p) => {
    const prefix = replicaPrefix(state.coupling, p.pipeline!, p.part!);
    put(`${prefix}/weights`, p.weights);
    for (const [name, data] of Object.entries(p.optimizer.buffers)) if (data) put(`${prefix}/optimizer/${name}`, data);
    if (p.dataParallel) for (const [name, data] of Object.entries(dataParallelArrays(p.dataParallel))) if (data) put(`${prefix}/data-parallel/${name}`, data);
  });
  for (const c of state.centers ?? []) put(`${replicaPrefix(state.coupling, c.pipeline, c.part)}/center`, c.weights);
  const counters: SavedCounters = {
    version: 2,
    schedule: state.schedule,
    stages: state.stages,
    pipelines: state.pipelines!,
    coupling: state.coupling!,
    ...(state.averagingLayout ? { averagingLayout: state.averagingLayout } : {}),
    rounds: state.rounds,
    epochs: state.epochs,
    orderPosition: state.orderPosition,
    parts: state.parts.map((p) => ({
      pipeline: p.pipeline!,
      part: p.part!,
      updates: p.updates,
      skipped: p.skipped,
      optimizer: { kind: p.optimizer.kind, step: p.optimizer.step, skippedSteps: p.optimizer.skippedSteps, lr: p.optimizer.lr, length: p.optimizer.length },
      ...(p.dataParallel
        ? {
            dataParallel: {
              version: p.dataParallel.version,
              mode: p.dataParallel.mode,
              calls: p.dataParallel.calls,
              pending: p.dataParallel.pending ? { nonFiniteCount: p.dataParallel.pending.nonFiniteCount } : null,
              ahead: p.dataParallel.ahead ? { result: p.dataParallel.ahead.result, predicted: p.dataParallel.ahead.predicted !== null } : null,
              residual: (p.dataParallel.residual ?? null) !== null,
              lossScale: p.dataParallel.lossScale ?? null,
              accumulation: p.dataParallel.accumulation ? { count: p.dataParallel.accumulation.count } : null,
            },
          }
        : {}),
    })),
    ...(state.centers ? { centers: state.centers.map((c) => ({ pipeline: c.pipeline, part: c.part, updates: c.updates })) } : {}),
  };
  const chunks = encodeSafetensors(tensors, { format: CHECKPOINT_FORMAT, version: String(CHECKPOINT_VERSION), kind: KIND, trainer: JSON.stringify(counters), extra, ...schedulerMetadata(options.scheduler, 'savePipelineCheckpoint') });
  const step = state.rounds;
  const written = (async (): Promise<SavedCheckpoint> => {
    try {
      const manifest = await saveRankFile(dir, step, 0, 1, KIND, chunks);
      await pruneSteps(dir, 1, keep, step);
      return { step, path: stepDirectory(dir, step), bytes: manifest.bytes, writeMs: performance.now() - start };
    } catch (error) {
      throw writeFailure(dir, error);
    }
  })();
  written.catch(() => undefined); // the caller awaits it
  return { step, snapshotMs, written };
}

/**
 * Restores the newest checkpoint in `dir` that verifies into a PipelineTrainer of the same
 * schedule, model and optimizer (created fresh); resolves with its step (rounds) and `extra`, or
 * null when `dir` is missing or empty. Newer steps that do not verify are passed over with a
 * warning (code `SAPIPE_CHECKPOINT_FALLBACK`), as loadCheckpoint does; a directory holding
 * something but nothing that verifies, or a file of another version or configuration or with
 * counters no trainer could have, is a CheckpointError naming it, with the trainer unchanged.
 *
 * @category Checkpoints
 */
export async function loadPipelineCheckpoint(trainer: PipelineTrainer, options: { dir: string; scheduler?: LrScheduler }): Promise<LoadedCheckpoint | null> {
  checkPipelineTrainer(trainer, 'loadPipelineCheckpoint');
  checkOptions(options, ['dir', 'scheduler'], 'loadPipelineCheckpoint(trainer, options)');
  checkScheduler(options.scheduler, 'loadPipelineCheckpoint');
  const dir = await checkDirectory(options.dir, 'loadPipelineCheckpoint');
  const choice = await chooseCheckpoint(dir, 1, 0);
  warnSkipped(dir, choice);
  if (choice.step === undefined) return null;
  const { step, skipped } = choice;
  const { bytes, path } = choice.file!;
  const { tensors, metadata } = decodeSafetensors(bytes, path);
  if (metadata.format !== CHECKPOINT_FORMAT) throw new CheckpointError(`${path}: not a sapipe checkpoint`, { reason: 'foreign' });
  if (metadata.version !== String(CHECKPOINT_VERSION))
    throw new CheckpointError(`${path}: checkpoint format version ${describeValue(metadata.version)}; this sapipe reads version ${CHECKPOINT_VERSION}`, { reason: 'version' });
  if (metadata.kind !== KIND) throw new CheckpointError(`${path}: a ${describeValue(metadata.kind)} checkpoint, not a pipeline trainer's`, { reason: 'mismatch' });
  let saved: SavedCounters;
  let extra: unknown;
  try {
    saved = JSON.parse(metadata.trainer ?? '') as SavedCounters;
    extra = JSON.parse(metadata.extra ?? 'null');
  } catch (error) {
    throw new CheckpointError(`${path}: its metadata is not JSON`, { reason: 'corrupt', cause: error });
  }
  if (saved === null || typeof saved !== 'object' || !Array.isArray(saved.parts)) throw new CheckpointError(`${path}: the trainer's counters are missing`, { reason: 'corrupt' });
  checkCounters(saved, path);
  const array = (name: string): Float32Array | undefined => {
    const data = tensors.get(name)?.data;
    return data instanceof Float32Array ? data : undefined;
  };
  const parts = saved.parts.map((p, j): PipelineReplicaState => {
    const [pipeline, part] = saved.version === 2 ? [p.pipeline!, p.part!] : [0, j];
    const prefix = replicaPrefix(saved.coupling, pipeline, part);
    const weights = array(`${prefix}/weights`);
    if (!weights) throw new CheckpointError(`${path}: ${prefix}/weights is missing`, { reason: 'mismatch' });
    const buffers: Partial<Record<StateBufferName, Float32Array>> = {};
    for (const name of STATE_BUFFER_NAMES) {
      const data = array(`${prefix}/optimizer/${name}`);
      if (data) buffers[name] = data;
    }
    const replica: PipelineReplicaState = { ...(saved.version === 2 ? { pipeline, part } : {}), weights, optimizer: { ...p.optimizer, buffers }, updates: p.updates, skipped: p.skipped };
    const dp = p.dataParallel;
    if (dp === undefined) return replica;
    const got = (name: DataParallelArray, wanted: boolean): Float32Array | null => {
      if (!wanted) return null;
      const data = array(`${prefix}/data-parallel/${name}`);
      if (!data) throw new CheckpointError(`${path}: ${prefix}/data-parallel/${name} is missing`, { reason: 'mismatch' });
      return data;
    };
    return {
      ...replica,
      dataParallel: {
        version: dp.version,
        mode: dp.mode as NonNullable<PipelineReplicaState['dataParallel']>['mode'],
        calls: dp.calls,
        pending: dp.pending ? { averaged: got('pending', true)!, nonFiniteCount: dp.pending.nonFiniteCount } : null,
        ahead: dp.ahead ? { weights: got('ahead-weights', true)!, predicted: got('ahead-predicted', dp.ahead.predicted), result: dp.ahead.result } : null,
        residual: got('residual', dp.residual),
        lossScale: dp.lossScale,
        accumulation: dp.accumulation ? { count: dp.accumulation.count, grads: got('accumulation', true)! } : null,
      },
    };
  });
  const centers = saved.centers?.map((c) => {
    const prefix = replicaPrefix(saved.coupling, c.pipeline, c.part);
    const weights = array(`${prefix}/center`);
    if (!weights) throw new CheckpointError(`${path}: ${prefix}/center is missing`, { reason: 'mismatch' });
    return { pipeline: c.pipeline, part: c.part, weights, updates: c.updates };
  });
  const { schedule, stages, rounds, epochs, orderPosition } = saved;
  const state: PipelineTrainerState =
    saved.version === 2
      ? { version: 2, schedule, stages, pipelines: saved.pipelines!, coupling: saved.coupling!, ...(saved.averagingLayout ? { averagingLayout: saved.averagingLayout } : {}), rounds, epochs, orderPosition, parts, ...(centers ? { centers } : {}) }
      : { version: 1, schedule, stages, rounds, epochs, orderPosition, parts };
  const schedulerState = savedSchedulerState(options.scheduler, metadata, path);
  try {
    await trainer.importState(state);
  } catch (error) {
    const code = (error as { code?: string }).code;
    if (code === 'ERR_INVALID_ARGUMENT' || code === 'ERR_SIZE_MISMATCH')
      throw new CheckpointError(`${path}: does not fit this trainer: ${(error as Error).message}`, { reason: 'mismatch', cause: error });
    throw error;
  }
  restoreScheduler(options.scheduler, schedulerState, path);
  return { step, path: stepDirectory(dir, step), extra, tensors: new Map(), skipped };
}

/** The counters of a file, checked as untrusted input (see trainer.ts's checkCounters). */
function checkCounters(saved: SavedCounters, path: string): void {
  const corrupt = (what: string): CheckpointError => new CheckpointError(`${path}: ${what}; the file is corrupt or was not written by sapipe`, { reason: 'corrupt' });
  if (typeof saved.schedule !== 'string') throw corrupt('the schedule is not named');
  if (saved.version !== undefined && saved.version !== 2) throw corrupt(`the state's version is ${describeValue(saved.version)}`);
  for (const key of ['stages', 'rounds', 'epochs', 'orderPosition'] as const) checkCount(saved[key], `the trainer's ${key}`, path);
  if (saved.version === 2) {
    checkCount(saved.pipelines, "the trainer's pipelines", path);
    if (!PIPELINE_STATE_COUPLINGS.includes(saved.coupling!) || (saved.averagingLayout !== undefined && !AVERAGING_LAYOUTS.includes(saved.averagingLayout)))
      throw corrupt(`the coupling of the pipelines (${describeValue(saved.coupling)}${saved.averagingLayout !== undefined ? `, ${describeValue(saved.averagingLayout)}` : ''}) is not one sapipe writes`);
    if (saved.centers !== undefined && !Array.isArray(saved.centers)) throw corrupt('the centers are not a list');
    (saved.centers ?? []).forEach((c, i) => {
      if (c === null || typeof c !== 'object' || !Array.isArray(c.updates)) throw corrupt(`center ${i}'s counters are missing`);
      checkCount(c.pipeline, `center ${i}'s pipeline`, path);
      checkCount(c.part, `center ${i}'s part`, path);
      c.updates.forEach((u) => checkCount(u, `center ${i}'s elasticAverage calls`, path));
    });
  }
  saved.parts.forEach((p, j) => {
    if (p === null || typeof p !== 'object' || p.optimizer === null || typeof p.optimizer !== 'object') throw corrupt(`part ${j}'s counters are missing`);
    if (saved.version === 2) {
      checkCount(p.pipeline, `replica ${j}'s pipeline`, path);
      checkCount(p.part, `replica ${j}'s part`, path);
    }
    const dp = p.dataParallel;
    if (dp !== undefined) {
      if (dp === null || typeof dp !== 'object' || typeof dp.mode !== 'string' || (dp.pending !== null && typeof dp.pending !== 'object') || (dp.ahead !== null && typeof dp.ahead !== 'object') || (dp.accumulation !== null && typeof dp.accumulation !== 'object'))
        throw corrupt(`replica ${j}'s data-parallel state is not valid`);
      checkCount(dp.calls, `replica ${j}'s data-parallel calls`, path);
    }
    checkCount(p.updates, `part ${j}'s updates`, path);
    checkCount(p.skipped, `part ${j}'s skipped updates`, path);
    checkCount(p.optimizer.step, `part ${j}'s optimizer step count`, path);
    checkCount(p.optimizer.skippedSteps, `part ${j}'s optimizer skipped steps`, path);
    checkCount(p.optimizer.length, `part ${j}'s optimizer length`, path);
    checkRate(p.optimizer.lr, `part ${j}'s learning rate`, path);
  });
}

function checkPipelineTrainer(trainer: unknown, what: string): void {
  if (!(trainer instanceof PipelineTrainer)) throw new InvalidArgumentError(`${what}: trainer must be a PipelineTrainer, got ${describeValue(trainer)}`);
}
