/** What the benchmarks share: the median of repeated runs, and bandwidth in GB/s. */
export interface TimingOptions {
  warmup: number;
  reps: number;
}

export function median(values: readonly number[]): number {
  if (values.length === 0) return NaN;
  const sorted = [...values].sort((a, b) => a - b);
  const mid = sorted.length >> 1;
  return sorted.length % 2 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2;
}

/** GB/s (1e9 bytes per second) of `elements` x `bytesPerElement` moved in `ms`. */
export function gigabytesPerSecond(elements: number, bytesPerElement: number, ms: number): number {
  return (elements * bytesPerElement) / (ms * 1e6);
}
