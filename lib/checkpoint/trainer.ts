/**
 * Checkpoints of a DataParallelTrainer: everything exportState() holds (weights, optimizer state
 * and step counters, compensation and prediction buffers, the averaged gradient or the update in
 * flight) plus the caller's own position (epoch, batch, seeds: `extra`), one safetensors file per
 * rank in the layout of store.ts. Resuming continues exactly as if training had not stopped.
 *
 * In the file: each ParamSet tensor's weights under `weights/<name>` with its shape (what a Python
 * tool loads), the flat buffer's alignment gaps under `padding/weights`, each optimizer buffer
 * flat under `optimizer/<buffer>`, the gradient or update in
 * flight under `pending/averaged`, `ahead/weights`, `ahead/predicted`, a compressing trainer's
 * error-feedback residual under `compression/residual`, the gradient of an accumulation in
 * progress under `accumulation/grads`; in `__metadata__` the
 * format, the layout, the trainer's mode and counters (the loss scale among them), and `extra` as JSON.
 */
import type { LrScheduler } from '../optim/lr-schedule.js';
import { performance } from 'node:perf_hooks';

import { CheckpointError, InvalidArgumentError, SapipeError } from '../errors.js';
import { DataParallelTrainer, type DataParallelTrainerState } from '../dataparallel/trainer.js';
import type { OptimizerState, StateBufferName } from '../optim/optimizer.js';
import { STATE_BUFFER_NAMES } from '../optim/optimizer.js';
import { checkInteger, checkObject, describeValue, optionKeys, checkOptions } from '../validate.js';
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
  FALLBACK_REASONS,
  pruneSteps,
  rankSteps,
  readRankFile,
  restoreScheduler,
  saveRankFile,
  savedSchedulerState,
  schedulerMetadata,
  stepDirectory,
  warnSkipped,
  writeFailure,
  type SkippedCheckpoint,
} from './store.js';

const KIND = 'data-parallel-trainer';

/** Each trainer's last snapshot, and whether its file is written (its arrays are free again). */
const snapshots = new WeakMap<DataParallelTrainer, { state: DataParallelTrainerState; written: boolean }>();

/** Options of {@link saveCheckpoint}. @category Checkpoints */
export interface SaveCheckpointOptions {
  /** The checkpoint directory (created if missing); every rank of the job passes the same one. */
  dir: string;
  /** Complete checkpoints to keep (rank 0 removes older ones after each save). Default 2. */
  keep?: number;
  /** The caller's own state to restore (data position, seeds): anything JSON.stringify keeps. */
  extra?: unknown;
  /**
   * The caller's own tensors (e.g. a model-parallel shard the trainer does not hold), stored under
   * `user/<name>` in the rank's file and given back by loadCheckpoint and readRankCheckpoint. The
   * arrays are written in the background: do not change them until `written` resolves (pass copies).
   */
  tensors?: ReadonlyMap<string, SafetensorsTensor>;
  /** A learning-rate scheduler whose position is kept with the checkpoint; pass it to loadCheckpoint to continue it. */
  scheduler?: LrScheduler;
}
const SAVE_OPTION_KEYS = optionKeys<SaveCheckpointOptions>({ dir: true, keep: true, extra: true, tensors: true, scheduler: true });
/** The prefix of the caller's own tensors in a rank's file. */
const USER_PREFIX = 'user/';

/** A save under way: the snapshot is taken, the file is being written. @category Checkpoints */
export interface CheckpointSave {
  /** The step saved: the trainer's step() calls so far. */
  readonly step: number;
  /** Time the trainer's thread spent on the snapshot (exportState's copies), ms. */
  readonly snapshotMs: number;
  /** Resolves when the rank's file and manifest are on disk; rejects with the write's error. */
  readonly written: Promise<SavedCheckpoint>;
}

/** A finished save. @category Checkpoints */
export interface SavedCheckpoint {
  readonly step: number;
  /** The step's directory. */
  readonly path: string;
  readonly bytes: number;
  /** From the snapshot to the manifest on disk, ms. */
  readonly writeMs: number;
}

