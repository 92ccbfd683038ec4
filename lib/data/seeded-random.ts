/**
 * A small seeded PRNG (mulberry32): data splits and shuffles must be the same on every rank and on
 * every run, which Math.random() cannot give.
 */
import { InvalidArgumentError } from '../errors.js';
import { describeValue } from '../validate.js';

/** Returns a generator of uniform numbers in [0, 1) determined by `seed` (an integer). @category Data */
export function seededRandom(seed: number): () => number {
  checkSeed(seed, 'seededRandom(seed)');
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** A permutation of 0..n-1 (Fisher-Yates) determined by `seed`. @category Data */
export function shuffledIndices(n: number, seed: number): Uint32Array {
  // 2^30 indices are 4 GiB: past that, shuffle in shards.
  if (typeof n !== 'number' || !Number.isInteger(n) || n < 0 || n > 2 ** 30)
    throw new InvalidArgumentError(`shuffledIndices(n): n must be an integer in [0, 2^30], got ${describeValue(n)}`);
  const next = seededRandom(seed);
  const out = new Uint32Array(n);
  for (let i = 0; i < n; i++) out[i] = i;
  for (let i = n - 1; i > 0; i--) {
    const j = Math.floor(next() * (i + 1));
    const tmp = out[i]!;
    out[i] = out[j]!;
    out[j] = tmp;
  }
  return out;
}

/** @category Data */
export function checkSeed(seed: unknown, what: string): number {
  if (typeof seed !== 'number' || !Number.isInteger(seed) || seed < 0 || seed > 0xffffffff)
    throw new InvalidArgumentError(`${typeof what === 'string' ? what : 'seed'} must be an integer in [0, 2^32 - 1], got ${describeValue(seed)}`);
  return seed;
}
