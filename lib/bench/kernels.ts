/**
 * `sapipe bench kernels`: every fused update variant at one size, as effective bandwidth (bytes
 * counted as ALGORITHMS.md counts them) and as a ratio to a triad kernel (a[i] = b[i] + s*c[i],
 * 24 B per element) measured in the same run with the same threads. The non-finite guard's scan is
 * part of every timed step, but not of the counted bytes, so the ratios are conservative.
 */
import { nativeAddon, type NativeBufferHandle } from '../native.js';
import { KERNEL_VARIANTS, allocateBuffers } from '../optim/variants.js';
import { gigabytesPerSecond, timeSync, type TimingOptions } from './timing.js';

export interface KernelBenchRow {
  name: string;
  elements: number;
  bytesPerElement: number;
  medianMs: number;
  gbps: number;
  /** gbps / triad gbps of the same run. */
  ratioToTriad: number;
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

function measureTriad(elements: number, timing: TimingOptions): { medianMs: number; gbps: number } {
  const addon = nativeAddon();
  const [a, b, c] = [0, 1, 2].map(() => new addon.NativeBuffer(elements)) as [NativeBufferHandle, NativeBufferHandle, NativeBufferHandle];
  try {
    b.array.fill(1);
    c.array.fill(2);
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
      // Small finite gradients and weights; first-touch every page before timing.
      buffers.weights.array.fill(0.5);
      for (const h of handles) if (h !== buffers.weights) h.array.fill(1e-3);
      let step = 1;
      const ms = timeSync(() => {
        const r = addon.update({ ...variant.config, step, havePrevLocal: step > 1, momentumIsEmpty: false }, buffers);
        if (!r.applied) throw new Error(`${variant.name}: step unexpectedly skipped`);
        step++;
      }, options);
      const bytes = addon.updateBytesPerElement(variant.config);
      rows.push({
        name: variant.name,
        elements: options.elements,
        bytesPerElement: bytes,
        medianMs: ms,
        gbps: gigabytesPerSecond(options.elements, bytes, ms),
        ratioToTriad: 0,
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
  for (const row of rows) row.ratioToTriad = row.gbps / triad.gbps;
  return { elements: options.elements, threads: info.threads, simd: info.simd, triad, rows };
}