/** What {@link loadCheckpoint} restored. @category Checkpoints */
export interface LoadedCheckpoint {
  readonly step: number;
  readonly path: string;
  /** The `extra` given to saveCheckpoint. */
  readonly extra: unknown;
  /** The `tensors` given to saveCheckpoint (empty if none). */
  readonly tensors: Map<string, SafetensorsTensor>;
  /** Newer steps passed over because they did not verify (a save cut short, a damaged file), newest first; empty when the newest step loaded. */
  readonly skipped: readonly SkippedCheckpoint[];
}

/** @internal Refuses anything but a DataParallelTrainer, before any of its members is touched. */
export function checkTrainer(trainer: unknown, what: string): asserts trainer is DataParallelTrainer {
  if (!(trainer instanceof DataParallelTrainer)) throw new InvalidArgumentError(`${what}: trainer must be a DataParallelTrainer, got ${describeValue(trainer)}`);
}

/**
 * Saves this rank's checkpoint: a snapshot of the trainer's state on the calling thread (it waits
 * for the gradient in flight, as exportState does), then the file written in the background.
 * Resolves once the snapshot is taken; `written` says when the file is safely on disk. Every rank
 * calls it at the same step with the same `dir`. A save cut short leaves the previous checkpoint
 * the newest complete one.
 *
 * @category Checkpoints
 */
export async function saveCheckpoint(trainer: DataParallelTrainer, options: SaveCheckpointOptions): Promise<CheckpointSave> {
  checkTrainer(trainer, 'saveCheckpoint');
  checkOptions(options, SAVE_OPTION_KEYS, 'saveCheckpoint(trainer, options)');
  const dir = await checkDirectory(options.dir, 'saveCheckpoint');
  const keep = checkInteger(options.keep ?? 2, 'saveCheckpoint: keep', 1, 1 << 20);
  const own = checkUserTensors(options.tensors);
  let extra: string;
  try {
    extra = JSON.stringify(options.extra ?? null);
  } catch (error) {
    throw new InvalidArgumentError(`saveCheckpoint: extra must be JSON-serialisable (${(error as Error).message})`, { cause: error });
  }
  // A directory that cannot be created fails here, before the snapshot is paid for.
  await ensureDirectory(dir);
  // The previous save's snapshot, once its file is written, takes this one: copying into memory
  // already touched is several times faster than into fresh pages.
  const last = snapshots.get(trainer);
  const start = performance.now();
  const state = await trainer.exportState(last?.written ? last.state : undefined);
  const snapshotMs = performance.now() - start;
  const entry = { state, written: false };
  snapshots.set(trainer, entry);
  const { rank, size } = trainer.comm;
  const all = tensorsOf(trainer, state);
  for (const [name, t] of own) all.set(USER_PREFIX + name, t);
  const chunks = encodeSafetensors(all, {
    format: CHECKPOINT_FORMAT,
    version: String(CHECKPOINT_VERSION),
    kind: KIND,
    layout: JSON.stringify(trainer.params.names.map((n) => [n, trainer.params.layout(n).shape])),
    length: String(trainer.params.length),
    trainer: JSON.stringify({
      mode: state.mode,
      calls: state.calls,
      optimizer: { kind: state.optimizer.kind, step: state.optimizer.step, skippedSteps: state.optimizer.skippedSteps, lr: state.optimizer.lr },
      pending: state.pending ? { nonFiniteCount: state.pending.nonFiniteCount } : null,
      ahead: state.ahead ? { result: state.ahead.result, predicted: state.ahead.predicted !== null } : null,
      lossScale: state.lossScale ?? null,
      accumulated: state.accumulation?.count ?? 0,
    }),
    rank: String(rank),
    worldSize: String(size),
    extra,
    ...schedulerMetadata(options.scheduler, 'saveCheckpoint'),
  });
  const step = state.calls;
  const written = (async (): Promise<SavedCheckpoint> => {
    try {
      const manifest = await saveRankFile(dir, step, rank, size, KIND, chunks);
      if (rank === 0) await pruneSteps(dir, size, keep, step);
      return { step, path: stepDirectory(dir, step), bytes: manifest.bytes, writeMs: performance.now() - start };
    } catch (error) {
      throw writeFailure(dir, error);
    }
  })();
  // The caller awaits it; an unawaited failure must not end the process.
  written.then(
    () => (entry.written = true),
    () => (entry.written = true),
  );
  return { step, snapshotMs, written };
}

