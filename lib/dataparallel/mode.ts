/**
 * The data-parallel training modes and the optimizer configuration each one needs
 * (ALGORITHMS.md sections 2, 3 and the SAPipe data-parallel pipeline of section 5).
 */
import { InvalidArgumentError } from '../errors.js';
import type { OptimizerSpecWithout } from '../optim/registry.js';
import { DEFAULT_DC_LAMBDA, GRADIENT_ESTIMATES, resolveCompensation, type CompensationOptions, type GradientEstimate, type PredictionOptions } from '../optim/options.js';
import { checkInteger, checkObject, describeValue } from '../validate.js';

/**
 * - `sync`: each step waits for its own all-reduce, then updates (staleness 0; the baseline).
 * - `pipe-sgd`: the all-reduce of step t runs while step t+1 computes; the update applies the
 *   gradient one step late, as it is (staleness 1).
 * - `sapipe-dc`: as pipe-sgd, the late gradient delay-compensated.
 * - `sapipe-wp`: as pipe-sgd, and forward passes read weights predicted one update ahead with a
 *   gradient estimate (`local`, `prev-sync`, `local-prev-sync`), optionally with compensation.
 *
 * @category Data parallel
 */
export type DataParallelMode = 'sync' | 'pipe-sgd' | 'sapipe-dc' | 'sapipe-wp';
/** @category Data parallel */
export const DATA_PARALLEL_MODES: readonly DataParallelMode[] = ['sync', 'pipe-sgd', 'sapipe-dc', 'sapipe-wp'];

/**
 * The estimate `sapipe-wp` uses when none is given, chosen by the accuracy experiment recorded in
 * bench/RESULTS.md ("Staleness-1 accuracy on MNIST").
 *
 * @category Data parallel
 */
export const DEFAULT_WP_ESTIMATE: GradientEstimate = 'prev-sync';
/**
 * Delay compensation when `compensation` is omitted (sapipe-dc) or `{}`: the adaptive form, whose
 * term `lambda * g*g*(w - w_c) / sqrt(g*g + eps)` scales with |g| rather than g*g. In the same
 * experiment the elementwise form won back 3-32% of pipe-sgd's loss at any lambda from 0.05 to 2
 * and diverged from 200 on; the adaptive form at lambda 10 won back 60-88%, and at 20-30 more, but
 * 50 diverged at lr 0.2: 10 stays 3 to 5 times below that edge (RESULTS.md).
 *
 * @category Data parallel
 */
export const DEFAULT_DC_KIND = 'adaptive' as const;
/** lambda of the data-parallel modes' compensation in its adaptive form (their default, {@link DEFAULT_DC_KIND}) given without one. @category Data parallel */
export const DEFAULT_ADAPTIVE_DC_LAMBDA = 10;
/** lambda of `{ kind: 'elementwise' }` given without one: the optimizers' default ({@link DEFAULT_DC_LAMBDA}, ALGORITHMS.md's 0.2). @category Data parallel */
export const DEFAULT_ELEMENTWISE_DC_LAMBDA = DEFAULT_DC_LAMBDA;

/** The optimizer the trainer builds on the ParamSet; the mode adds compensation and prediction. @category Data parallel */
export type DataParallelOptimizerSpec = OptimizerSpecWithout<'compensation' | 'prediction' | 'queue'>;

/** @category Data parallel */
export interface DataParallelModeOptions {
  mode: DataParallelMode;
  /** Updates between the weights a gradient was computed at and the weights it is applied to: 0 for `sync`, 1 otherwise (the default per mode). */
  staleness?: number;
  /**
   * Delay compensation: used by `sapipe-dc`; turns on compensation in `sapipe-wp`. Omitted or `{}`:
   * adaptive with lambda {@link DEFAULT_ADAPTIVE_DC_LAMBDA}. A kind without lambda gets that kind's
   * default; a lambda without kind is elementwise, as in the optimizers.
   */
  compensation?: CompensationOptions;
  /** `sapipe-wp`: the gradient estimate of the shadow step. Default {@link DEFAULT_WP_ESTIMATE}. */
  estimate?: GradientEstimate;
  /** `sapipe-wp` with `compensation`: also compensate the estimate (default true). */
  compensateEstimate?: boolean;
}

/** @category Data parallel */
export interface ResolvedMode {
  mode: DataParallelMode;
  staleness: 0 | 1;
  compensation: CompensationOptions | undefined;
  prediction: PredictionOptions | undefined;
  /** The estimate reads this rank's own newest gradient, so the trainer keeps a copy of it. */
  needsLocalGrad: boolean;
}

