/**
 * Checkpoints and recovery of the recommendation model (docs/ALGORITHMS.md section 7), after CPR:
 *
 * - `full`: every rank saves its embedding shard and the MLP every `saveEvery` steps; after a
 *   failure every rank rolls back to the newest complete checkpoint (full recovery).
 * - `partial`: the same saves; after a failure the survivors keep their state and only the lost
 *   rank's shard is reloaded from its last checkpoint (partial recovery). The MLP, replicated, is
 *   copied from a survivor.
 * - `mfu`: partial recovery, and between full saves, priority saves of the shard's most frequently
 *   updated rows (a `priorityFraction` of the rows, every `priorityFraction` of the interval).
 * - `ssu`: as mfu, the priority rows being a sub-sample of the updated rows (each update is
 *   tracked with probability `ssuSampleRate`) instead of counted ones.
 *
 * The launcher restarts every process after a failure (`sapipe launch --max-restarts`), so a
 * survivor hands its live state to its successor through memory (`handoffDir`, e.g. on /dev/shm):
 * the state is written when the survivor learns of the loss (PeerLostError, or the launcher's
 * SIGTERM) and read back by the restarted rank. The state is the one after the survivor's last
 * complete step; a step cut by the failure may have updated a survivor's rows and runs again.
 */
import { readFileSync, renameSync, rmSync, writeFileSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';

import { CheckpointError, type DataParallelTrainerState, decodeSafetensors, DisposedError, encodeSafetensors, FlatBuffer, InvalidArgumentError, loadCheckpoint, rankCheckpointSteps, readRankCheckpoint, retractRankSave, type SafetensorsTensor, saveCheckpoint, type SavedCheckpoint, seededRandom } from 'sapipe';
import { checkBoolean, checkInteger, checkNumber, checkOneOf, checkOptions, describeValue, optionKeys } from 'sapipe/validate';
import { ClickModel } from './model.js';

/** @category Recommendation */
export type RecoveryPolicy = 'full' | 'partial' | 'mfu' | 'ssu';
/** @category Recommendation */
export const RECOVERY_POLICIES: readonly RecoveryPolicy[] = ['full', 'partial', 'mfu', 'ssu'];

/** Options of {@link CprCheckpointer.create}. @category Recommendation */
export interface CprOptions {
  /** The checkpoint directory, the same on every rank. */
  dir: string;
  policy: RecoveryPolicy;
  /** Steps between full saves (see cprIntervalSeconds and youngIntervalSeconds to choose it). */
  saveEvery: number;
  /** mfu, ssu: the share of a shard's rows each priority save writes; priority saves run every `round(saveEvery * priorityFraction)` steps. Default 0.125. */
  priorityFraction?: number;
  /** ssu: the probability that an update of a row enters the tracked sub-sample. Default 0.125. */
  ssuSampleRate?: number;
  /** The partial policies: where survivors hand their live state to their restarted successors (a memory-backed directory such as /dev/shm/...). */
  handoffDir?: string;
  /** ssu's sampling seed. Default 0. */
  seed?: number;
}
const CPR_OPTION_KEYS = optionKeys<CprOptions>({ dir: true, policy: true, saveEvery: true, priorityFraction: true, ssuSampleRate: true, handoffDir: true, seed: true });

/** How training resumed. @category Recommendation */
export interface CprResume {
  /** The step training goes on from (the trainer's step() calls). */
  step: number;
  /** `fresh` (nothing to resume), `full` (every rank from the checkpoint) or `partial`. */
  kind: 'fresh' | 'full' | 'partial';
  /** partial: the ranks whose shard came from disk (they had no survivor state). */
  reloaded: number[];
  /** partial: for each reloaded rank, the step of the newest state its shard got back (full or priority save); -1 without any. */
  reloadedFrom: number[];
  /** Time the recovery took on this rank (reading, exchanging, importing), ms. */
  ms: number;
}

/** What the checkpoints cost so far on this rank. @category Recommendation */
export interface CprStats {
  fullSaves: number;
  prioritySaves: number;
  /** Priority saves skipped because the previous file was still being written. */
  prioritySkipped: number;
  /** Rows written by priority saves. */
  priorityRows: number;
  /** The training thread's time in saves (snapshot copies, and waiting for the previous file), ms. */
  saveMs: number;
  /** The last finished save. */
  lastSaved: SavedCheckpoint | undefined;
}

/** The interval of full recovery: Young's `sqrt(2 * saveSeconds * mtbfSeconds)`. @category Recommendation */
export function youngIntervalSeconds(saveSeconds: number, mtbfSeconds: number): number {
  checkNumber(saveSeconds, 'youngIntervalSeconds: saveSeconds', 0, Number.MAX_VALUE);
  checkNumber(mtbfSeconds, 'youngIntervalSeconds: mtbfSeconds', 0, Number.MAX_VALUE, { loOpen: true });
  return Math.sqrt(2 * saveSeconds * mtbfSeconds);
}

/**
 * CPR's interval for partial recovery: the longest interval whose expected portion of lost
 * samples, `interval / (2 * shards * mtbfSeconds)`, stays at `lostFraction`, i.e.
 * `2 * lostFraction * shards * mtbfSeconds` (ALGORITHMS.md section 7). Never shorter than Young's.
 *
 * @category Recommendation
 */
export function cprIntervalSeconds(options: { saveSeconds: number; mtbfSeconds: number; shards: number; lostFraction: number }): number {
  checkOptions(options, ['saveSeconds', 'mtbfSeconds', 'shards', 'lostFraction'], 'cprIntervalSeconds(options)');
  const young = youngIntervalSeconds(options.saveSeconds, options.mtbfSeconds);
  const shards = checkInteger(options.shards, 'cprIntervalSeconds: shards', 1, 1 << 24);
  const pls = checkNumber(options.lostFraction, 'cprIntervalSeconds: lostFraction', 0, 1, { loOpen: true });
  return Math.max(young, 2 * pls * shards * options.mtbfSeconds);
}

/** Expected overhead of a policy as a fraction of training time (ALGORITHMS.md section 7). @category Recommendation */
export function expectedOverhead(options: { intervalSeconds: number; saveSeconds: number; loadSeconds: number; mtbfSeconds: number; partial: boolean }): number {
  checkOptions(options, ['intervalSeconds', 'saveSeconds', 'loadSeconds', 'mtbfSeconds', 'partial'], 'expectedOverhead(options)');
  checkBoolean(options.partial, 'expectedOverhead: partial');
  const { intervalSeconds: t, saveSeconds: o, loadSeconds: l, mtbfSeconds: f } = options;
  checkNumber(t, 'expectedOverhead: intervalSeconds', 0, Number.MAX_VALUE, { loOpen: true });
  checkNumber(o, 'expectedOverhead: saveSeconds', 0, Number.MAX_VALUE);
  checkNumber(l, 'expectedOverhead: loadSeconds', 0, Number.MAX_VALUE);
  checkNumber(f, 'expectedOverhead: mtbfSeconds', 0, Number.MAX_VALUE, { loOpen: true });
  return o / t + (l + (options.partial ? 0 : t / 2)) / f;
}

const HANDOFF_FILE = (rank: number): string => `rank-${rank}.handoff`;

/**
 * Saves and recovers a ClickModel under a CPR policy. `create` resumes (see CprResume), then the
 * loop calls `afterStep()` after every `model.trainStep()`, and `handOff()` when it learns that a
 * peer was lost (partial policies), before exiting.
 *
 * @category Recommendation
 */
export class CprCheckpointer {
  private writing: Promise<SavedCheckpoint> | undefined;
  private busy = false;
  private handedOff = false;
  private good: DataParallelTrainerState | undefined;
  private readonly stats: CprStats = { fullSaves: 0, prioritySaves: 0, prioritySkipped: 0, priorityRows: 0, saveMs: 0, lastSaved: undefined };
  /** ssu: the tracked rows, per table (a mark per owned row). */
  private readonly sampled: Uint8Array[];
  /** Per owned row, the embedding's update count when the row was last written to a save. */
  private readonly savedAt: Uint32Array[];
  private readonly sample: () => number;
  readonly priorityEvery: number;

  private constructor(
    readonly model: ClickModel,
    readonly options: Required<Omit<CprOptions, 'handoffDir'>> & Pick<CprOptions, 'handoffDir'>,
    readonly resumed: CprResume,
  ) {
    const e = model.embedding;
    this.sampled = e.tables.map((_, t) => new Uint8Array(e.ownedRows(t)));
    this.savedAt = e.tables.map((_, t) => new Uint32Array(e.ownedRows(t)));
    this.sample = seededRandom((options.seed * 7919 + e.rank) >>> 0);
    this.priorityEvery = Math.max(1, Math.round(options.saveEvery * options.priorityFraction));
  }

  /** Resumes `model` (fresh from create()) from `dir` under the policy, then returns the checkpointer. Every rank calls it. */
  static async create(model: ClickModel, options: CprOptions): Promise<CprCheckpointer> {
    if (!(model instanceof ClickModel)) throw new InvalidArgumentError(`CprCheckpointer.create: model must be a ClickModel, got ${describeValue(model)}`);
    if (model.disposed) throw new DisposedError('CprCheckpointer.create: the model was disposed');
    checkOptions(options, CPR_OPTION_KEYS, 'CprCheckpointer.create(model, options)');
    checkOneOf(options.policy, 'CprCheckpointer: policy', RECOVERY_POLICIES);
    if (typeof options.dir !== 'string' || options.dir === '') throw new InvalidArgumentError('CprCheckpointer: dir must be a directory path');
    const full: CprCheckpointer['options'] = {
      dir: options.dir,
      policy: options.policy,
      saveEvery: checkInteger(options.saveEvery, 'CprCheckpointer: saveEvery', 1, 2 ** 31 - 1),
      priorityFraction: checkNumber(options.priorityFraction ?? 0.125, 'CprCheckpointer: priorityFraction', 0, 1, { loOpen: true }),
      ssuSampleRate: checkNumber(options.ssuSampleRate ?? 0.125, 'CprCheckpointer: ssuSampleRate', 0, 1, { loOpen: true }),
      seed: checkInteger(options.seed ?? 0, 'CprCheckpointer: seed', 0, 0xffffffff),
      handoffDir: options.handoffDir,
    };
    if (full.handoffDir !== undefined && (typeof full.handoffDir !== 'string' || full.handoffDir === ''))
      throw new InvalidArgumentError(`CprCheckpointer: handoffDir must be a directory path, got ${describeValue(full.handoffDir)}`);
    if (full.policy !== 'full' && typeof full.handoffDir !== 'string')
      throw new InvalidArgumentError(`CprCheckpointer: policy '${full.policy}' recovers partially and needs handoffDir (e.g. a directory on /dev/shm)`);
    const start = performance.now();
    const resumed = full.policy === 'full' ? { resume: await resumeFull(model, full.dir) } : await resumePartial(model, full.dir, full.handoffDir!);
    const cpr = new CprCheckpointer(model, full, resumed.resume);
    // A survivor's successor goes on with the survivor's tracking.
    if (resumed.tracking) {
      resumed.tracking.savedAt.forEach((a, t) => cpr.savedAt[t]!.set(a));
      resumed.tracking.sampled.forEach((a, t) => cpr.sampled[t]!.set(a));
    }
    resumed.resume.ms = performance.now() - start;
    cpr.good = await model.trainer.exportState();
    // Priority saves need a full save before them to rebuild a shard from: a fresh start saves
    // the initial state.
    if (resumed.resume.kind === 'fresh' && (full.policy === 'mfu' || full.policy === 'ssu')) await cpr.save('full');
    return cpr;
  }

  get costSoFar(): Readonly<CprStats> {
    return { ...this.stats };
  }

  /** Rows a priority save writes per table. */
  private priorityRows(t: number): number {
    return Math.max(1, Math.round(this.model.embedding.ownedRows(t) * this.options.priorityFraction));
  }

  /**
   * After each trainStep(): records the state a survivor would hand off, tracks the updated rows
   * (ssu) and saves when a save is due. Resolves with what it saved.
   */
  async afterStep(): Promise<'full' | 'priority' | null> {
    const { model, options } = this;
    const e = model.embedding;
    if (options.policy === 'ssu')
      for (let i = 0; i < e.touchedCount; i++) if (this.sample() < options.ssuSampleRate) this.sampled[e.touched[2 * i]!]![e.touched[2 * i + 1]!] = 1;
    // A copy of the MLP's state after every complete step (small): a survivor hands off this one,
    // never a state torn by a failure in the middle of an update.
    if (options.policy !== 'full') this.good = await model.trainer.exportState(this.good);
    const step = model.trainer.stepCalls;
    let kind: 'full' | 'priority' | null = null;
    if (step % options.saveEvery === 0) kind = 'full';
    else if ((options.policy === 'mfu' || options.policy === 'ssu') && (step % options.saveEvery) % this.priorityEvery === 0) kind = 'priority';
    if (kind === null) return null;
    // A priority save never waits for the previous file: while it is still being written the
    // rows stay marked and go with the next one.
    if (kind === 'priority' && this.busy) {
      this.stats.prioritySkipped++;
      return null;
    }
    await this.save(kind);
    return kind;
  }

  /**
   * Saves now (every rank at the same step): a full save, or a priority save (mfu, ssu). Resolves
   * once the snapshot is taken; the file is written in the background (close() waits for it).
   */
  async save(kind: 'full' | 'priority'): Promise<void> {
    const { model, options } = this;
    checkOneOf(kind, 'CprCheckpointer.save(kind)', ['full', 'priority'] as const);
    if (kind === 'priority' && options.policy !== 'mfu' && options.policy !== 'ssu')
      throw new InvalidArgumentError(`CprCheckpointer.save: priority saves belong to the mfu and ssu policies, this one is '${options.policy}'`);
    const start = performance.now();
    await this.writing; // one file at a time
    const tensors = kind === 'full' ? this.fullShard() : this.priorityShard();
    const keep = options.policy === 'mfu' || options.policy === 'ssu' ? Math.ceil(options.saveEvery / this.priorityEvery) + 2 : 2;
    const save = await saveCheckpoint(model.trainer, { dir: options.dir, keep, extra: { cpr: kind, policy: options.policy }, tensors });
    this.stats.saveMs += performance.now() - start;
    if (kind === 'full') this.stats.fullSaves++;
    else this.stats.prioritySaves++;
    this.busy = true;
    this.writing = save.written.then((saved) => (this.stats.lastSaved = saved)).finally(() => (this.busy = false));
    this.writing.catch(() => undefined); // surfaced by the next save or close()
  }

  /**
   * Row updates this shard holds that no save has captured: for each owned row, its updates since
   * it was last written to a save. What a failure of this rank would lose under partial recovery.
   */
  unsavedUpdates(): number {
    const e = this.model.embedding;
    let n = 0;
    e.updates.forEach((u, t) => {
      const at = this.savedAt[t]!;
      for (let r = 0; r < u.length; r++) n += (u[r]! - at[r]!) >>> 0;
    });
    return n;
  }

  /** Every owned row of every table (copies); every row counts as saved, every mark is cleared. */
  private fullShard(): Map<string, SafetensorsTensor> {
    const e = this.model.embedding;
    const out = new Map<string, SafetensorsTensor>();
    e.rows.forEach((rows, t) => out.set(`embedding/${t}`, { shape: [e.ownedRows(t), e.dim], data: rows.slice() }));
    e.updates.forEach((u, t) => this.savedAt[t]!.set(u));
    for (const s of this.sampled) s.fill(0);
    return out;
  }

  /** mfu: the most updated rows since their last save; ssu: the sampled rows. Their marks are cleared. */
  private priorityShard(): Map<string, SafetensorsTensor> {
    const e = this.model.embedding;
    const out = new Map<string, SafetensorsTensor>();
    e.rows.forEach((rows, t) => {
      const cap = this.priorityRows(t);
      let chosen: number[];
      const u = e.updates[t]!;
      const at = this.savedAt[t]!;
      if (this.options.policy === 'mfu') {
        const since = new Uint32Array(u.length);
        for (let r = 0; r < u.length; r++) since[r] = (u[r]! - at[r]!) >>> 0;
        chosen = topCounts(since, cap);
      } else {
        const marks = this.sampled[t]!;
        chosen = [];
        for (let r = 0; r < marks.length && chosen.length < cap; r++) if (marks[r]) chosen.push(r);
        for (const r of chosen) marks[r] = 0;
      }
      for (const r of chosen) at[r] = u[r]!;
      const ids = Int32Array.from(chosen);
      const values = new Float32Array(ids.length * e.dim);
      ids.forEach((r, i) => values.set(rows.subarray(r * e.dim, (r + 1) * e.dim), i * e.dim));
      out.set(`embedding/${t}/rows`, { shape: [ids.length], data: ids });
      out.set(`embedding/${t}/values`, { shape: [ids.length, e.dim], data: values });
      this.stats.priorityRows += ids.length;
    });
    return out;
  }

  /**
   * A survivor's hand-off: writes its state after its last complete step (the MLP's trainer state,
   * its embedding shard, update counts and save tracking) to `handoffDir`, for the process that
   * takes its place after the launcher's restart. Synchronous, so it completes before the process
   * exits (it may run in a SIGTERM handler); a second call does nothing.
   */
  handOff(): void {
    const { handoffDir } = this.options;
    if (handoffDir === undefined || this.good === undefined || this.handedOff) return;
    this.handedOff = true;
    const e = this.model.embedding;
    const state = this.good;
    const tensors = new Map<string, SafetensorsTensor>();
    tensors.set('weights', { shape: [state.weights.length], data: state.weights });
    for (const [name, data] of Object.entries(state.optimizer.buffers)) if (data) tensors.set(`optimizer/${name}`, { shape: [data.length], data });
    e.rows.forEach((rows, t) => tensors.set(`embedding/${t}`, { shape: [rows.length], data: rows }));
    const asInt = (u: Uint32Array): Int32Array => new Int32Array(u.buffer, u.byteOffset, u.length);
    e.updates.forEach((u, t) => tensors.set(`updates/${t}`, { shape: [u.length], data: asInt(u) }));
    this.savedAt.forEach((u, t) => tensors.set(`savedAt/${t}`, { shape: [u.length], data: asInt(u) }));
    this.sampled.forEach((m, t) => tensors.set(`sampled/${t}`, { shape: [m.length], data: Int32Array.from(m) }));
    const meta: HandoffMeta = { calls: state.calls, step: state.optimizer.step, skippedSteps: state.optimizer.skippedSteps, lr: state.optimizer.lr };
    const chunks = encodeSafetensors(tensors, { rank: String(e.rank), worldSize: String(e.size), state: JSON.stringify(meta) });
    const path = join(handoffDir, HANDOFF_FILE(e.rank));
    try {
      mkdirSync(handoffDir, { recursive: true });
      writeFileSync(`${path}.tmp`, Buffer.concat(chunks));
      renameSync(`${path}.tmp`, path);
    } catch (error) {
      throw new CheckpointError(`CprCheckpointer.handOff: cannot write ${path} (${(error as Error).message})`, { reason: 'missing', cause: error });
    }
  }

  /** Waits for the file being written (rejects with its error). */
  async close(): Promise<void> {
    await this.writing;
  }
}

/** The indices of the `cap` largest non-zero counts (ties to the lower index), ascending. */
function topCounts(counts: Uint32Array, cap: number): number[] {
  const nonZero: number[] = [];
  for (let r = 0; r < counts.length; r++) if (counts[r]! > 0) nonZero.push(r);
  if (nonZero.length > cap) nonZero.sort((a, b) => counts[b]! - counts[a]! || a - b).length = cap;
  return nonZero.sort((a, b) => a - b);
}

/** Full recovery: every rank loads the newest complete checkpoint (trainer and shard). */
async function resumeFull(model: ClickModel, dir: string): Promise<CprResume> {
  const loaded = await loadCheckpoint(model.trainer, { dir });
  // This rank's saves past the step every rank goes back to belong to a timeline rolled back:
  // they must never enter a later recovery's chain.
  await forgetSavesAfter(dir, model.embedding.rank, loaded?.step ?? -1);
  if (loaded === null) return { step: 0, kind: 'fresh', reloaded: [], reloadedFrom: [], ms: 0 };
  // The newest complete step of mfu or ssu may be a priority save: the shard is its chain, up to that step.
  if ((loaded.extra as { cpr?: string } | null)?.cpr === 'priority') await reloadShard(model, dir, loaded.step);
  else applyFullShard(model, loaded.tensors, loaded.path);
  return { step: loaded.step, kind: 'full', reloaded: [], reloadedFrom: [], ms: 0 };
}

/** Withdraws `rank`'s saves (they count as unfinished) of the steps after `step`. */
async function forgetSavesAfter(dir: string, rank: number, step: number): Promise<void> {
  for (const s of await rankCheckpointSteps(dir, rank).catch(() => [] as number[])) {
    if (s <= step) break;
    await retractRankSave(dir, s, rank);
  }
}

function applyFullShard(model: ClickModel, tensors: Map<string, SafetensorsTensor>, path: string): void {
  const e = model.embedding;
  e.rows.forEach((rows, t) => {
    const data = tensors.get(`embedding/${t}`)?.data;
    if (!(data instanceof Float32Array) || data.length !== rows.length)
      throw new CheckpointError(`${path}: embedding/${t} is missing or does not fit this shard (${rows.length} values)`, { reason: 'mismatch' });
    rows.set(data);
  });
}

/** The counters of a hand-off (JSON in its metadata): exact, whatever their size. */
interface HandoffMeta {
  calls: number;
  step: number;
  skippedSteps: number;
  lr: number;
}

/** A survivor's hand-off, checked against this rank's model. */
interface Handoff {
  path: string;
  meta: HandoffMeta;
  tensors: Map<string, SafetensorsTensor>;
}

/**
 * This rank's hand-off, if a predecessor left one that fits this model (every tensor's size
 * checked here, so that nothing fails later on one rank only); anything else counts as none.
 */
function takeHandoff(model: ClickModel, handoffDir: string, template: DataParallelTrainerState): Handoff | undefined {
  const e = model.embedding;
  const path = join(handoffDir, HANDOFF_FILE(e.rank));
  try {
    const { tensors, metadata } = decodeSafetensors(readFileSync(path), path);
    if (metadata.rank !== String(e.rank) || metadata.worldSize !== String(e.size)) return undefined;
    const meta = JSON.parse(metadata.state ?? '') as HandoffMeta;
    const counts = [meta.calls, meta.step, meta.skippedSteps];
    if (!counts.every((n) => Number.isSafeInteger(n) && n >= 0 && n < 2 ** 48) || typeof meta.lr !== 'number' || !Number.isFinite(meta.lr)) return undefined;
    const fits = (name: string, length: number, type: typeof Float32Array | typeof Int32Array): boolean => {
      const t = tensors.get(name);
      return t !== undefined && t.data instanceof type && t.data.length === length;
    };
    if (!fits('weights', template.weights.length, Float32Array)) return undefined;
    for (const [name, data] of Object.entries(template.optimizer.buffers)) if (data && !fits(`optimizer/${name}`, data.length, Float32Array)) return undefined;
    for (let t = 0; t < e.tables.length; t++) {
      const owned = e.ownedRows(t);
      if (!fits(`embedding/${t}`, owned * e.dim, Float32Array) || !fits(`updates/${t}`, owned, Int32Array) || !fits(`savedAt/${t}`, owned, Int32Array) || !fits(`sampled/${t}`, owned, Int32Array))
        return undefined;
    }
    return { path, meta, tensors };
  } catch {
    return undefined; // none, unreadable or foreign: this rank is recovered from disk
  }
}

/** What partial recovery hands the new checkpointer: how it resumed, and a survivor's save tracking. */
interface PartialResume {
  resume: CprResume;
  tracking?: { savedAt: Uint32Array[]; sampled: Uint8Array[] };
}

/** Exact integers through a float collective: two 24-bit halves (past 2^48, refused earlier). */
const HALF = 2 ** 24;

/**
 * Partial recovery. Survivors (ranks with a fitting hand-off) keep their shard; the MLP, its
 * optimizer state and the step come from the survivor furthest ahead; each rank without a
 * hand-off reloads its shard from its own newest full save plus the priority saves after it.
 * With no survivor at all, full recovery. Every rank runs the same collectives whatever happens
 * locally: a local failure travels in the last all-gather and every rank throws. A hand-off is
 * deleted only once the recovery succeeded everywhere.
 */
async function resumePartial(model: ClickModel, dir: string, handoffDir: string): Promise<PartialResume> {
  const { comm, trainer, embedding: e } = model;
  const template = await trainer.exportState();
  const mine = takeHandoff(model, handoffDir, template);
  const FIELDS = 3; // has a hand-off, calls (high, low)
  const local = FlatBuffer.allocate(FIELDS);
  const all = FlatBuffer.allocate(FIELDS * comm.size);
  try {
    if (mine) local.array.set([1, Math.floor(mine.meta.calls / HALF), mine.meta.calls % HALF]);
    await comm.allgather(local, all);
    const v = all.array;
    const callsOf = (r: number): number => v[r * FIELDS + 1]! * HALF + v[r * FIELDS + 2]!;
    let donor = -1;
    for (let r = 0; r < comm.size; r++) if (v[r * FIELDS] === 1 && (donor < 0 || callsOf(r) > callsOf(donor))) donor = r;
    if (donor < 0) return { resume: await resumeFull(model, dir) };

    // The donor's counters (JSON bytes, exact), then every float array of the MLP's state.
    const text = comm.rank === donor ? Buffer.from(JSON.stringify(mine!.meta)) : Buffer.alloc(0);
    const length = FlatBuffer.from([text.length]);
    let meta: HandoffMeta;
    try {
      await comm.broadcast(length, donor);
      const bytes = FlatBuffer.allocate(length.array[0]!);
      try {
        if (comm.rank === donor) bytes.array.set(text);
        await comm.broadcast(bytes, donor);
        meta = JSON.parse(Buffer.from(Uint8Array.from(bytes.array)).toString()) as HandoffMeta;
      } finally {
        bytes.dispose();
      }
    } finally {
      length.dispose();
    }
    const arrays: Array<[string, Float32Array]> = [['weights', template.weights]];
    for (const [name, data] of Object.entries(template.optimizer.buffers).sort(([a], [b]) => a.localeCompare(b))) if (data) arrays.push([`optimizer/${name}`, data]);
    for (const [name, target] of arrays) {
      const buffer = FlatBuffer.allocate(target.length);
      try {
        if (comm.rank === donor) buffer.array.set(mine!.tensors.get(name)!.data as Float32Array);
        await comm.broadcast(buffer, donor);
        target.set(buffer.array);
      } finally {
        buffer.dispose();
      }
    }

    // The local part: import the MLP, then this rank's shard from its hand-off or from disk.
    let failure: unknown;
    let from = -1;
    let tracking: PartialResume['tracking'];
    try {
      trainer.importState({ ...template, calls: meta.calls, optimizer: { ...template.optimizer, step: meta.step, skippedSteps: meta.skippedSteps, lr: meta.lr } });
      if (mine) {
        const asU32 = (name: string): Uint32Array => {
          const d = mine.tensors.get(name)!.data as Int32Array;
          return new Uint32Array(d.buffer, d.byteOffset, d.length);
        };
        e.rows.forEach((rows, t) => {
          rows.set(mine.tensors.get(`embedding/${t}`)!.data as Float32Array);
          e.updates[t]!.set(asU32(`updates/${t}`));
        });
        tracking = {
          savedAt: e.tables.map((_, t) => asU32(`savedAt/${t}`).slice()),
          sampled: e.tables.map((_, t) => Uint8Array.from(mine.tensors.get(`sampled/${t}`)!.data as Int32Array)),
        };
        from = mine.meta.calls;
      } else from = await reloadShard(model, dir);
    } catch (error) {
      failure = error;
    }
    // [ok, step the shard came back from (high, low; -1: none)] of every rank.
    const done = FlatBuffer.from([failure === undefined ? 1 : 0, from < 0 ? -1 : Math.floor(from / HALF), from < 0 ? 0 : from % HALF]);
    const doneAll = FlatBuffer.allocate(3 * comm.size);
    try {
      await comm.allgather(done, doneAll);
      if (failure !== undefined) throw failure;
      const d = doneAll.array;
      const failed = Array.from({ length: comm.size }, (_, r) => r).filter((r) => d[3 * r] !== 1);
      if (failed.length > 0) throw new CheckpointError(`partial recovery failed on rank(s) ${failed.join(', ')} (see their error); the hand-offs are kept for the next attempt`, { reason: 'missing' });
      const reloaded = Array.from({ length: comm.size }, (_, r) => r).filter((r) => v[r * FIELDS] !== 1);
      const reloadedFrom = reloaded.map((r) => (d[3 * r + 1]! < 0 ? -1 : d[3 * r + 1]! * HALF + d[3 * r + 2]!));
      if (mine) rmSync(mine.path, { force: true });
      return { resume: { step: meta.calls, kind: 'partial', reloaded, reloadedFrom, ms: 0 }, ...(tracking && { tracking }) };
    } finally {
      done.dispose();
      doneAll.dispose();
    }
  } finally {
    local.dispose();
    all.dispose();
  }
}

/**
 * A lost rank's shard from its newest full save and the priority saves after it (none past
 * `maxStep`); resolves with the newest step applied, -1 if this rank never saved. Priority saves
 * without a full save before them are a CheckpointError (the shard cannot be rebuilt).
 */
async function reloadShard(model: ClickModel, dir: string, maxStep = Number.MAX_SAFE_INTEGER): Promise<number> {
  const e = model.embedding;
  const steps = (await rankCheckpointSteps(dir, e.rank)).filter((s) => s <= maxStep);
  const deltas: number[] = [];
  for (const step of steps) {
    const file = await readRankCheckpoint(dir, e.rank, step);
    if (file === null) continue;
    const kind = (file.extra as { cpr?: string } | null)?.cpr;
    if (kind === 'priority') {
      deltas.push(step);
      continue;
    }
    applyFullShard(model, file.tensors, file.path);
    // The priority saves after it, oldest first.
    for (const d of deltas.reverse()) {
      const delta = await readRankCheckpoint(dir, e.rank, d);
      if (delta === null) continue;
      e.rows.forEach((rows, t) => {
        const ids = delta.tensors.get(`embedding/${t}/rows`)?.data;
        const values = delta.tensors.get(`embedding/${t}/values`)?.data;
        if (!(ids instanceof Int32Array) || !(values instanceof Float32Array) || values.length !== ids.length * e.dim)
          throw new CheckpointError(`${delta.path}: embedding/${t}'s priority rows are missing or malformed`, { reason: 'corrupt' });
        ids.forEach((r, i) => {
          if (r < 0 || (r + 1) * e.dim > rows.length) throw new CheckpointError(`${delta.path}: row ${r} is outside the shard`, { reason: 'corrupt' });
          rows.set(values.subarray(i * e.dim, (i + 1) * e.dim), r * e.dim);
        });
      });
    }
    return deltas.length > 0 ? deltas[deltas.length - 1]! : step;
  }
  if (deltas.length > 0)
    throw new CheckpointError(`${dir}: rank ${e.rank} has priority saves (steps ${deltas.join(', ')}) but no full save before them; its shard cannot be rebuilt`, { reason: 'missing' });
  return -1;
}
