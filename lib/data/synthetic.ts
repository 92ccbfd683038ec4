/**
 * A small deterministic classification problem for tests and examples: `classes` Gaussian-ish
 * clusters in `features` dimensions, whose centres and samples are drawn from a seeded generator,
 * so every rank and every run builds the same data without any download.
 */
import { InvalidArgumentError } from '../errors.js';
import type { Dataset } from './dataset.js';
import { checkSeed, seededRandom } from './seeded-random.js';
import { checkOptions, describeValue, optionKeys } from '../validate.js';

/** @category Data */
export interface SyntheticOptions {
  count: number;
  features: number;
  classes: number;
  /** Spread of the samples around their class centre (centres are in [-1, 1]^features). Default 0.3. */
  noise?: number;
  seed?: number;
}

const SYNTHETIC_OPTION_KEYS = optionKeys<SyntheticOptions>({ count: true, features: true, classes: true, noise: true, seed: true });

/** @category Data */
export function syntheticDataset(options: SyntheticOptions): Dataset {
  checkOptions(options, SYNTHETIC_OPTION_KEYS, 'syntheticDataset(options)');
  const { count, features, classes } = options;
  const check = (v: unknown, name: string, lo: number, hi: number): number => {
    if (typeof v !== 'number' || !Number.isInteger(v) || v < lo || v > hi) throw new InvalidArgumentError(`syntheticDataset: ${name} must be an integer in [${lo}, ${hi}], got ${describeValue(v)}`);
    return v;
  };
  check(count, 'count', 1, 1 << 24);
  check(features, 'features', 1, 1 << 16);
  check(classes, 'classes', 2, 255);
  const noise = options.noise ?? 0.3;
  if (typeof noise !== 'number' || !Number.isFinite(noise) || noise < 0) throw new InvalidArgumentError(`syntheticDataset: noise must be a finite number >= 0, got ${describeValue(noise)}`);
  const next = seededRandom(checkSeed(options.seed ?? 0, 'syntheticDataset: seed'));
  const centres = Float32Array.from({ length: classes * features }, () => next() * 2 - 1);
  const inputs = new Float32Array(count * features);
  const labels = new Uint8Array(count);
  for (let i = 0; i < count; i++) {
    const c = i % classes;
    labels[i] = c;
    for (let j = 0; j < features; j++) {
      // Sum of four uniforms: a cheap, bounded, bell-shaped deviation with unit variance.
      const z = (next() + next() + next() + next() - 2) * 1.7320508;
      inputs[i * features + j] = centres[c * features + j]! + noise * z;
    }
  }
  return { inputs, labels, count, features, classes };
}
