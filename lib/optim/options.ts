/**
 * Options shared by every optimizer: gradient scaling, delay compensation and weight prediction
 * (ALGORITHMS.md sections 2-4), and their validation.
 */
import { InvalidArgumentError } from '../errors.js';
import type { ExecutionQueue } from '../queue.js';
import { checkInteger, checkKnownKeys, checkNumber, checkObject, describeValue, optionKeys } from '../validate.js';

/** Delay compensation of the applied gradient (SAPipe-DC, after DC-ASGD). @category Optimizers */
export interface CompensationOptions {
  /** `elementwise` (default): g + lambda*g*g*(w - w_c); `adaptive` divides the term by sqrt(g*g + eps). */
  kind?: 'elementwise' | 'adaptive';
  /** Strength, in [0, {@link DC_LAMBDA_MAX}]. Default {@link DEFAULT_DC_LAMBDA}. */
  lambda?: number;
  /** eps of the adaptive variant. Default {@link DEFAULT_DC_EPS}. */
  eps?: number;
}

/**
 * lambda of an optimizer's delay compensation given without one, whatever its kind: DC-ASGD's 0.2
 * (ALGORITHMS.md section 2). The data-parallel modes default to the adaptive form at their own
 * lambda instead (DEFAULT_ADAPTIVE_DC_LAMBDA in lib/dataparallel/mode.ts), and take this one for
 * the elementwise form.
 *
 * @category Optimizers
 */
export const DEFAULT_DC_LAMBDA = 0.2;
/** The largest delay-compensation lambda accepted. @category Optimizers */
export const DC_LAMBDA_MAX = 1e6;
/** eps of the adaptive delay compensation given without one. @category Optimizers */
export const DEFAULT_DC_EPS = 1e-7;

/** The gradient SAPipe's shadow step assumes for the update still in flight. @category Optimizers */
export type GradientEstimate = 'local' | 'prev-sync' | 'local-prev-sync';
/** Every gradient estimate, in the order ALGORITHMS.md numbers them (options 1, 2, 3). @category Optimizers */
export const GRADIENT_ESTIMATES: readonly GradientEstimate[] = ['local', 'prev-sync', 'local-prev-sync'];

/** SAPipe weight prediction: a shadow optimizer step with an estimated gradient. @category Optimizers */
export interface SapipePrediction {
  kind: 'sapipe';
  estimate: GradientEstimate;
  /** Also delay-compensate the estimate (needs `compensation`). */
  compensate?: boolean;
  /** Data-parallel world size n of the local-prev-sync estimate. Default 1. */
  worldSize?: number;
  /** Multiplier applied when reading local gradients (loss-scale unscale). Default 1. */
  localGradScale?: number;
}

/** PipeOptim: stage `stage` of `stages` predicts s = stages - stage - 1 updates ahead. @category Optimizers */
export interface PipeOptimPrediction {
  kind: 'pipeoptim';
  stage: number;
  stages: number;
}

/** SpecTrain: forward s = floor(k/2) + S - k - 1, backward s = floor(k/2). @category Optimizers */
export interface SpecTrainPrediction {
  kind: 'spectrain';
  stage: number;
  stages: number;
  /** Which pass's weights the predicted buffer holds. Default `forward`. */
  pass?: 'forward' | 'backward';
}

/** Linear weight prediction w_hat = w - lr*s*D with an explicit s (Pipelined Backpropagation uses s = D_k). @category Optimizers */
export interface LinearPrediction {
  kind: 'linear';
  steps: number;
}

/** @category Optimizers */
export type PredictionOptions = SapipePrediction | PipeOptimPrediction | SpecTrainPrediction | LinearPrediction;

/** @category Optimizers */
export interface CommonOptimizerOptions {
  /** Learning rate, finite and >= 0. May be changed between steps through `optimizer.lr`. */
  lr: number;
  /** Weight decay, >= 0. Default 0. */
  weightDecay?: number;
  /** Multiplier applied to every gradient element on read (1/n averaging, loss-scale unscale). Default 1. */
  gradScale?: number;
  compensation?: CompensationOptions;
  prediction?: PredictionOptions;
  /** Queue for step(); default: the process-wide queue. */
  queue?: ExecutionQueue;
}

