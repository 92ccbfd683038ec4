/**
 * Plain-TypeScript references for top-k sparsification (docs/ALGORITHMS.md section 6): the exact
 * top-k by magnitude (a sort; ties to the lower index) and the dense sum of sparse contributions.
 */

/** Indices (ascending) of the k largest |x|, ties to the lower index. */
export function exactTopk(x: ArrayLike<number>, k: number): number[] {
  if (k === 0) return [];
  // The k-th largest magnitude from a sorted copy; then, in index order, every larger one and as
  // many equal ones as fit (the lowest indices first).
  const magnitudes = Float64Array.from(x, (v) => Math.abs(v)).sort();
  const kth = magnitudes[x.length - k]!;
  let above = 0;
  for (let i = 0; i < x.length; i++) if (Math.abs(x[i]!) > kth) above++;
  let ties = k - above;
  const out: number[] = [];
  for (let i = 0; i < x.length; i++) {
    const a = Math.abs(x[i]!);
    if (a > kth || (a === kth && ties-- > 0)) out.push(i);
  }
  return out;
}

/** out[indices[i]] += scale * values[i], in fp32 as the kernel adds (the scale itself an fp32). */
export function scatterAddRef(out: Float32Array, indices: ArrayLike<number>, values: ArrayLike<number>, scale: number): void {
  const s = Math.fround(scale);
  for (let i = 0; i < indices.length; i++) out[indices[i]!] = Math.fround(out[indices[i]!]! + Math.fround(s * values[i]!));
}

/** Seeded samples: standard normal, or heavy-tailed (normal over the square root of a uniform: Student-t like, unbounded variance). */
export function samples(n: number, kind: 'gaussian' | 'heavy', seed: number): Float32Array {
  let s = seed >>> 0 || 1;
  const uniform = (): number => ((s = (Math.imul(s, 1664525) + 1013904223) >>> 0) + 0.5) / 2 ** 32;
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) {
    const z = Math.sqrt(-2 * Math.log(uniform())) * Math.cos(2 * Math.PI * uniform());
    out[i] = kind === 'gaussian' ? z : z / Math.sqrt(uniform());
  }
  return out;
}
