// How a range of n elements is split among ranks, as native/comm/partition.h splits it.

/** Part `index` of `parts` of [0, n), as native/comm/partition.h computes it (16-float aligned). */
export function partition(n: number, parts: number, index: number): [number, number] {
  let chunk = Math.ceil(n / parts);
  chunk = Math.ceil(chunk / 16) * 16;
  const lo = Math.min(n, chunk * index);
  return [lo, Math.min(n, lo + chunk)];
}
