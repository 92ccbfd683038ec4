/**
 * How a model's backward pass says where it has got to: after each layer's parameter gradients
 * are written (on the CPU) or enqueued (on a device, in order on its default stream), the model
 * calls its listener with the range of the gradient buffer that layer wrote. The data-parallel
 * trainer with device gradients listens, so that each bucket of the gradient is reduced as soon
 * as the backward has enqueued all of it, while the backward still computes the layers below.
 */
import type { Tensor } from './ops.js';

/** [offset, offset + count) of `grads` holds (or, on a device, is enqueued to hold) a layer's parameter gradients. @category Models */
export type GradientListener = (grads: Tensor, offset: number, count: number) => void;

/** A model that reports its backward pass's progress (MLP, Sequential). @category Models */
export interface ReportsGradients {
  /** Calls `listener` after each layer's parameter gradients in every later backward pass; undefined stops. */
  setGradientListener(listener: GradientListener | undefined): void;
}
