/**
 * Learning-rate schedules, applied between steps as PyTorch's LRScheduler does: a schedule is a
 * factor of the base learning rate as a function of the scheduler's step count t (0 before the
 * first scheduler.step()), and `LrScheduler.step()` sets `lr = baseLr * factor(t)` on its target
 * (an optimizer, or the optimizer of a DataParallelTrainer). Schedules compose: `sequential`
 * switches between them at milestones (warm-up then cosine), `product` multiplies them.
 */
import { InvalidArgumentError } from '../errors.js';
import { checkFunction, checkInteger, checkNumber, checkObject, checkOptions, describeValue, optionKeys } from '../validate.js';

/** A learning-rate factor as a function of the scheduler's step count t (t = 0, 1, 2, ...). @category Optimizers */
export type LrSchedule = (t: number) => number;

/** Anything whose learning rate can be set between steps: an optimizer, a DataParallelTrainer. @category Optimizers */
export type LrTarget = { lr: number } | { readonly optimizer: { lr: number } };

/** Linear warm-up over `steps` steps from `startFactor` (default 0.1) to 1, then 1 (torch's LinearLR). @category Optimizers */
export function linearWarmup(steps: number, startFactor = 0.1): LrSchedule {
  checkInteger(steps, 'linearWarmup(steps)', 1, Number.MAX_SAFE_INTEGER);
  checkNumber(startFactor, 'linearWarmup(steps, startFactor)', 0, 1);
  return (t) => (t >= steps ? 1 : startFactor + ((1 - startFactor) * t) / steps);
}

/** Cosine annealing from 1 to `minFactor` (default 0) over `steps` steps, then `minFactor` (torch's CosineAnnealingLR, one half period). @category Optimizers */
export function cosineDecay(steps: number, minFactor = 0): LrSchedule {
  checkInteger(steps, 'cosineDecay(steps)', 1, Number.MAX_SAFE_INTEGER);
  checkNumber(minFactor, 'cosineDecay(steps, minFactor)', 0, 1);
  return (t) => (t >= steps ? minFactor : minFactor + ((1 - minFactor) * (1 + Math.cos((Math.PI * t) / steps))) / 2);
}

/** Multiply by `gamma` every `stepSize` steps (torch's StepLR). @category Optimizers */
export function stepDecay(stepSize: number, gamma = 0.1): LrSchedule {
  checkInteger(stepSize, 'stepDecay(stepSize)', 1, Number.MAX_SAFE_INTEGER);
  checkNumber(gamma, 'stepDecay(stepSize, gamma)', 0, Number.MAX_VALUE);
  return (t) => gamma ** Math.floor(t / stepSize);
}

/**
 * `schedules[0]` until `milestones[0]`, then `schedules[1]` (counting its steps from the milestone),
 * and so on (torch's SequentialLR): `sequential([linearWarmup(500), cosineDecay(9500)], [500])`.
 *
 * @category Optimizers
 */
export function sequential(schedules: readonly LrSchedule[], milestones: readonly number[]): LrSchedule {
  if (!Array.isArray(schedules) || schedules.length === 0)
    throw new InvalidArgumentError(`sequential(schedules, milestones): schedules must be a non-empty array, got ${describeValue(schedules)}`);
  schedules.forEach((s, i) => checkFunction(s, `sequential: schedules[${i}]`));
  if (!Array.isArray(milestones) || milestones.length !== schedules.length - 1)
    throw new InvalidArgumentError(`sequential: give one milestone fewer than schedules (${schedules.length - 1}), got ${describeValue(milestones)}`);
  milestones.forEach((m, i) => checkInteger(m, `sequential: milestones[${i}]`, i === 0 ? 1 : milestones[i - 1]! + 1, Number.MAX_SAFE_INTEGER));
  return (t) => {
    let i = 0;
    while (i < milestones.length && t >= milestones[i]!) i++;
    return schedules[i]!(i === 0 ? t : t - milestones[i - 1]!);
  };
}

/** The product of several schedules' factors (e.g. a step decay under a warm-up). @category Optimizers */
export function product(...schedules: LrSchedule[]): LrSchedule {
  schedules.forEach((s, i) => checkFunction(s, `product: schedules[${i}]`));
  return (t) => schedules.reduce((f, s) => f * s(t), 1);
}

/** Where an {@link LrScheduler} stands: what a checkpoint keeps of it. @category Optimizers */
export interface LrSchedulerState {
  /** Scheduler steps taken. */
  step: number;
  /** The learning rate the factors multiply. */
  baseLr: number;
}

/** Options of {@link LrScheduler}. @category Optimizers */
export interface LrSchedulerOptions {
  /** The learning rate the factors multiply. Default: the target's lr when the scheduler is made. */
  baseLr?: number;
}
const SCHEDULER_OPTION_KEYS = optionKeys<LrSchedulerOptions>({ baseLr: true });

/**
 * Applies a schedule to an optimizer or trainer: sets lr = baseLr * schedule(0) at once, and
 * lr = baseLr * schedule(t) at the t-th step(). Call step() once per optimizer step, after it.
 *
 * @category Optimizers
 */
export class LrScheduler {
  private base: number;
  private readonly target: { lr: number };
  private readonly schedule: LrSchedule;
  private t = 0;

  constructor(target: LrTarget, schedule: LrSchedule, options: LrSchedulerOptions = {}) {
    checkOptions(options, SCHEDULER_OPTION_KEYS, 'LrScheduler(target, schedule, options)');
    const holder = (target as { optimizer?: unknown } | null)?.optimizer ?? target;
    if (holder === null || typeof holder !== 'object' || typeof (holder as { lr?: unknown }).lr !== 'number')
      throw new InvalidArgumentError(
        `LrScheduler: target must be an optimizer, a DataParallelTrainer or a PipelineTrainer (anything with a numeric lr to set; a trainer of your own can expose setLr as an lr setter), got ${describeValue(target)}`,
      );
    checkFunction(schedule, 'LrScheduler(target, schedule): schedule');
    this.target = holder as { lr: number };
    this.schedule = schedule;
    this.base = checkNumber(options.baseLr ?? this.target.lr, 'LrScheduler: baseLr', 0, Number.MAX_VALUE);
    this.apply();
  }

  /** Scheduler steps so far. */
  get stepCount(): number {
    return this.t;
  }

  /** The learning rate set last. */
  get lr(): number {
    return this.target.lr;
  }

  /** The learning rate the factors multiply. */
  get baseLr(): number {
    return this.base;
  }

  /** Where the scheduler stands, for a checkpoint (saveCheckpoint's and savePipelineCheckpoint's `scheduler` option keep it). */
  state(): LrSchedulerState {
    return { step: this.t, baseLr: this.base };
  }

  /** Continues from a state() (after a restart): sets its step and base, and the target's learning rate for that step. */
  loadState(state: LrSchedulerState): number {
    checkObject(state, 'LrScheduler.loadState(state)');
    const step = checkInteger(state.step, 'LrScheduler.loadState: state.step', 0, Number.MAX_SAFE_INTEGER);
    const base = checkNumber(state.baseLr, 'LrScheduler.loadState: state.baseLr', 0, Number.MAX_VALUE);
    this.t = step;
    this.base = base;
    return this.apply();
  }

  /** Advances one step and sets the target's learning rate. */
  step(): number {
    this.t += 1;
    return this.apply();
  }

  private apply(): number {
    const factor = this.schedule(this.t);
    checkNumber(factor, `LrScheduler: the schedule's factor at step ${this.t}`, 0, Number.MAX_VALUE);
    this.target.lr = this.base * factor;
    return this.target.lr;
  }
}
