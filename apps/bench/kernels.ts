/**
 * `sapipe bench kernels`: every fused update variant at one size, as effective bandwidth (bytes
 * counted as ALGORITHMS.md counts them) and as a ratio to STREAM's triad (a[i] = b[i] + s*c[i] on
 * doubles, 24 B per element) measured in the same run with the same threads, its runs interleaved with the
 * variant's so that both see the same memory system.
 *
 * Each variant is timed twice: the fused kernel alone (the gradient's finiteness already known, as
 * after sapipe's reductions and all-reduce, which count non-finite values while they write), and a
 * standalone step whose non-finite guard first reads the gradients once more. The guard's read is
 * not in the counted bytes, so the second ratio shows its whole cost.
 */
import { InvalidArgumentError } from 'sapipe';
import { nativeAddon, type NativeBufferHandle } from 'sapipe/kernels';
import { allocateBuffers, KERNEL_VARIANTS } from './kernel-variants.js';
import { gigabytesPerSecond, median, type TimingOptions } from './timing.js';
import { performance } from 'node:perf_hooks';

export interface KernelBenchRow {
  name: string;
  elements: number;
  bytesPerElement: number;
  /** The fused kernel alone (gradChecked). */
  medianMs: number;
  gbps: number;
  /** gbps / triad gbps of the same run. */
  ratioToTriad: number;
  /** A standalone step: the guard's scan of the gradients, then the fused kernel. */
  guardedMs: number;
  guardedRatioToTriad: number;
}

export interface KernelBenchResult {
  elements: number;
  threads: number;
  simd: string;
  /** The triad reference: the median over every triad run interleaved with the variants. */
  triad: { medianMs: number; gbps: number };
  rows: KernelBenchRow[];
}

export interface KernelBenchOptions extends TimingOptions {
  elements: number;
  /** Only variants whose name includes this string. */
  filter?: string;
  onProgress?: (done: number, total: number, label: string) => void;
}

/**
 * Fills with distinct pseudo-random values in [lo, hi). Benchmarks must not use constant fills:
 * identical pages can be merged by the host (same-page merging), and reading them then measures a
 * cache, not memory.
 */
export function fillDistinct(array: Float32Array, seed: number, lo: number, hi: number): void {
  let state = seed >>> 0 || 1;
  const span = (hi - lo) / 4294967296;
  for (let i = 0; i < array.length; i++) {
    state = (Math.imul(state, 1664525) + 1013904223) >>> 0;
    array[i] = lo + state * span;
  }
}

/** STREAM's triad a[i] = b[i] + s*c[i] on doubles (24 B per element), on its own buffers. */
class Triad {
  private readonly buffers: [NativeBufferHandle, NativeBufferHandle, NativeBufferHandle];
  constructor(elements: number) {
    const addon = nativeAddon();
    this.buffers = [0, 1, 2].map(() => new addon.NativeBuffer(2 * elements)) as [NativeBufferHandle, NativeBufferHandle, NativeBufferHandle];
    this.buffers.forEach((b, i) => {
      const doubles = new Float64Array(b.array.buffer, b.array.byteOffset, elements);
      let state = i + 1;
      for (let j = 0; j < elements; j++) {
        state = (Math.imul(state, 1664525) + 1013904223) >>> 0;
        doubles[j] = state / 4294967296 - 0.5;
      }
    });
  }
  run(): void {
    const [a, b, c] = this.buffers;
    nativeAddon().triad(a, b, c, 0.5);
  }
  dispose(): void {
    for (const b of this.buffers) b.dispose();
  }
}

/**
 * Median times of `kernel` and of the triad, run alternately so both see the same machine state
 * (memory bandwidth on shared hosts drifts by tens of percent within seconds).
 */
function timeAgainstTriad(kernel: () => void, triad: Triad, { warmup, reps }: TimingOptions): { kernelMs: number; triadMs: number[] } {
  for (let i = 0; i < warmup; i++) {
    kernel();
    triad.run();
  }
  const kernelTimes: number[] = [];
  const triadTimes: number[] = [];
  for (let i = 0; i < reps; i++) {
    let start = performance.now();
    kernel();
    kernelTimes.push(performance.now() - start);
    start = performance.now();
    triad.run();
    triadTimes.push(performance.now() - start);
  }
  return { kernelMs: median(kernelTimes), triadMs: triadTimes };
}

export function benchKernels(options: KernelBenchOptions): KernelBenchResult {
  const addon = nativeAddon();
  const info = addon.info();
  const variants = selectVariants(options.filter);
  const total = variants.length;
  let done = 0;
  const progress = (label: string): void => options.onProgress?.(done, total, label);
  const triad = new Triad(options.elements);
  const allTriadTimes: number[] = [];
  const rows: KernelBenchRow[] = [];
  for (const variant of variants) {
    progress(variant.name);
    const handles: NativeBufferHandle[] = [];
    try {
      const buffers = allocateBuffers(variant.config, () => {
        const h = new addon.NativeBuffer(options.elements);
        handles.push(h);
        return h;
      });
      // Distinct small finite values in every buffer (this also first-touches every page).
      handles.forEach((h, i) => fillDistinct(h.array, 17 + i, h === buffers.weights ? -1 : 1e-4, h === buffers.weights ? 1 : 1e-3));
      let step = 1;
      const stepper = (gradChecked: boolean) => (): void => {
        const r = addon.update({ ...variant.config, step, havePrevLocal: step > 1, momentumIsEmpty: false, gradChecked }, buffers);
        if (!r.applied) throw new Error(`${variant.name}: step unexpectedly skipped`);
        step++;
      };
      const fused = timeAgainstTriad(stepper(true), triad, options);
      const guarded = timeAgainstTriad(stepper(false), triad, options);
      const triadTimes = [...fused.triadMs, ...guarded.triadMs];
      allTriadTimes.push(...triadTimes);
      const triadGbps = gigabytesPerSecond(options.elements, 24, median(triadTimes));
      const bytes = addon.updateBytesPerElement(variant.config);
      const gbps = gigabytesPerSecond(options.elements, bytes, fused.kernelMs);
      rows.push({
        name: variant.name,
        elements: options.elements,
        bytesPerElement: bytes,
        medianMs: fused.kernelMs,
        gbps,
        ratioToTriad: gbps / triadGbps,
        guardedMs: guarded.kernelMs,
        guardedRatioToTriad: gigabytesPerSecond(options.elements, bytes, guarded.kernelMs) / triadGbps,
      });
    } finally {
      for (const h of handles) h.dispose();
    }
    done++;
  }
  progress('done');
  triad.dispose();
  const triadMs = median(allTriadTimes);
  return {
    elements: options.elements,
    threads: info.threads,
    simd: info.simd,
    triad: { medianMs: triadMs, gbps: gigabytesPerSecond(options.elements, 24, triadMs) },
    rows,
  };
}

/** The variants whose name contains `filter` (all without one); none is an error that lists the names. */
export function selectVariants(filter: string | undefined): typeof KERNEL_VARIANTS {
  const variants = KERNEL_VARIANTS.filter((v) => filter === undefined || filter === '' || v.name.includes(filter));
  if (variants.length === 0)
    throw new InvalidArgumentError(`--filter ${JSON.stringify(filter)} matches no kernel; the kernels are: ${KERNEL_VARIANTS.map((v) => v.name).join(', ')}`);
  return variants;
}
