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
  /** N: parallel pipelines (AvgPipe). Default 1 (AvgPipe: AVGPIPE_DEFAULT_PIPELINES, 2). */
  readonly pipelines?: number;
  /** A: advance forward propagation depth (AvgPipe). Default S-1. */
  readonly advance?: number;
  /** V: model chunks per stage (interleaved 1F1B). Default 2. */
  readonly virtualStages?: number;
  /** Batches of M micro-batches (PipeDream-2BW). Default 3, so that steady state shows. */
  readonly iterations?: number;
  /** Wavelet form (one of {@link WAVELET_FORMS}). Default `data-parallel`. */
  readonly form?: WaveletForm;
}

/**
 * Wavelet's forms: `data-parallel` (S workers, each holding the tick and the tock replica of the
 * whole model) and `model-parallel` (S devices, S parts). The one list of them: the generator,
 * the runtime's `form` option and the CLI's `--form` read it.
 *
 * @category Pipeline schedules
 */
export const WAVELET_FORMS = ['data-parallel', 'model-parallel'] as const;
/** @category Pipeline schedules */
export type WaveletForm = (typeof WAVELET_FORMS)[number];

/**
 * Largest sizes accepted. Schedules are data: `units` bounds the (pipeline, micro-batch, part)
 * triples one schedule holds (S x M, times N for AvgPipe, V for interleaved 1F1B, the iterations
 * for PipeDream-2BW, 2 for Wavelet's data-parallel form), which keeps a schedule to about ten
 * million actions, generated, validated and simulated in seconds each (bench/RESULTS.md, "Schedules
 * at their largest sizes"). S = 256 with M = 4096 reaches it. The schedules built by list
 * scheduling (ZB-H1, AvgPipe), whose generation costs more per action, stop at
 * `listScheduledUnits`.
 *
 * @category Pipeline schedules
 */
export const limits = {
  stages: 256,
  microBatches: 4096,
  pipelines: 64,
  virtualStages: 64,
  iterations: 64,
  units: 2 ** 20,
  listScheduledUnits: 2 ** 19,
} as const;

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

/**
 * Refuses a schedule of more than `limits.units` units: `factors` names what multiplies S x M
 * (e.g. `{ pipelines: N }`), and the message says how far to lower M. A factor that is not an
 * option (Wavelet's two replicas) is not offered as something to lower.
 *
 * @category Pipeline schedules
 */
export function checkUnits(
  name: string,
  S: number,
  M: number,
  factors: Readonly<Record<string, number>>,
  options: readonly string[] = Object.keys(factors),
  max: number = limits.units,
): void {
  const entries = Object.entries(factors);
  const units = entries.reduce((n, [, f]) => n * f, S * M);
  if (units <= max) return;
  const most = Math.floor(max / (units / M));
  const others = ['stages', ...options].join(' or ');
  const why =
    max === limits.listScheduledUnits
      ? 'the most a schedule built by list scheduling (zb-h1, avgpipe) holds so that it generates in seconds'
      : 'the most one schedule holds so that it generates, validates and simulates in seconds';
  throw new InvalidArgumentError(
    `${name}: stages x microBatches${entries.map(([k]) => ` x ${k}`).join('')} = ${[S, M, ...entries.map(([, f]) => f)].join(' x ')} = ${units} ` +
      `exceeds ${max} (2^${Math.log2(max)}), ${why}; ` +
      (most >= 1 ? `lower microBatches to ${most} or fewer, or lower ${others}` : `lower ${others}`),
  );
}
