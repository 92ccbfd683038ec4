/**
 * What each schedule asks of a stage's weights beyond the current version, as its entry in the
 * schedule registry (lib/pipeline/schedules/registry.ts) says: which schedules the runtime
 * executes, and the weight prediction (docs/ALGORITHMS.md section 3) and spike compensation
 * (section 4) each one's optimizer is built with. The schedule says *when* a pass reads predicted
 * weights (a `predictWeights` action before it) and *which* version it reads (`version`); the entry
 * says *how far ahead* the prediction looks, which the action list does not carry.
 */
import type { PredictionOptions } from '../../optim/options.js';
import { SCHEDULES, scheduleEntry, scheduleNames, type RuntimeSchedule, type ScheduleName } from '../schedules/registry.js';

/** @category Pipeline runtime */
export type RuntimeScheduleName = { [K in ScheduleName]: (typeof SCHEDULES)[K]['runtime'] extends RuntimeSchedule ? K : never }[ScheduleName];

/**
 * The schedules the pipeline runtime executes: those whose registry entry has a runtime (Wavelet
 * in its model-parallel form, its data-parallel form, which holds two replicas of the model per
 * worker, being planned; SAPipe with its rows as data-parallel workers). @category Pipeline runtime
 */
export const RUNTIME_SCHEDULES: readonly RuntimeScheduleName[] = scheduleNames.filter((name): name is RuntimeScheduleName => !('planned' in SCHEDULES[name].runtime));

/** @internal How the runtime runs `schedule` (a schedule's name), or undefined where it does not. */
export function runtimeSchedule(schedule: string): RuntimeSchedule | undefined {
  const runtime = scheduleEntry(schedule)?.runtime;
  return runtime === undefined || 'planned' in runtime ? undefined : runtime;
}

/** @internal The prediction the optimizer of part `part` of `parts` is built with, or undefined. */
export function predictionFor(schedule: string, part: number, parts: number): PredictionOptions | undefined {
  return runtimeSchedule(schedule)?.prediction?.(part, parts);
}

/** @internal The delay spike compensation corrects at part `part` of `parts`, or undefined. */
export function spikeDelayFor(schedule: string, part: number, parts: number): number | undefined {
  return runtimeSchedule(schedule)?.spikeDelay?.(part, parts);
}

/** @internal
 * The backward's prediction as a share of the forward's (SpecTrain), computed from the optimizer's
 * fused forward prediction with two native passes and no second prediction kernel; 0 where the
 * backward reads the current weights. Exact for SGD-momentum and Adam; AdamW's decay factor
 * `(1-lr*wd)^s` is not linear in s, so SpecTrain with AdamW and weight decay is refused before the run.
 */
export function backwardPredictionRatio(schedule: string, part: number, parts: number): number {
  return runtimeSchedule(schedule)?.backwardPredictionRatio?.(part, parts) ?? 0;
}