/**
 * Restores the newest checkpoint in `dir` that verifies into a trainer of the same model,
 * optimizer, mode and number of ranks, created fresh (nothing in flight); resolves with its step
 * and `extra`, or null when `dir` is missing or empty (a first run). Every rank calls it.
 *
 * A step verifies when every rank's manifest is there and every rank's file matches its size and
 * SHA-256. Newer steps that do not (a save cut short, a file truncated or corrupted on disk, a
 * manifest deleted) are passed over, each named with the reason in a warning
 * (`process.emitWarning`, code `SAPIPE_CHECKPOINT_FALLBACK`) and in `skipped`. Every rank checks
 * every rank's files, so ranks that see the same directory resume from the same step. A
 * directory that holds something but no step that verifies is a CheckpointError saying what is
 * wrong, never a silent fresh start; so is a verified file of another version, model, optimizer,
 * mode or number of ranks, or with counters no trainer could have (the trainer is then unchanged).
 *
 * @category Checkpoints
 */
export async function loadCheckpoint(trainer: DataParallelTrainer, options: LoadCheckpointOptions): Promise<LoadedCheckpoint | null> {
  checkTrainer(trainer, 'loadCheckpoint');
  checkObject(options, 'loadCheckpoint(trainer, options)');
  checkOptions(options, ['dir', 'scheduler'], 'loadCheckpoint(trainer, options)');
  checkScheduler(options.scheduler, 'loadCheckpoint');
  const dir = await checkDirectory(options.dir, 'loadCheckpoint');
  const { rank, size } = trainer.comm;
  const choice = await chooseCheckpoint(dir, size, rank);
  warnSkipped(dir, choice, size > 1 ? rank : undefined);
  if (choice.step === undefined) return null;
  const { step, skipped } = choice;
  const { bytes, path } = choice.file!;
  const { tensors, metadata } = decodeSafetensors(bytes, path);
  const state = stateOf(trainer, tensors, metadata, path, rank);
  let extra: unknown;
  try {
    extra = JSON.parse(metadata.extra ?? 'null');
  } catch (error) {
    throw new CheckpointError(`${path}: extra is not JSON`, { reason: 'corrupt', cause: error });
  }
  const schedulerState = savedSchedulerState(options.scheduler, metadata, path);
  try {
    trainer.importState(state);
  } catch (error) {
    if (error instanceof SapipeError && (error.code === 'ERR_INVALID_ARGUMENT' || error.code === 'ERR_SIZE_MISMATCH'))
      throw new CheckpointError(`${path}: does not fit this trainer: ${error.message}`, { reason: 'mismatch', cause: error });
    throw error;
  }
  restoreScheduler(options.scheduler, schedulerState, path);
  return { step, path: stepDirectory(dir, step), extra, tensors: userTensors(tensors), skipped };
}

/** Options of {@link loadCheckpoint}. @category Checkpoints */
export interface LoadCheckpointOptions {
  dir: string;
  /** The learning-rate scheduler to continue from the position saved with the checkpoint (saveCheckpoint's `scheduler`). */
  scheduler?: LrScheduler;
}

