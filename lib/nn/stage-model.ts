/**
 * What a pipeline stage's model implements, so that the pipeline runtime can train any model code:
 * sapipe's {@link Sequential} parts, or a user's own. The runtime owns the schedule, the weight
 * versions, the optimizer and the transfers; the model owns its maths and the per-micro-batch
 * state (activations) between a forward and its backward.
 */
import type { ParamSet } from '../tensor.js';
import type { Device, Tensor } from './ops.js';

/** Options of {@link StageModel.backward}. @category Models */
export interface StageBackwardOptions {
  /** Where the parameter gradients go; a buffer with the ParamSet's layout. */
  grads: Tensor;
  /** The weights the backward reads (default: those its forward read). */
  weights?: Tensor;
  /** Add the parameter gradients to `grads` instead of overwriting them (accumulation over micro-batches). */
  accumulate?: boolean;
  /** Compute and return the gradient of the input (default true; the first stage passes false). */
  inputGrad?: boolean;
  /**
   * Compute the parameter gradients now (default true). False (zero-bubble schedules' split
   * backward) keeps what they need until {@link StageModel.weightGrad}.
   */
  weightGrad?: boolean;
}

/**
 * One stage of a pipeline: a forward of a micro-batch on given weights, a backward into the
 * stage's gradient buffer returning the input gradient. Micro-batches are named by a `slot` (the
 * runtime uses the micro-batch number); several may be in flight at once.
 *
 * @category Models
 */
export interface StageModel<T extends Tensor = Tensor> {
  /** The stage's parameters: one flat buffer the optimizer updates in one native call. */
  readonly params: ParamSet;
  /**
   * Where the model runs (default `cpu`). On `cuda:N` every buffer it is given and returns is a
   * DeviceBuffer there, and the runtime keeps the part's weights, gradients, optimizer state,
   * stashed and predicted versions in a DeviceParamSet on it; `params` stays the host copy.
   */
  readonly device?: Device;
  /** Features per sample of the input, and of the output (the next stage's input). */
  readonly inputSize: number;
  readonly outputSize: number;
  /**
   * Forward of a micro-batch of `batch` samples (`input`: batch x inputSize, row-major), reading
   * `weights` (a buffer with the ParamSet's layout: the real, a stashed or a predicted version).
   * Returns the output (batch x outputSize), valid until the slot's backward; keeps what the
   * backward needs. `input` stays valid until then too.
   */
  forward(slot: number, input: T, batch: number, weights: T): T;
  /**
   * Backward of the micro-batch in `slot` from the gradient of its output. Returns the input
   * gradient (batch x inputSize) when asked for; the runtime gives it back with `recycle` once
   * sent. Releases the slot unless `weightGrad` is false.
   */
  backward(slot: number, gradOutput: T, options: StageBackwardOptions): T | undefined;
  /** The parameter gradients of a backward run with `weightGrad: false`; releases the slot. Optional: a model without it gets whole backwards. */
  weightGrad?(slot: number, options: { grads: Tensor; accumulate?: boolean }): void;
  /**
   * Floats a forward of `batch` samples keeps until its backward releases the slot, its input
   * included: what the runtime reports as a micro-batch's stored activations. Optional: without
   * it the runtime reports counts of micro-batches only.
   */
  activationFloats?(batch: number): number;
  /** Takes back a buffer that backward returned. Optional. */
  recycle?(buffer: T): void;
  /** Frees everything, the ParamSet included. */
  dispose(): void;
}
