/**
 * Every optimizer, described once: the trainers, the pipeline runtime, the CLI and the reports read
 * its entry here instead of comparing names. An optimizer given as data (`{ kind: 'sgd', lr: 0.1,
 * momentum: 0.9 }`, as the trainers take it) is checked and built through it.
 *
 * Adding an optimizer: its class (with its native enum in native/include/sapipe/kernels.h and the
 * kernels' dispatch), and one entry in OPTIMIZERS. docs/DESIGN.md lists the files.
 */
import { InvalidArgumentError } from '../errors.js';
import { ParamSet } from '../tensor.js';
import { checkKnownKeys, checkObject, describeValue } from '../validate.js';
import { ADAM_OPTION_KEYS, Adam, AdamW, type AdamOptions } from './adam.js';
import type { Optimizer, OptimizerKindName } from './optimizer.js';
import { SGD, SGD_OPTION_KEYS, type SGDOptions } from './sgd.js';

/** What the rest of sapipe asks about an optimizer kind. @category Optimizers */
export interface OptimizerDescriptor<Options> {
  /** The class, for messages (`SGD`). */
  readonly className: string;
  /** The options its class takes, beside `kind`. */
  readonly optionKeys: readonly string[];
  /** Builds it over `params`. */
  create(params: ParamSet, options: Options): Optimizer;
  /** State buffers of the weights' size it keeps for these options (compensation and prediction add their own). */
  stateBuffers(options: Partial<Options>): number;
  /**
   * Whether it carries a direction that weight prediction can follow for these options (PipeOptim
   * and SpecTrain predict along the momentum: SGD needs one, Adam always has one).
   */
  predictsAlongMomentum(options: Partial<Options>): boolean;
  /** Whether its step is linear in the steps ahead, as SpecTrain's backward prediction assumes (AdamW's decoupled decay is not, unless 0). */
  linearInStepsAhead(options: Partial<Options>): boolean;
  /**
   * Whether spike compensation (ALGORITHMS.md section 4) applies to its step for these options, as
   * Pipelined Backpropagation needs: SGD with momentum, no dampening and no Nesterov.
   */
  compensatesSpikes(options: Partial<Options>): boolean;
  /** The learning rate the CLI uses when none is given. */
  readonly defaultLr: number;
}

const sgd: OptimizerDescriptor<SGDOptions> = {
  className: 'SGD',
  optionKeys: SGD_OPTION_KEYS,
  create: (params, options) => new SGD(params, options),
  stateBuffers: (o) => ((o.momentum ?? 0) > 0 ? 1 : 0),
  predictsAlongMomentum: (o) => (o.momentum ?? 0) > 0,
  linearInStepsAhead: () => true,
  compensatesSpikes: (o) => (o.momentum ?? 0) > 0 && (o.dampening ?? 0) === 0 && !o.nesterov,
  defaultLr: 0.05,
};
const adam: OptimizerDescriptor<AdamOptions> = {
  className: 'Adam',
  optionKeys: ADAM_OPTION_KEYS,
  create: (params, options) => new Adam(params, options),
  stateBuffers: () => 2,
  predictsAlongMomentum: () => true,
  linearInStepsAhead: () => true,
  compensatesSpikes: () => false,
  defaultLr: 0.001,
};
const adamw: OptimizerDescriptor<AdamOptions> = {
  ...adam,
  className: 'AdamW',
  create: (params, options) => new AdamW(params, options),
  linearInStepsAhead: (o) => (o.weightDecay ?? 0) === 0,
};

/** Every optimizer kind and its entry. @category Optimizers */
export const OPTIMIZERS = { sgd, adam, adamw } as const satisfies Record<OptimizerKindName, unknown>;
/** The kinds, in the order messages and the CLI list them. @category Optimizers */
export const OPTIMIZER_KINDS = Object.keys(OPTIMIZERS) as OptimizerKindName[];

/** An optimizer as data: its kind and its class's options. @category Optimizers */
export type OptimizerSpec = ({ kind: 'sgd' } & SGDOptions) | ({ kind: 'adam' | 'adamw' } & AdamOptions);

/**
 * An optimizer spec without the options a trainer or the runtime sets itself (`K`), for every kind
 * at once. @category Optimizers
 */
export type OptimizerSpecWithout<K extends string> = OptimizerSpec extends infer S ? (S extends unknown ? Omit<S, K> : never) : never;

type AnyDescriptor = OptimizerDescriptor<SGDOptions & AdamOptions>;

/** @internal The entry of `kind`, or an InvalidArgumentError naming the kinds there are. */
export function optimizerEntry(kind: unknown, what: string): AnyDescriptor {
  if (typeof kind !== 'string' || !Object.hasOwn(OPTIMIZERS, kind))
    throw new InvalidArgumentError(`${what}: optimizer.kind must be one of ${OPTIMIZER_KINDS.map((k) => `'${k}'`).join(', ')}, got ${describeValue(kind)}`);
  return OPTIMIZERS[kind as OptimizerKindName] as AnyDescriptor;
}

/** The optimizer of `spec` over `params`, with `extra` options (a trainer's compensation, prediction) added. @category Optimizers */
export function createOptimizer(params: ParamSet, spec: OptimizerSpec, extra: Partial<SGDOptions & AdamOptions> = {}): Optimizer {
  checkObject(spec, 'createOptimizer(params, spec)');
  const { kind, ...rest } = spec;
  return optimizerEntry(kind, 'createOptimizer').create(params, { ...rest, ...extra } as SGDOptions & AdamOptions);
}

/**
 * @internal The shape of an optimizer spec where a trainer or the runtime takes one: a known kind,
 * only its class's options, and none of `setByCaller` (which the caller sets from its own options;
 * `why` says from what). The values are checkOptimizerValues's.
 */
export function checkOptimizerSpec(spec: unknown, what: string, setByCaller: { keys: readonly string[]; why: string }): asserts spec is OptimizerSpec {
  checkObject(spec, `${what}: optimizer`);
  const entry = optimizerEntry((spec as { kind?: unknown }).kind, what);
  for (const key of setByCaller.keys)
    if (Object.hasOwn(spec as object, key)) throw new InvalidArgumentError(`${what}: optimizer.${key} is set ${setByCaller.why}`);
  checkKnownKeys(spec as object, ['kind', ...entry.optionKeys], `${what}: optimizer`);
}

/**
 * @internal Every value of `spec` (with `extra`), as the optimizer checks them: it is built once on
 * a one-element ParamSet and freed, so a bad value is its own typed error, thrown where the spec is
 * given (before any rank or worker starts) rather than inside a worker later.
 */
export function checkOptimizerValues(spec: OptimizerSpec, what: string, extra: Partial<SGDOptions & AdamOptions> = {}): void {
  const probe = new ParamSet({ probe: [1] });
  try {
    createOptimizer(probe, spec, extra).dispose();
  } catch (error) {
    if (error instanceof InvalidArgumentError) throw new InvalidArgumentError(`${what}: optimizer: ${error.message}`, { cause: error });
    throw error;
  } finally {
    probe.dispose();
  }
}
