/**
 * An optimizer described as data (`{ kind: 'sgd', lr: 0.1, momentum: 0.9 }`), as the trainers
 * take it: the one factory that builds it, and the one check of its values, which builds it on a
 * one-element ParamSet so that a bad value is the optimizer's own typed error, thrown where the
 * spec is given (before any rank or worker starts) rather than inside a worker later.
 */
import { InvalidArgumentError } from '../errors.js';
import { ParamSet } from '../tensor.js';
import { describeValue } from '../validate.js';
import { Adam, AdamW, type AdamOptions } from './adam.js';
import type { Optimizer } from './optimizer.js';
import { SGD, type SGDOptions } from './sgd.js';

/** @category Optimizers */
export type OptimizerSpec = ({ kind: 'sgd' } & SGDOptions) | ({ kind: 'adam' | 'adamw' } & AdamOptions);

/** The optimizer of `spec` over `params`, with `extra` options (a trainer's compensation, prediction) added. @category Optimizers */
export function createOptimizer(params: ParamSet, spec: OptimizerSpec, extra: Partial<SGDOptions & AdamOptions> = {}): Optimizer {
  const { kind, ...rest } = spec;
  if (kind === 'sgd') return new SGD(params, { ...rest, ...extra } as SGDOptions);
  if (kind === 'adam') return new Adam(params, { ...rest, ...extra } as AdamOptions);
  if (kind === 'adamw') return new AdamW(params, { ...rest, ...extra } as AdamOptions);
  throw new InvalidArgumentError(`optimizer.kind must be 'sgd', 'adam' or 'adamw', got ${describeValue(kind)}`);
}

/**
 * @internal Throws the InvalidArgumentError the optimizer would, prefixed with `what`, if `spec` (with
 * `extra`) has a value out of range: built once on a one-element ParamSet and freed.
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
