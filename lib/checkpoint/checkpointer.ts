/**
 * A training loop's checkpoints: resume from the newest checkpoint that verifies when created, then
 * save every N steps or on Young's interval (docs/ALGORITHMS.md section 7) from the measured cost
 * of a save and the mean time between failures the caller gives. It drives saveCheckpoint and
 * loadCheckpoint; the loop calls `afterStep()` after each `trainer.step()`.
 */
import type { LrScheduler } from '../optim/lr-schedule.js';
import { performance } from 'node:perf_hooks';

import type { DataParallelTrainer } from '../dataparallel/trainer.js';
import { InvalidArgumentError } from '../errors.js';
import { checkInteger, checkNumber, checkObject, checkOptions, optionKeys } from '../validate.js';
import { checkDirectory, probeWritable } from './store.js';
import { checkTrainer, loadCheckpoint, saveCheckpoint, type LoadedCheckpoint, type SavedCheckpoint } from './trainer.js';

/** Options of {@link Checkpointer.create}: `every` or `interval`, not both. @category Checkpoints */
export interface CheckpointerOptions {
  /** The checkpoint directory, the same on every rank. */
  dir: string;
  /** Save after every `every`-th step (counted in trainer.step() calls). */
  every?: number;
  /**
   * Save on Young's interval `sqrt(2 * C * mtbfSeconds)`, C the measured cost of a save on the
   * training thread (its snapshot; the first save, after the first step, measures it).
   */
  interval?: { mtbfSeconds: number };
  /** Complete checkpoints to keep. Default 2. */
  keep?: number;
  /** A learning-rate scheduler whose position every save keeps (loadCheckpoint's `scheduler` continues it). */
  scheduler?: LrScheduler;
}
const CHECKPOINTER_OPTION_KEYS = optionKeys<CheckpointerOptions>({ dir: true, every: true, interval: true, keep: true, scheduler: true });

/** What the checkpoints have cost so far. @category Checkpoints */
export interface CheckpointerStats {
  saves: number;
  /** The training thread's time in snapshots, ms. */
  snapshotMs: number;
  /** The interval Young's rule gives now, ms (interval policy, after the first save). */
  intervalMs: number | undefined;
  lastSaved: SavedCheckpoint | undefined;
}

/**
 * Checkpoints a DataParallelTrainer as it trains: `await Checkpointer.create(trainer, { dir,
 * every })` resumes from the newest checkpoint in `dir` that verifies (`resumed` says from which step
 * and with what `extra`), `await checkpointer.afterStep(extra)` after each step saves when one is
 * due, and `close()` waits for the last file. One save is written at a time: a due save waits for
 * the previous file first. With `every`, the ranks save at the same steps. The interval policy
 * decides on each rank's clock, so ranks may disagree at a boundary: a step counts only once every
 * rank saved it, so that costs a wasted file, never a wrong checkpoint; to decide once, pass rank
 * 0's verdict to every rank as `due`.
 *
 * @category Checkpoints
 */
export class Checkpointer {
  private sinceSaveStart = performance.now();
  private writing: Promise<SavedCheckpoint> | undefined;
  private costs: number[] = [];
  private readonly stats: CheckpointerStats = { saves: 0, snapshotMs: 0, intervalMs: undefined, lastSaved: undefined };
  private closed = false;

  private constructor(
    readonly trainer: DataParallelTrainer,
    private readonly options: Required<Pick<CheckpointerOptions, 'dir' | 'keep'>> & Pick<CheckpointerOptions, 'every' | 'interval' | 'scheduler'>,
    /** The checkpoint training resumed from, or null on a first run. */
    readonly resumed: LoadedCheckpoint | null,
  ) {}