/** @category Data parallel */
export function resolveMode(o: DataParallelModeOptions, worldSize: number): ResolvedMode {
  checkObject(o, 'DataParallelTrainer options');
  checkInteger(worldSize, 'worldSize', 1, 1 << 20);
  const mode = o.mode;
  if (!DATA_PARALLEL_MODES.includes(mode))
    throw new InvalidArgumentError(`DataParallelTrainer: mode must be one of ${DATA_PARALLEL_MODES.join(', ')}, got ${describeValue(mode)}`);
  const expected = mode === 'sync' ? 0 : 1;
  const staleness = o.staleness ?? expected;
  if (staleness !== 0 && staleness !== 1)
    throw new InvalidArgumentError(`DataParallelTrainer: staleness must be 0 or 1 (deeper pipelines are not supported), got ${describeValue(staleness)}`);
  if (staleness !== expected)
    throw new InvalidArgumentError(
      `DataParallelTrainer: mode '${mode}' has staleness ${expected}, not ${staleness}; use mode 'sync' for staleness 0 or a pipelined mode for staleness 1`,
    );
  if (o.compensation !== undefined && (mode === 'sync' || mode === 'pipe-sgd'))
    throw new InvalidArgumentError(`DataParallelTrainer: mode '${mode}' applies no delay compensation; use 'sapipe-dc' (or 'sapipe-wp' with compensation), or drop the compensation option`);
  if (o.compensation !== undefined) checkCompensation(o.compensation);
  if (mode !== 'sapipe-wp' && (o.estimate !== undefined || o.compensateEstimate !== undefined))
    throw new InvalidArgumentError(`DataParallelTrainer: estimate and compensateEstimate belong to mode 'sapipe-wp', not '${mode}'`);
  switch (mode) {
    case 'sync':
    case 'pipe-sgd':
      return { mode, staleness, compensation: undefined, prediction: undefined, needsLocalGrad: false };
    case 'sapipe-dc':
      return { mode, staleness, compensation: withDefaults(o.compensation ?? {}), prediction: undefined, needsLocalGrad: false };
    case 'sapipe-wp': {
      const estimate = o.estimate ?? DEFAULT_WP_ESTIMATE;
      if (!GRADIENT_ESTIMATES.includes(estimate))
        throw new InvalidArgumentError(`DataParallelTrainer: mode 'sapipe-wp' takes estimate: one of ${GRADIENT_ESTIMATES.join(', ')} (default ${DEFAULT_WP_ESTIMATE}), got ${describeValue(o.estimate)}`);
      const compensateEstimate = o.compensateEstimate ?? o.compensation !== undefined;
      if (typeof compensateEstimate !== 'boolean') throw new InvalidArgumentError('DataParallelTrainer: compensateEstimate must be a boolean');
      if (compensateEstimate && o.compensation === undefined)
        throw new InvalidArgumentError('DataParallelTrainer: compensateEstimate needs delay compensation; also pass compensation: {} (or { lambda })');
      return {
        mode,
        staleness,
        compensation: o.compensation && withDefaults(o.compensation),
        prediction: { kind: 'sapipe', estimate, compensate: compensateEstimate, worldSize },
        needsLocalGrad: estimate !== 'prev-sync',
      };
    }
  }
}

// The data-parallel default differs from the optimizers' own (lib/optim/options.ts: elementwise,
// DEFAULT_DC_LAMBDA), which serve pipeline stages too. A lambda only means something with its kind, so a lambda
// given alone keeps the optimizers' kind, and a kind given alone gets its own lambda.
function withDefaults(c: CompensationOptions): CompensationOptions {
  if (c.lambda !== undefined) return c;
  if (c.kind === undefined) return { ...c, kind: DEFAULT_DC_KIND, lambda: DEFAULT_ADAPTIVE_DC_LAMBDA };
  return { ...c, lambda: c.kind === 'adaptive' ? DEFAULT_ADAPTIVE_DC_LAMBDA : DEFAULT_ELEMENTWISE_DC_LAMBDA };
}

function checkCompensation(c: CompensationOptions): void {
  if (c === null || typeof c !== 'object') throw new InvalidArgumentError(`DataParallelTrainer: compensation must be an object like { lambda: ${DEFAULT_DC_LAMBDA} }`);
  // The optimizers' one check of a compensation (kind, lambda, eps), here where the trainer is given it.
  try {
    resolveCompensation(c);
  } catch (error) {
    if (error instanceof InvalidArgumentError) throw new InvalidArgumentError(`DataParallelTrainer: ${error.message}`, { cause: error });
    throw error;
  }
}
