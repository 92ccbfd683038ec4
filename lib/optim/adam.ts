import { InvalidArgumentError } from '../errors.js';
import { OptimizerKind, type NativeUpdateConfig } from '../native.js';
import type { ParamSet } from '../tensor.js';
import { type CommonOptimizerOptions } from './options.js';
import { checkNumber, optionKeys } from '../validate.js';
import { Optimizer } from './optimizer.js';

/** @category Optimizers */
export interface AdamOptions extends CommonOptimizerOptions {
  /** [beta1, beta2], each in [0, 1). Default [0.9, 0.999]. */
  betas?: readonly [number, number];
  /** Added to the denominator, > 0. Default 1e-8. */
  eps?: number;
}

/** Every option Adam and AdamW take. @category Optimizers */
export const ADAM_OPTION_KEYS = optionKeys<AdamOptions>({
  lr: true,
  weightDecay: true,
  gradScale: true,
  compensation: true,
  prediction: true,
  queue: true,
  betas: true,
  eps: true,
});

abstract class AdamBase extends Optimizer {
  readonly beta1: number;
  readonly beta2: number;
  readonly eps: number;

  protected constructor(params: ParamSet, options: AdamOptions, kind: 'adam' | 'adamw') {
    super(params, options, kind, ADAM_OPTION_KEYS);
    const betas = options.betas ?? [0.9, 0.999];
    if (!Array.isArray(betas) || betas.length !== 2) throw new InvalidArgumentError('betas must be [beta1, beta2]');
    this.beta1 = checkNumber(betas[0], 'betas[0]', 0, 1, { hiOpen: true });
    this.beta2 = checkNumber(betas[1], 'betas[1]', 0, 1, { hiOpen: true });
    this.eps = checkNumber(options.eps ?? 1e-8, 'eps', 0, 1, { loOpen: true });
    this.allocateState(['momentum', 'secondMoment']);
  }

  protected optimizerConfig(): NativeUpdateConfig {
    return {
      optimizer: this.kind === 'adamw' ? OptimizerKind.adamw : OptimizerKind.adam,
      lr: this.lr,
      beta1: this.beta1,
      beta2: this.beta2,
      eps: this.eps,
    };
  }
}

/** Adam with coupled L2 weight decay (PyTorch semantics), fused with compensation and prediction. @category Optimizers */
export class Adam extends AdamBase {
  constructor(params: ParamSet, options: AdamOptions) {
    super(params, options, 'adam');
  }
}

/** AdamW: Adam with decoupled weight decay w *= (1 - lr*wd). @category Optimizers */
export class AdamW extends AdamBase {
  constructor(params: ParamSet, options: AdamOptions) {
    super(params, options, 'adamw');
  }
}
