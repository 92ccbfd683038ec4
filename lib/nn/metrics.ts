/** Metrics of a binary classifier's scores. */
import { InvalidArgumentError, SizeMismatchError } from '../errors.js';
import { checkArrayLike } from '../validate.js';

/**
 * Area under the ROC curve: the probability that a random positive scores above a random
 * negative, ties counting one half (the Mann-Whitney statistic, from the ranks of the sorted
 * scores). Labels are 0 or 1; NaN when one class is absent.
 *
 * @category Models
 */
export function rocAuc(scores: ArrayLike<number>, labels: ArrayLike<number>): number {
  checkArrayLike(scores, 'rocAuc(scores, labels): scores');
  checkArrayLike(labels, 'rocAuc(scores, labels): labels');
  const n = scores.length;
  if (labels.length !== n) throw new SizeMismatchError(`rocAuc: ${n} scores and ${labels.length} labels; give one label per score`);
  let positives = 0;
  for (let i = 0; i < n; i++) {
    const l = labels[i]!;
    if (l !== 0 && l !== 1) throw new InvalidArgumentError(`rocAuc: label ${String(l)} at ${i} is not 0 or 1`);
    if (typeof scores[i] !== 'number' || Number.isNaN(scores[i]!)) throw new InvalidArgumentError(`rocAuc: score ${i} is not a number`);
    positives += l;
  }
  const negatives = n - positives;
  if (positives === 0 || negatives === 0) return NaN;
  const order = Array.from({ length: n }, (_, i) => i).sort((a, b) => scores[a]! - scores[b]!);
  // Sum of the positives' ranks (1-based), tied scores sharing their mean rank.
  let rankSum = 0;
  for (let i = 0; i < n; ) {
    let j = i;
    while (j + 1 < n && scores[order[j + 1]!] === scores[order[i]!]) j++;
    const mean = (i + j) / 2 + 1;
    for (let k = i; k <= j; k++) rankSum += labels[order[k]!]! * mean;
    i = j + 1;
  }
  return (rankSum - (positives * (positives + 1)) / 2) / (positives * negatives);
}