/** The option names each optimizer options object takes (one source: the compiler ties them to the types). @category Optimizers */
export const COMMON_OPTIMIZER_KEYS = optionKeys<CommonOptimizerOptions>({
  lr: true,
  weightDecay: true,
  gradScale: true,
  compensation: true,
  prediction: true,
  queue: true,
});
const COMPENSATION_KEYS = optionKeys<CompensationOptions>({ kind: true, lambda: true, eps: true });
/** Resolved delay compensation. @category Optimizers */
export interface ResolvedCompensation {
  kind: 'elementwise' | 'adaptive';
  lambda: number;
  eps: number;
}

/** @category Optimizers */
export function resolveCompensation(c: CompensationOptions | undefined): ResolvedCompensation | undefined {
  if (c === undefined) return undefined;
  checkObject(c, 'compensation');
  checkKnownKeys(c, COMPENSATION_KEYS, 'compensation');
  const kind = c.kind ?? 'elementwise';
  if (kind !== 'elementwise' && kind !== 'adaptive')
    throw new InvalidArgumentError(`compensation.kind must be 'elementwise' or 'adaptive', got ${describeValue(kind)}`);
  return {
    kind,
    lambda: checkNumber(c.lambda ?? DEFAULT_DC_LAMBDA, 'compensation.lambda', 0, DC_LAMBDA_MAX),
    eps: checkNumber(c.eps ?? DEFAULT_DC_EPS, 'compensation.eps', 0, 1, { loOpen: true }),
  };
}

/**
 * Resolved prediction: SAPipe's (the option's name; the kernel calls the operation a shadow step,
 * `PredictionKind.shadowStep`), or a linear prediction with its step count s.
 *
 * @category Optimizers
 */
export type ResolvedPrediction =
  | { kind: 'sapipe'; estimate: GradientEstimate; compensate: boolean; worldSize: number; localGradScale: number }
  | { kind: 'linear'; steps: number; source: PredictionOptions['kind'] };

function checkStage(p: { stage: unknown; stages: unknown }, kind: string): { k: number; S: number } {
  const S = checkInteger(p.stages, `prediction.stages (${kind})`, 1, 1 << 20);
  const k = checkInteger(p.stage, `prediction.stage (${kind})`, 0, S - 1);
  return { k, S };
}

/** @internal PipeOptim's steps ahead at stage k of S: `S - k - 1` (ALGORITHMS.md section 3). Takes checked values. */
export function pipeoptimStepsAhead(stage: number, stages: number): number {
  return stages - stage - 1;
}

/** @internal SpecTrain's steps ahead at stage k of S: forward `floor(k/2) + S - k - 1`, backward `floor(k/2)`. Takes checked values. */
export function spectrainStepsAhead(stage: number, stages: number, pass: 'forward' | 'backward'): number {
  const half = Math.floor(stage / 2);
  return pass === 'forward' ? half + stages - stage - 1 : half;
}

/** A prediction kind: the option keys it takes and its resolution (values checked). */
interface PredictionKind<P extends PredictionOptions> {
  readonly keys: readonly string[];
  resolve(p: P, compensation: ResolvedCompensation | undefined): ResolvedPrediction;
}


