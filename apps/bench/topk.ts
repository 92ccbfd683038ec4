/**
 * MSTopK against the exact top-k in the same run (the selection goal: at least 5x faster), and
 * its memory traffic against the same run's copy bandwidth: the fused pass that forms x = g + r
 * (reads g and r, writes r) and each later read of x, over the time of the whole selection.
 */
import { performance } from 'node:perf_hooks';

import { FlatBuffer, mstopk, topkExact } from 'sapipe';
import { checkInteger, checkNumber } from 'sapipe/validate';
import { nativeAddon } from 'sapipe/kernels';
import { gigabytesPerSecond, median } from './timing.js';

export interface TopkBenchRow {
  density: number;
  k: number;
  mstopkMs: number;
  exactMs: number;
  /** exactMs / mstopkMs (goal: at least 5). */
  speedup: number;
  passes: number;
  recall: number;
  /** Bytes MSTopK moves (12 per element to form x, 4 per element per later read) over its time, GB/s. */
  gbps: number;
  /** gbps over the same run's copy bandwidth. */
  ofCopy: number;
}

export async function benchTopk(options: { elements: number; densities: readonly number[]; reps: number }): Promise<{ elements: number; copyGbps: number; rows: TopkBenchRow[] }> {
  const n = checkInteger(options.elements, 'bench topk: elements', 1, 2 ** 31 - 1);
  const reps = checkInteger(options.reps, 'bench topk: reps', 1, 1000);
  for (const d of options.densities) checkNumber(d, 'bench topk: density', 0, 1, { loOpen: true });
  const addon = nativeAddon();
  const grad = FlatBuffer.allocate(n);
  const residual = FlatBuffer.allocate(n);
  const copy = FlatBuffer.allocate(n);
  try {
    // Gaussian samples, seeded.
    let s = 12345;
    const u = (): number => ((s = (Math.imul(s, 1664525) + 1013904223) >>> 0) + 0.5) / 2 ** 32;
    for (let i = 0; i < n; i++) grad.array[i] = Math.sqrt(-2 * Math.log(u())) * Math.cos(2 * Math.PI * u());
    const copies: number[] = [];
    for (let r = 0; r < reps + 1; r++) {
      const t0 = performance.now();
      addon.copy(copy.handle, grad.handle);
      if (r > 0) copies.push(performance.now() - t0);
    }
    const copyGbps = gigabytesPerSecond(n, 8, median(copies));
    const rows: TopkBenchRow[] = [];
    for (const density of options.densities) {
      const k = Math.max(1, Math.round(density * n));
      const fast: number[] = [];
      const exactTimes: number[] = [];
      let passes = 0;
      let recall = 0;
      for (let r = 0; r < reps + 1; r++) {
        residual.array.fill(0);
        let t0 = performance.now();
        const sel = mstopk(grad, { k, residual });
        const m = performance.now() - t0;
        t0 = performance.now();
        const ex = topkExact(grad, k);
        const e = performance.now() - t0;
        if (r === 0) continue;
        fast.push(m);
        exactTimes.push(e);
        passes = sel.passes;
        const set = new Set(ex.indices);
        recall = sel.indices.filter((i) => set.has(i)).length / k;
      }
      const mstopkMs = median(fast);
      const exactMs = median(exactTimes);
      const gbps = (n * (12 + 4 * passes)) / (mstopkMs * 1e6);
      rows.push({ density, k, mstopkMs, exactMs, speedup: exactMs / mstopkMs, passes, recall, gbps, ofCopy: gbps / copyGbps });
    }
    return { elements: n, copyGbps, rows };
  } finally {
    grad.dispose();
    residual.dispose();
    copy.dispose();
  }
}