/** What {@link readRankCheckpoint} read: a rank's file, without a trainer. @category Checkpoints */
export interface RankCheckpoint {
  readonly step: number;
  /**
   * Newer steps of this rank passed over because their file does not verify (only when no step
   * was asked for: the newest that verifies is read, with a SAPIPE_CHECKPOINT_FALLBACK warning).
   */
  readonly skipped: readonly SkippedCheckpoint[];
  readonly path: string;
  readonly extra: unknown;
  /** The `tensors` given to saveCheckpoint. */
  readonly tensors: Map<string, SafetensorsTensor>;
  /** The trainer's step() calls when it was saved. */
  readonly calls: number;
}

/**
 * Reads one rank's file of one step, checked (size, SHA-256, format), without touching a trainer:
 * what partial recovery reloads for the rank that was lost while the others keep their state.
 * `step` defaults to the newest step this rank saved completely (its manifest is written), which
 * may be newer than the newest step every rank completed; a newer step whose file does not verify
 * (damaged, cut short, foreign) is then passed over for the one before, with a
 * SAPIPE_CHECKPOINT_FALLBACK warning and in `skipped`. A step that is asked for is read or
 * refused, never replaced. Resolves with null when the rank has no checkpoint in `dir`; a
 * CheckpointError when it has some and none verifies.
 *
 * @category Checkpoints
 */
export async function readRankCheckpoint(dir: string, rank: number, step?: number): Promise<RankCheckpoint | null> {
  dir = await checkDirectory(dir, 'readRankCheckpoint');
  checkInteger(rank, 'readRankCheckpoint: rank', 0, 1 << 24);
  if (step !== undefined) return readRankStep(dir, rank, checkInteger(step, 'readRankCheckpoint: step', 0, Number.MAX_SAFE_INTEGER), []);
  const skipped: SkippedCheckpoint[] = [];
  let fault: CheckpointError | undefined;
  for (const candidate of await rankSteps(dir, rank)) {
    try {
      const read = await readRankStep(dir, rank, candidate, skipped);
      warnSkipped(dir, { step: candidate, skipped }, rank);
      return read;
    } catch (error) {
      if (!(error instanceof CheckpointError) || !FALLBACK_REASONS.has(error.reason)) throw error;
      fault ??= error;
      skipped.push({ step: candidate, path: stepDirectory(dir, candidate), reason: error.message });
    }
  }
  if (fault === undefined) return null;
  throw new CheckpointError(`${fault.message}; no file of rank ${rank} in ${dir} verifies: restore the files, or move ${dir} aside to start afresh`, { reason: fault.reason, cause: fault });
}

/** One rank's file of one step, read and checked. */
async function readRankStep(dir: string, rank: number, step: number, skipped: SkippedCheckpoint[]): Promise<RankCheckpoint> {
  const { bytes, path } = await readRankFile(dir, step, rank);
  const { tensors, metadata } = decodeSafetensors(bytes, path);
  if (metadata.format !== CHECKPOINT_FORMAT) throw new CheckpointError(`${path}: not a sapipe checkpoint`, { reason: 'foreign' });
  if (metadata.version !== String(CHECKPOINT_VERSION))
    throw new CheckpointError(`${path}: checkpoint format version ${describeValue(metadata.version)}; this sapipe reads version ${CHECKPOINT_VERSION}`, { reason: 'version' });
  if (metadata.rank !== String(rank)) throw new CheckpointError(`${path}: saved by rank ${describeValue(metadata.rank)}, read as rank ${rank}`, { reason: 'mismatch' });
  let extra: unknown;
  let saved: { calls?: unknown } | null;
  try {
    extra = JSON.parse(metadata.extra ?? 'null');
    saved = JSON.parse(metadata.trainer ?? '') as { calls?: unknown } | null;
  } catch (error) {
    throw new CheckpointError(`${path}: its metadata is not JSON`, { reason: 'corrupt', cause: error });
  }
  const calls = checkCount(saved !== null && typeof saved === 'object' ? saved.calls : undefined, "the trainer's step() calls", path);
  return { step, skipped, path, extra, tensors: userTensors(tensors), calls };
}

