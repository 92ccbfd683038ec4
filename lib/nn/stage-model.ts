/**
 * What a pipeline stage's model implements, so that the pipeline runtime can train any model code:
 * sapipe's {@link Sequential} parts, or a user's own. The runtime owns the schedule, the weight
 * versions, the optimizer and the transfers; the model owns its maths and the per-micro-batch
 * state (activations) between a forward and its backward.
 */
import type { FlatBuffer, ParamSet } from '../tensor.js';

/** Options of {@link StageModel.backward}. @category Models */
export interface StageBackwardOptions {
  /** Where the parameter gradients go; a buffer with the ParamSet's layout. */
  grads: FlatBuffer;
  /** The weights the backward reads (default: those its forward read). */
  weights?: FlatBuffer;
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
export interface StageModel {
  /** The stage's parameters: one flat buffer the optimizer updates in one native call. */
  readonly params: ParamSet;
  /** Features per sample of the input, and of the output (the next stage's input). */
  readonly inputSize: number;
  readonly outputSize: number;
  /**
   * Forward of a micro-batch of `batch` samples (`input`: batch x inputSize, row-major), reading
   * `weights` (a buffer with the ParamSet's layout: the real, a stashed or a predicted version).
   * Returns the output (batch x outputSize), valid until the slot's backward; keeps what the
   * backward needs. `input` stays valid until then too.
   */
  forward(slot: number, input: FlatBuffer, batch: number, weights: FlatBuffer): FlatBuffer;
  /**
   * Backward of the micro-batch in `slot` from the gradient of its output. Returns the input
   * gradient (batch x inputSize) when asked for; the runtime gives it back with `recycle` once
   * sent. Releases the slot unless `weightGrad` is false.
   */
  backward(slot: number, gradOutput: FlatBuffer, options: StageBackwardOptions): FlatBuffer | undefined;
  /** The parameter gradients of a backward run with `weightGrad: false`; releases the slot. Optional: a model without it gets whole backwards. */
  weightGrad?(slot: number, options: { grads: FlatBuffer; accumulate?: boolean }): void;
  /**
   * Floats a forward of `batch` samples keeps until its backward releases the slot, its input
   * included: what the runtime reports as a micro-batch's stored activations. Optional: without
   * it the runtime reports counts of micro-batches only.
   */
  activationFloats?(batch: number): number;
  /** Takes back a buffer that backward returned. Optional. */
  recycle?(buffer: FlatBuffer): void;
  /** Frees everything, the ParamSet included. */
  dispose(): void;
}
