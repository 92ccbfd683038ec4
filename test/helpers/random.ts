/** The package's seeded PRNG (mulberry32), so every test run sees the same data. */
export { seededRandom as rng } from '../../dist/data/seeded-random.js';

/** Approximately standard-normal values (sum of uniforms) scaled by `scale`. */
export function fillNormal(out: Float32Array, next: () => number, scale = 1): Float32Array {
  for (let i = 0; i < out.length; i++) out[i] = (next() + next() + next() + next() - 2) * 1.7320508 * scale;
  return out;
}

export function fillUniform(out: Float32Array, next: () => number, lo = -1, hi = 1): Float32Array {
  for (let i = 0; i < out.length; i++) out[i] = lo + (hi - lo) * next();
  return out;
}

/** Largest |a - b| / (atol + rtol*|b|): <= 1 means within tolerance. Also returns where. */
export function worstError(a: Float32Array, b: Float32Array, atol: number, rtol: number): { ratio: number; index: number } {
  let ratio = 0;
  let index = -1;
  for (let i = 0; i < a.length; i++) {
    const r = Math.abs(a[i]! - b[i]!) / (atol + rtol * Math.abs(b[i]!));
    if (!(r <= ratio)) {
      ratio = r;
      index = i;
      if (Number.isNaN(r)) return { ratio: Infinity, index: i };
    }
  }
  return { ratio, index };
}