/** Every prediction kind, once: resolvePrediction dispatches on this table. */
const PREDICTIONS: { readonly [K in PredictionOptions['kind']]: PredictionKind<Extract<PredictionOptions, { kind: K }>> } = {
  sapipe: {
    keys: optionKeys<SapipePrediction>({ kind: true, estimate: true, compensate: true, worldSize: true, localGradScale: true }),
    resolve(p, compensation) {
      if (!GRADIENT_ESTIMATES.includes(p.estimate))
        throw new InvalidArgumentError(`prediction.estimate must be one of ${GRADIENT_ESTIMATES.join(', ')}, got ${describeValue(p.estimate)}`);
      const compensate = p.compensate ?? false;
      if (typeof compensate !== 'boolean') throw new InvalidArgumentError('prediction.compensate must be a boolean');
      if (compensate && !compensation)
        throw new InvalidArgumentError('prediction.compensate needs delay compensation: also pass `compensation`');
      return {
        kind: 'sapipe',
        estimate: p.estimate,
        compensate,
        worldSize: checkInteger(p.worldSize ?? 1, 'prediction.worldSize', 1, 1 << 24),
        localGradScale: checkNumber(p.localGradScale ?? 1, 'prediction.localGradScale', 0, Number.MAX_VALUE, { loOpen: true }),
      };
    },
  },
  pipeoptim: {
    keys: optionKeys<PipeOptimPrediction>({ kind: true, stage: true, stages: true }),
    resolve(p) {
      const { k, S } = checkStage(p, 'pipeoptim');
      return { kind: 'linear', steps: pipeoptimStepsAhead(k, S), source: 'pipeoptim' };
    },
  },
  spectrain: {
    keys: optionKeys<SpecTrainPrediction>({ kind: true, stage: true, stages: true, pass: true }),
    resolve(p) {
      const { k, S } = checkStage(p, 'spectrain');
      const pass = p.pass ?? 'forward';
      if (pass !== 'forward' && pass !== 'backward')
        throw new InvalidArgumentError(`prediction.pass must be 'forward' or 'backward', got ${describeValue(pass)}`);
      return { kind: 'linear', steps: spectrainStepsAhead(k, S, pass), source: 'spectrain' };
    },
  },
  linear: {
    keys: optionKeys<LinearPrediction>({ kind: true, steps: true }),
    resolve: (p) => ({ kind: 'linear', steps: checkNumber(p.steps, 'prediction.steps', 0, 1e9), source: 'linear' }),
  },
};
const PREDICTION_KINDS = Object.keys(PREDICTIONS).map((k) => `'${k}'`);

/** @category Optimizers */
export function resolvePrediction(
  p: PredictionOptions | undefined,
  compensation: ResolvedCompensation | undefined,
): ResolvedPrediction | undefined {
  if (p === undefined) return undefined;
  checkObject(p, 'prediction');
  const kind: unknown = p.kind;
  if (typeof kind !== 'string' || !Object.hasOwn(PREDICTIONS, kind))
    throw new InvalidArgumentError(`prediction.kind must be ${PREDICTION_KINDS.slice(0, -1).join(', ')} or ${PREDICTION_KINDS.at(-1)}, got ${describeValue(kind)}`);
  const entry = PREDICTIONS[kind as PredictionOptions['kind']] as PredictionKind<PredictionOptions>;
  checkKnownKeys(p, entry.keys, `prediction (kind '${kind}')`);
  return entry.resolve(p, compensation);
}

/** Delay of stage k of S in Pipelined Backpropagation: D_k = 2(S-k)-1 (for linear prediction and spike compensation). @category Optimizers */
export function pipelinedBackpropDelay(stage: number, stages: number): number {
  const S = checkInteger(stages, 'stages', 1, 1 << 20);
  const k = checkInteger(stage, 'stage', 0, S - 1);
  return 2 * (S - k) - 1;
}

/** A learning rate and momentum at a batch size. @category Optimizers */
export interface SmallBatchHyperparameters {
  lr: number;
  momentum: number;
  batch: number;
}

/**
 * Pipelined Backpropagation's small-batch scaling rule (ALGORITHMS.md section 4): from a reference
 * `(lr_B, mu_B)` tuned at batch `B`, the hyperparameters at batch `b` that keep the same
 * per-sample decay of the momentum and the same per-sample step: `mu_b = mu_B^(b/B)`,
 * `lr_b = lr_B * (b/B) * (1 - mu_b) / (1 - mu_B)`.
 *
 * @category Optimizers
 */
export function pipelinedBackpropScaling(reference: SmallBatchHyperparameters, batch: number): SmallBatchHyperparameters {
  checkObject(reference, 'pipelinedBackpropScaling(reference, batch): reference');
  const lrB = checkNumber(reference.lr, 'pipelinedBackpropScaling: reference.lr', 0, Number.MAX_VALUE);
  const muB = checkNumber(reference.momentum, 'pipelinedBackpropScaling: reference.momentum', 0, 1, { loOpen: true, hiOpen: true });
  const B = checkInteger(reference.batch, 'pipelinedBackpropScaling: reference.batch', 1, 1 << 30);
  const b = checkInteger(batch, 'pipelinedBackpropScaling: batch', 1, 1 << 30);
  const momentum = muB ** (b / B);
  return { lr: (lrB * (b / B) * (1 - momentum)) / (1 - muB), momentum, batch: b };
}
