import { InvalidArgumentError } from '../errors.js';
import { OptimizerKind, type NativeUpdateConfig } from '../native.js';
import type { ParamSet } from '../tensor.js';
import { type CommonOptimizerOptions } from './options.js';
import { checkInteger, checkNumber, checkOptions, optionKeys } from '../validate.js';
import { Optimizer } from './optimizer.js';

/** @category Optimizers */
export interface SGDOptions extends CommonOptimizerOptions {
  /** Momentum mu in [0, 1). Default 0. */
  momentum?: number;
  /** Dampening in [0, 1]. Default 0. */
  dampening?: number;
  /** Nesterov momentum (needs momentum > 0 and dampening 0). */
  nesterov?: boolean;
  /**
   * Spike compensation for gradients `delay` updates late (Pipelined Backpropagation):
   * w -= lr*(a*m + b*d), a = mu^delay, b = (1 - mu^delay)/(1 - mu). Needs momentum > 0,
   * dampening 0 and no Nesterov. delay 0 is plain momentum, 1 is Nesterov.
   */
  spikeCompensation?: { delay: number };
}

/** Every option SGD takes. @category Optimizers */
export const SGD_OPTION_KEYS = optionKeys<SGDOptions>({
  lr: true,
  weightDecay: true,
  gradScale: true,
  compensation: true,
  prediction: true,
  queue: true,
  momentum: true,
  dampening: true,
  nesterov: true,
  spikeCompensation: true,
});

/**
 * SGD with momentum, dampening, Nesterov and weight decay (PyTorch semantics), and spike
 * compensation, fused in one pass with delay compensation, weight prediction and the non-finite
 * guard (docs/ALGORITHMS.md sections 1-4).
 *
 * @category Optimizers
 */
export class SGD extends Optimizer {
  readonly momentum: number;
  readonly dampening: number;
  readonly nesterov: boolean;
  readonly spikeDelay: number | undefined;

  constructor(params: ParamSet, options: SGDOptions) {
    super(params, options, 'sgd', SGD_OPTION_KEYS);
    this.momentum = checkNumber(options.momentum ?? 0, 'momentum', 0, 1, { hiOpen: true });
    this.dampening = checkNumber(options.dampening ?? 0, 'dampening', 0, 1);
    const nesterov = options.nesterov ?? false;
    if (typeof nesterov !== 'boolean') throw new InvalidArgumentError('nesterov must be a boolean');
    if (nesterov && (this.momentum === 0 || this.dampening !== 0))
      throw new InvalidArgumentError('nesterov needs momentum > 0 and dampening 0');
    this.nesterov = nesterov;
    if (options.spikeCompensation !== undefined) {
      if (this.momentum === 0 || this.dampening !== 0 || nesterov)
        throw new InvalidArgumentError('spikeCompensation needs momentum > 0, dampening 0 and nesterov off');
      checkOptions(options.spikeCompensation, ['delay'], 'spikeCompensation');
      this.spikeDelay = checkInteger(options.spikeCompensation?.delay, 'spikeCompensation.delay', 0, 1 << 20);
    }
    this.allocateState(this.momentum !== 0 ? ['momentum'] : []);
  }

  protected optimizerConfig(firstStep: boolean): NativeUpdateConfig {
    return {
      optimizer: OptimizerKind.sgd,
      lr: this.lr,
      momentum: this.momentum,
      dampening: this.dampening,
      nesterov: this.nesterov,
      momentumIsEmpty: firstStep,
      spikeDelay: this.spikeDelay ?? -1,
    };
  }
}