/** The steps in `dir` for which `rank`'s save finished (its manifest is there), newest first. @category Checkpoints */
export async function rankCheckpointSteps(dir: string, rank: number): Promise<number[]> {
  dir = await checkDirectory(dir, 'rankCheckpointSteps');
  checkInteger(rank, 'rankCheckpointSteps: rank', 0, 1 << 24);
  return rankSteps(dir, rank);
}

function checkUserTensors(tensors: unknown): ReadonlyMap<string, SafetensorsTensor> {
  if (tensors === undefined) return new Map();
  if (!(tensors instanceof Map)) throw new InvalidArgumentError(`saveCheckpoint: tensors must be a Map of name -> { shape, data }, got ${describeValue(tensors)}`);
  for (const [name, t] of tensors as Map<unknown, unknown>) {
    if (typeof name !== 'string' || name === '') throw new InvalidArgumentError(`saveCheckpoint: tensor names must be non-empty strings, got ${describeValue(name)}`);
    checkObject(t, `saveCheckpoint: tensors.get(${JSON.stringify(name)})`);
    if (!(t.data instanceof Float32Array || t.data instanceof Int32Array))
      throw new InvalidArgumentError(`saveCheckpoint: tensor ${JSON.stringify(name)}'s data must be a Float32Array or an Int32Array`);
    if (!Array.isArray(t.shape) || t.shape.reduce((n: number, d: unknown) => n * (Number.isInteger(d) && (d as number) >= 0 ? (d as number) : NaN), 1) !== t.data.length)
      throw new InvalidArgumentError(`saveCheckpoint: tensor ${JSON.stringify(name)}'s shape must list non-negative integers whose product is its ${t.data.length} values`);
  }
  return tensors as ReadonlyMap<string, SafetensorsTensor>;
}

function userTensors(tensors: Map<string, SafetensorsTensor>): Map<string, SafetensorsTensor> {
  const out = new Map<string, SafetensorsTensor>();
  for (const [name, t] of tensors) if (name.startsWith(USER_PREFIX)) out.set(name.slice(USER_PREFIX.length), t);
  return out;
}

/** The stretches of the flat buffer between and after the tensors (alignment): [offset, length]. */
function paddingOf(trainer: DataParallelTrainer): [number, number][] {
  const gaps: [number, number][] = [];
  let at = 0;
  const close = (to: number): void => {
    if (to > at) gaps.push([at, to - at]);
  };
  for (const l of trainer.params.names.map((n) => trainer.params.layout(n)).sort((a, b) => a.offset - b.offset)) {
    close(l.offset);
    at = l.offset + l.size;
  }
  close(trainer.params.length);
  return gaps;
}

function tensorsOf(trainer: DataParallelTrainer, state: DataParallelTrainerState): Map<string, SafetensorsTensor> {
  const out = new Map<string, SafetensorsTensor>();
  const flat = (data: Float32Array): SafetensorsTensor => ({ shape: [data.length], data });
  for (const name of trainer.params.names) {
    const l = trainer.params.layout(name);
    out.set(`weights/${name}`, { shape: l.shape, data: state.weights.subarray(l.offset, l.offset + l.size) });
  }
  // The alignment gaps of the flat buffer: nothing reads them, but a caller may write the whole
  // buffer, and the update runs over it; kept so that resuming is exact whatever they hold.
  const gaps = paddingOf(trainer);
  const padding = new Float32Array(gaps.reduce((n, [, len]) => n + len, 0));
  let k = 0;
  for (const [offset, len] of gaps) padding.set(state.weights.subarray(offset, offset + len), (k += len) - len);
  out.set('padding/weights', flat(padding));
  for (const [name, data] of Object.entries(state.optimizer.buffers)) if (data) out.set(`optimizer/${name}`, flat(data));
  if (state.pending) out.set('pending/averaged', flat(state.pending.averaged));
  if (state.ahead) {
    out.set('ahead/weights', flat(state.ahead.weights));
    if (state.ahead.predicted) out.set('ahead/predicted', flat(state.ahead.predicted));
  }
  if (state.residual) out.set('compression/residual', flat(state.residual));
  if (state.accumulation) out.set('accumulation/grads', flat(state.accumulation.grads));
  return out;
}

