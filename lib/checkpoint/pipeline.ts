/**
 * Checkpoints of a PipelineTrainer (one pipeline, on worker threads): its exportState() between
 * rounds, every part's weights and optimizer state and counters, and the position in the data,
 * in one safetensors file in the layout of store.ts (one "rank": the trainer's process). Resuming
 * continues exactly as if training had not stopped.
 *
 * In the file: each part's flat weights under `part<j>/weights` (the part's ParamSet, aligned),
 * its optimizer buffers under `part<j>/optimizer/<buffer>`; in `__metadata__` the format, the
 * schedule, the counters and `extra` as JSON.
 */
import type { LrScheduler } from '../optim/lr-schedule.js';
import { performance } from 'node:perf_hooks';

import { CheckpointError, InvalidArgumentError } from '../errors.js';
import type { OptimizerState, StateBufferName } from '../optim/optimizer.js';
import { STATE_BUFFER_NAMES } from '../optim/optimizer.js';
import { PipelineTrainer, type PipelineTrainerState } from '../pipeline/runtime/trainer.js';
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

interface SavedCounters {
  schedule: string;
  stages: number;
  rounds: number;
  epochs: number;
  orderPosition: number;
  parts: { updates: number; skipped: number; optimizer: Omit<OptimizerState, 'buffers'> }[];
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
  state.parts.forEach((p, j) => {
    tensors.set(`part${j}/weights`, { shape: [p.weights.length], data: p.weights });
    for (const [name, data] of Object.entries(p.optimizer.buffers)) if (data) tensors.set(`part${j}/optimizer/${name}`, { shape: [data.length], data });
  });
  const counters: SavedCounters = {
    schedule: state.schedule,
    stages: state.stages,
    rounds: state.rounds,
    epochs: state.epochs,
    orderPosition: state.orderPosition,
    parts: state.parts.map((p) => ({ updates: p.updates, skipped: p.skipped, optimizer: { kind: p.optimizer.kind, step: p.optimizer.step, skippedSteps: p.optimizer.skippedSteps, lr: p.optimizer.lr, length: p.optimizer.length } })),
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
  const parts = saved.parts.map((p, j) => {
    const weights = tensors.get(`part${j}/weights`)?.data;
    if (!(weights instanceof Float32Array)) throw new CheckpointError(`${path}: part${j}/weights is missing`, { reason: 'mismatch' });
    const buffers: Partial<Record<StateBufferName, Float32Array>> = {};
    for (const name of STATE_BUFFER_NAMES) {
      const t = tensors.get(`part${j}/optimizer/${name}`);
      if (t?.data instanceof Float32Array) buffers[name] = t.data;
    }
    return { weights, optimizer: { ...p.optimizer, buffers }, updates: p.updates, skipped: p.skipped };
  });
  const state: PipelineTrainerState = { version: 1, schedule: saved.schedule, stages: saved.stages, rounds: saved.rounds, epochs: saved.epochs, orderPosition: saved.orderPosition, parts };
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
  for (const key of ['stages', 'rounds', 'epochs', 'orderPosition'] as const) checkCount(saved[key], `the trainer's ${key}`, path);
  saved.parts.forEach((p, j) => {
    if (p === null || typeof p !== 'object' || p.optimizer === null || typeof p.optimizer !== 'object') throw corrupt(`part ${j}'s counters are missing`);
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
