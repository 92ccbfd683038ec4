/**
 * Parameters shared by the schedule generators, and their checks.
 */
import { InvalidArgumentError } from '../../errors.js';
import { checkInteger, checkKnownKeys, optionKeys } from '../../validate.js';

/** Generator parameters. Each generator reads the ones that apply to it and ignores the rest. @category Pipeline schedules */
export interface ScheduleOptions {
  /** S: pipeline stages (devices); for data-parallel forms, workers. */
  readonly stages: number;
  /** M: micro-batches per pipeline (per batch where `iterations` applies). */
  readonly microBatches: number;
  /** N: parallel pipelines (AvgPipe). Default 1 (AvgPipe: 2). */
  readonly pipelines?: number;
  /** A: advance forward propagation depth (AvgPipe). Default S-1. */
  readonly advance?: number;
  /** V: model chunks per stage (interleaved 1F1B). Default 2. */
  readonly virtualStages?: number;
  /** Batches of M micro-batches (PipeDream-2BW). Default 3, so that steady state shows. */
  readonly iterations?: number;
  /** Wavelet form. Default `data-parallel`. */
  readonly form?: 'data-parallel' | 'model-parallel';
}

/** Largest sizes accepted: schedules are data, and these keep them to a few hundred thousand actions. @category Pipeline schedules */
export const limits = { stages: 256, microBatches: 4096, pipelines: 64, virtualStages: 64, iterations: 64 } as const;

const SCHEDULE_OPTION_KEYS = optionKeys<ScheduleOptions>({
  stages: true,
  microBatches: true,
  pipelines: true,
  advance: true,
  virtualStages: true,
  iterations: true,
  form: true,
});

/** @category Pipeline schedules */
export function checkOptions(name: string, options: ScheduleOptions): { S: number; M: number } {
  if (options === null || typeof options !== 'object') {
    throw new InvalidArgumentError(`${name}: pass an options object such as { stages: 4, microBatches: 8 }`);
  }
  checkKnownKeys(options, SCHEDULE_OPTION_KEYS, name);
  const S = checkInteger(options.stages, `${name}: stages`, 1, limits.stages);
  const M = checkInteger(options.microBatches, `${name}: microBatches`, 1, limits.microBatches);
  return { S, M };
}