interface SavedTrainer {
  mode: DataParallelTrainerState['mode'];
  calls: number;
  optimizer: Pick<OptimizerState, 'kind' | 'step' | 'skippedSteps' | 'lr'>;
  pending: { nonFiniteCount: number } | null;
  ahead: { result: NonNullable<DataParallelTrainerState['ahead']>['result']; predicted: boolean } | null;
  lossScale?: { scale: number; goodSteps: number } | null;
  accumulated?: number;
}

/**
 * The counters of a file, checked as untrusted input: counts are non-negative safe integers, rates
 * finite, flags booleans. The SHA-256 only says the file is what was written, not that what wrote
 * it was sapipe; and a count of 1e300 or a learning rate of Infinity would load and then make
 * every later step meaningless.
 */
function checkCounters(saved: SavedTrainer, path: string): void {
  const corrupt = (what: string): CheckpointError => new CheckpointError(`${path}: ${what}; the file is corrupt or was not written by sapipe`, { reason: 'corrupt' });
  checkCount(saved.calls, "the trainer's step() calls", path);
  checkCount(saved.optimizer.step, "the optimizer's step count", path);
  checkCount(saved.optimizer.skippedSteps, "the optimizer's skipped steps", path);
  checkRate(saved.optimizer.lr, "the optimizer's learning rate", path);
  if (saved.pending !== null) {
    if (typeof saved.pending !== 'object') throw corrupt('the gradient in flight is not described by an object');
    checkCount(saved.pending.nonFiniteCount, "the gradient in flight's non-finite count", path);
  }
  if (saved.ahead !== null) {
    const ahead = saved.ahead as Partial<NonNullable<SavedTrainer['ahead']>> | undefined;
    if (ahead === undefined || typeof ahead !== 'object' || typeof ahead.predicted !== 'boolean') throw corrupt('the update applied ahead is not described by { result, predicted }');
    const r = ahead.result as Partial<NonNullable<DataParallelTrainerState['ahead']>['result']> | null | undefined;
    if (r === null || typeof r !== 'object' || typeof r.applied !== 'boolean') throw corrupt('the result of the update applied ahead is not { applied, nonFiniteCount, step }');
    checkCount(r.nonFiniteCount, "the update applied ahead's non-finite count", path);
    checkCount(r.step, "the update applied ahead's step", path);
  }
  if (saved.lossScale !== undefined && saved.lossScale !== null) {
    const scale = saved.lossScale as Partial<{ scale: unknown; goodSteps: unknown }>;
    if (typeof scale !== 'object' || typeof scale.scale !== 'number' || !Number.isFinite(scale.scale) || scale.scale <= 0)
      throw corrupt(`the loss scale is ${describeValue((scale as { scale?: unknown }).scale)}, not a finite positive number`);
    checkCount(scale.goodSteps, "the loss scale's good steps", path);
  }
  if (saved.accumulated !== undefined) checkCount(saved.accumulated, 'the micro-batches accumulated', path);
}

