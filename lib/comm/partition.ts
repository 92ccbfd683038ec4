// How a range of n elements is split among ranks, as native/comm/partition.h splits it.
import { checkInteger } from '../validate.js';

/** Part `index` of `parts` of [0, n), as native/comm/partition.h computes it (16-float aligned). @category Communication */
export function partition(n: number, parts: number, index: number): [number, number] {
  checkInteger(n, 'partition(n, parts, index): n', 0, Number.MAX_SAFE_INTEGER);
  checkInteger(parts, 'partition(n, parts, index): parts', 1, 1 << 24);
  checkInteger(index, 'partition(n, parts, index): index', 0, parts - 1);
  let chunk = Math.ceil(n / parts);
  chunk = Math.ceil(chunk / 16) * 16;
  const lo = Math.min(n, chunk * index);
  return [lo, Math.min(n, lo + chunk)];
}
