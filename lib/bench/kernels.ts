/**
 * `sapipe bench kernels`: every fused update variant at one size, as effective bandwidth (bytes
 * counted as ALGORITHMS.md counts them) and as a ratio to a triad kernel (a[i] = b[i] + s*c[i],
 * 24 B per element) measured in the same run with the same threads.
 *
 * Each variant is timed twice: the fused kernel alone (the gradient's finiteness already known, as
 * after sapipe's reductions and all-reduce, which count non-finite values while they write), and a
 * standalone step whose non-finite guard first reads the gradients once more. The guard's read is
 * not in the counted bytes, so the second ratio shows its whole cost.
 */
import { nativeAddon, type NativeBufferHandle } from '../native.js';
import { KERNEL_VARIANTS, allocateBuffers } from '../optim/variants.js';
import { gigabytesPerSecond, timeSync, type TimingOptions } from './timing.js';

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
  /** The triad reference: the better of a measurement before and one after the variants. */
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

function measureTriad(elements: number, timing: TimingOptions): { medianMs: number; gbps: number } {
  const addon = nativeAddon();
  const [a, b, c] = [0, 1, 2].map(() => new addon.NativeBuffer(elements)) as [NativeBufferHandle, NativeBufferHandle, NativeBufferHandle];
  try {
    fillDistinct(a.array, 1, -1, 1);
    fillDistinct(b.array, 2, -1, 1);
    fillDistinct(c.array, 3, -1, 1);
    const ms = timeSync(() => addon.triad(a, b, c, 0.5), timing);
    return { medianMs: ms, gbps: gigabytesPerSecond(elements, 24, ms) };
  } finally {
    for (const x of [a, b, c]) x.dispose();
  }
}

export function benchKernels(options: KernelBenchOptions): KernelBenchResult {
  const addon = nativeAddon();
  const info = addon.info();
  const variants = KERNEL_VARIANTS.filter((v) => !options.filter || v.name.includes(options.filter));
  const total = variants.length + 2;
  let done = 0;
  const progress = (label: string): void => options.onProgress?.(done, total, label);
  progress('triad');
  const triadBefore = measureTriad(options.elements, options);
  done++;
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
      const time = (gradChecked: boolean): number =>
        timeSync(() => {
          const r = addon.update({ ...variant.config, step, havePrevLocal: step > 1, momentumIsEmpty: false, gradChecked }, buffers);
          if (!r.applied) throw new Error(`${variant.name}: step unexpectedly skipped`);
          step++;
        }, options);
      const ms = time(true);
      const guardedMs = time(false);
      const bytes = addon.updateBytesPerElement(variant.config);
      rows.push({
        name: variant.name,
        elements: options.elements,
        bytesPerElement: bytes,
        medianMs: ms,
        gbps: gigabytesPerSecond(options.elements, bytes, ms),
        ratioToTriad: 0,
        guardedMs,
        guardedRatioToTriad: 0,
      });
    } finally {
      for (const h of handles) h.dispose();
    }
    done++;
  }
  progress('triad');
  const triadAfter = measureTriad(options.elements, options);
  done++;
  progress('done');
  const triad = triadAfter.gbps > triadBefore.gbps ? triadAfter : triadBefore;
  for (const row of rows) {
    row.ratioToTriad = row.gbps / triad.gbps;
    row.guardedRatioToTriad = gigabytesPerSecond(row.elements, row.bytesPerElement, row.guardedMs) / triad.gbps;
  }
  return { elements: options.elements, threads: info.threads, simd: info.simd, triad, rows };
}