/** The exportState() form of a file, checked against this trainer before anything changes. */
function stateOf(trainer: DataParallelTrainer, tensors: Map<string, SafetensorsTensor>, metadata: Record<string, string>, path: string, rank: number): DataParallelTrainerState {
  if (metadata.format !== CHECKPOINT_FORMAT) throw new CheckpointError(`${path}: not a sapipe checkpoint`, { reason: 'foreign' });
  if (metadata.version !== String(CHECKPOINT_VERSION))
    throw new CheckpointError(`${path}: checkpoint format version ${describeValue(metadata.version)}; this sapipe reads version ${CHECKPOINT_VERSION}`, { reason: 'version' });
  if (metadata.kind !== KIND) throw new CheckpointError(`${path}: a ${describeValue(metadata.kind)} checkpoint, not a data-parallel trainer's`, { reason: 'mismatch' });
  if (metadata.rank !== String(rank)) throw new CheckpointError(`${path}: saved by rank ${describeValue(metadata.rank)}, loaded by rank ${rank}`, { reason: 'mismatch' });
  const layout = JSON.stringify(trainer.params.names.map((n) => [n, trainer.params.layout(n).shape]));
  if (metadata.layout !== layout)
    throw new CheckpointError(`${path}: saved for a model with tensors ${metadata.layout ?? '(none)'}; this trainer's are ${layout}`, { reason: 'mismatch' });
  let saved: SavedTrainer;
  try {
    saved = JSON.parse(metadata.trainer ?? '') as SavedTrainer;
  } catch (error) {
    throw new CheckpointError(`${path}: the trainer's counters are not JSON`, { reason: 'corrupt', cause: error });
  }
  if (saved === null || typeof saved !== 'object' || saved.optimizer === null || typeof saved.optimizer !== 'object')
    throw new CheckpointError(`${path}: the trainer's counters are missing`, { reason: 'corrupt' });
  checkCounters(saved, path);
  if (saved.mode !== trainer.mode) throw new CheckpointError(`${path}: saved in mode ${JSON.stringify(saved.mode)}, this trainer runs "${trainer.mode}"`, { reason: 'mismatch' });
  const kind = trainer.optimizer.exportState().kind;
  if (saved.optimizer.kind !== kind) throw new CheckpointError(`${path}: saved with an optimizer of kind ${JSON.stringify(saved.optimizer.kind)}, this trainer's is "${kind}"`, { reason: 'mismatch' });
  const n = trainer.params.length;
  const take = (name: string): Float32Array => {
    const t = tensors.get(name);
    if (!t || !(t.data instanceof Float32Array)) throw new CheckpointError(`${path}: tensor ${name} is missing`, { reason: 'mismatch' });
    return t.data;
  };
  const weights = new Float32Array(n);
  for (const name of trainer.params.names) {
    const l = trainer.params.layout(name);
    const data = take(`weights/${name}`);
    if (data.length !== l.size) throw new CheckpointError(`${path}: weights/${name} holds ${data.length} values, the tensor ${l.size}`, { reason: 'mismatch' });
    weights.set(data, l.offset);
  }
  const padding = take('padding/weights');
  const gaps = paddingOf(trainer);
  if (padding.length !== gaps.reduce((n, [, len]) => n + len, 0)) throw new CheckpointError(`${path}: padding/weights does not fit this ParamSet's layout`, { reason: 'mismatch' });
  let k = 0;
  for (const [offset, len] of gaps) weights.set(padding.subarray(k, (k += len)), offset);
  const buffers: Partial<Record<StateBufferName, Float32Array>> = {};
  for (const name of STATE_BUFFER_NAMES) {
    const t = tensors.get(`optimizer/${name}`);
    if (t) buffers[name] = t.data as Float32Array;
  }
  return {
    version: 1,
    mode: saved.mode,
    calls: saved.calls,
    weights,
    optimizer: { kind: saved.optimizer.kind, step: saved.optimizer.step, skippedSteps: saved.optimizer.skippedSteps, lr: saved.optimizer.lr, length: n, buffers },
    pending: saved.pending ? { averaged: take('pending/averaged'), nonFiniteCount: saved.pending.nonFiniteCount } : null,
    ahead: saved.ahead ? { weights: take('ahead/weights'), predicted: saved.ahead.predicted ? take('ahead/predicted') : null, result: saved.ahead.result } : null,
    residual: tensors.has('compression/residual') ? take('compression/residual') : null,
    lossScale: saved.lossScale ?? null,
    accumulation: saved.accumulated ? { count: saved.accumulated, grads: take('accumulation/grads') } : null,
  };
}
