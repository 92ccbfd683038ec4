/**
 * Softmax cross-entropy, averaged over the batch: loss = mean_r(logsumexp(z_r) - z_r[label_r]),
 * and its gradient dLogits = (softmax(z) - onehot(label)) / batch. The max is subtracted before
 * exponentiating so large logits do not overflow.
 */
import { InvalidArgumentError, SizeMismatchError } from '../errors.js';
import { checkArrayLike, checkFloat32Array, describeValue } from '../validate.js';

/** @category Models */
export function softmaxCrossEntropy(
  logits: Float32Array,
  labels: ArrayLike<number>,
  batch: number,
  classes: number,
  dLogits?: Float32Array,
): number {
  checkFloat32Array(logits, 'softmaxCrossEntropy: logits');
  checkArrayLike(labels, 'softmaxCrossEntropy: labels');
  if (dLogits !== undefined) checkFloat32Array(dLogits, 'softmaxCrossEntropy: dLogits');
  if (!Number.isInteger(batch) || batch < 1) throw new InvalidArgumentError(`softmaxCrossEntropy: batch must be a positive integer, got ${describeValue(batch)}`);
  if (!Number.isInteger(classes) || classes < 1)
    throw new InvalidArgumentError(`softmaxCrossEntropy: classes must be a positive integer, got ${describeValue(classes)}`);
  if (logits.length < batch * classes)
    throw new SizeMismatchError(`softmaxCrossEntropy: logits hold ${logits.length} values, batch x classes needs ${batch * classes}`);
  if (labels.length !== batch) throw new SizeMismatchError(`softmaxCrossEntropy: ${labels.length} labels for a batch of ${batch}; give one label per row`);
  if (dLogits && dLogits.length < batch * classes)
    throw new SizeMismatchError(`softmaxCrossEntropy: dLogits holds ${dLogits.length} values, batch x classes needs ${batch * classes}`);
  for (let r = 0; r < batch; r++) {
    const label = labels[r]!;
    if (!Number.isInteger(label) || label < 0 || label >= classes)
      throw new InvalidArgumentError(`softmaxCrossEntropy: label ${describeValue(label)} at row ${r} is not an integer class in [0, ${classes})`);
  }
  let total = 0;
  for (let r = 0; r < batch; r++) {
    const row = r * classes;
    let max = -Infinity;
    for (let j = 0; j < classes; j++) max = Math.max(max, logits[row + j]!);
    let sum = 0;
    for (let j = 0; j < classes; j++) sum += Math.exp(logits[row + j]! - max);
    const label = labels[r]!;
    total += Math.log(sum) + max - logits[row + label]!;
    if (dLogits)
      for (let j = 0; j < classes; j++) dLogits[row + j] = (Math.exp(logits[row + j]! - max) / sum - (j === label ? 1 : 0)) / batch;
  }
  return total / batch;
}