  /**
   * Checks the options, that files can be written in `dir` (a CheckpointError naming it and the OS
   * error if not: refused now rather than at the first save), and resumes from the newest
   * checkpoint there that verifies (loadCheckpoint).
   */
  static async create(trainer: DataParallelTrainer, options: CheckpointerOptions): Promise<Checkpointer> {
    checkTrainer(trainer, 'Checkpointer.create');
    checkOptions(options, CHECKPOINTER_OPTION_KEYS, 'Checkpointer.create(trainer, options)');
    if ((options.every === undefined) === (options.interval === undefined))
      throw new InvalidArgumentError('Checkpointer.create: give every (steps) or interval ({ mtbfSeconds }), one of them');
    if (options.every !== undefined) checkInteger(options.every, 'Checkpointer: every', 1, 2 ** 31 - 1);
    if (options.interval !== undefined) {
      checkObject(options.interval, 'Checkpointer: interval');
      checkOptions(options.interval, ['mtbfSeconds'], 'Checkpointer: interval');
      checkNumber(options.interval.mtbfSeconds, 'Checkpointer: interval.mtbfSeconds', 0, Number.MAX_VALUE, { loOpen: true });
    }
    const keep = checkInteger(options.keep ?? 2, 'Checkpointer: keep', 1, 1 << 20);
    const scheduler = options.scheduler === undefined ? {} : { scheduler: options.scheduler };
    const dir = await checkDirectory(options.dir, 'Checkpointer.create');
    await probeWritable(dir);
    const resumed = await loadCheckpoint(trainer, { dir, ...scheduler });
    return new Checkpointer(trainer, { dir: options.dir, keep, every: options.every, interval: options.interval, ...scheduler }, resumed);
  }

  /** Young's interval from the measured save cost, ms; undefined before the first save. */
  static youngIntervalMs(saveCostMs: number, mtbfSeconds: number): number {
    checkNumber(saveCostMs, 'youngIntervalMs: saveCostMs', 0, Number.MAX_VALUE);
    checkNumber(mtbfSeconds, 'youngIntervalMs: mtbfSeconds', 0, Number.MAX_VALUE, { loOpen: true });
    return Math.sqrt(2 * saveCostMs * mtbfSeconds * 1000);
  }

  /**
   * Call after each trainer.step(): saves this rank's checkpoint when one is due, with `extra`
   * (the loop's own position: epoch, batch, seeds), and resolves with whether it did. `due`
   * overrides the policy (see the class comment).
   */
  async afterStep(extra?: unknown, due?: boolean): Promise<boolean> {
    if (this.closed) throw new InvalidArgumentError('Checkpointer.afterStep: the checkpointer was closed');
    if (due !== undefined && typeof due !== 'boolean') throw new InvalidArgumentError('Checkpointer.afterStep: due must be a boolean or left out');
    const step = this.trainer.stepCalls;
    let save: boolean;
    if (due !== undefined) save = due;
    else if (this.options.every !== undefined) save = step % this.options.every === 0;
    else save = this.intervalDue();
    if (!save) return false;
    await this.writing; // one file at a time
    const started = await saveCheckpoint(this.trainer, {
      dir: this.options.dir,
      keep: this.options.keep,
      extra,
      ...(this.options.scheduler === undefined ? {} : { scheduler: this.options.scheduler }),
    });
    this.sinceSaveStart = performance.now();
    this.costs.push(started.snapshotMs);
    this.stats.saves++;
    this.stats.snapshotMs += started.snapshotMs;
    this.writing = started.written.then((saved) => (this.stats.lastSaved = saved));
    this.writing.catch(() => undefined); // surfaced by the next save or close()
    return true;
  }

  /** Whether Young's interval has passed since the last save (the first save is due at once: it measures the cost). */
  private intervalDue(): boolean {
    if (this.costs.length === 0) return true;
    // The cost of a save: the median snapshot after the first (which fills fresh pages).
    const warm = this.costs.length > 1 ? this.costs.slice(1) : this.costs;
    const cost = [...warm].sort((a, b) => a - b)[warm.length >> 1]!;
    this.stats.intervalMs = Checkpointer.youngIntervalMs(cost, this.options.interval!.mtbfSeconds);
    return performance.now() - this.sinceSaveStart >= this.stats.intervalMs;
  }

  /** Saves so far and what they cost. */
  get costSoFar(): Readonly<CheckpointerStats> {
    return { ...this.stats };
  }

  /** Waits for the file being written (rejects with its error); later afterStep() calls are refused. */
  async close(): Promise<void> {
    this.closed = true;
    await this.writing;
  }
}
