/** Timing helpers shared by the benchmarks: median of repeated runs after warm-up. */
import { performance } from 'node:perf_hooks';

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

/** Median milliseconds of `fn` over `reps` runs after `warmup` unmeasured runs. */
export function timeSync(fn: () => void, { warmup, reps }: TimingOptions): number {
  for (let i = 0; i < warmup; i++) fn();
  const times: number[] = [];
  for (let i = 0; i < reps; i++) {
    const start = performance.now();
    fn();
    times.push(performance.now() - start);
  }
  return median(times);
}

/** Median milliseconds of an async `fn`, each run awaited before the next. */
export async function timeAsync(fn: () => Promise<unknown>, { warmup, reps }: TimingOptions): Promise<number> {
  for (let i = 0; i < warmup; i++) await fn();
  const times: number[] = [];
  for (let i = 0; i < reps; i++) {
    const start = performance.now();
    await fn();
    times.push(performance.now() - start);
  }
  return median(times);
}

/** GB/s (1e9 bytes per second) of `elements` x `bytesPerElement` moved in `ms`. */
export function gigabytesPerSecond(elements: number, bytesPerElement: number, ms: number): number {
  return (elements * bytesPerElement) / (ms * 1e6);
}
