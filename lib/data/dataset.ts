/**
 * A labelled data set held as one flat Float32Array of samples (row-major [count, features]) and
 * one label per sample, with the deterministic operations training needs: subsets, a seeded
 * train/test split, seeded shuffles and per-rank shards.
 */
import { InvalidArgumentError, SizeMismatchError } from '../errors.js';
import { checkSeed, shuffledIndices } from './seeded-random.js';
import { describeValue } from '../validate.js';

/** @category Data */
export interface Dataset {
  /** Samples, row-major [count, features]. */
  readonly inputs: Float32Array;
  /** Class of each sample, in [0, classes). */
  readonly labels: Uint8Array;
  readonly count: number;
  readonly features: number;
  readonly classes: number;
}

/** Checks that the parts of a data set agree; returns it typed. @category Data */
export function checkDataset(d: unknown, whatArg: string = 'dataset'): Dataset {
  const what = typeof whatArg === 'string' ? whatArg : 'dataset';
  if (d === null || typeof d !== 'object') throw new InvalidArgumentError(`${what} must be a Dataset object ({ inputs, labels, count, features, classes })`);
  const { inputs, labels, count, features, classes } = d as Dataset;
  if (!(inputs instanceof Float32Array)) throw new InvalidArgumentError(`${what}.inputs must be a Float32Array`);
  if (!(labels instanceof Uint8Array)) throw new InvalidArgumentError(`${what}.labels must be a Uint8Array`);
  for (const [v, name, lo] of [[count, 'count', 0], [features, 'features', 1], [classes, 'classes', 1]] as const)
    if (typeof v !== 'number' || !Number.isInteger(v) || v < lo) throw new InvalidArgumentError(`${what}.${name} must be an integer >= ${lo}, got ${describeValue(v)}`);
  if (inputs.length !== count * features)
    throw new SizeMismatchError(`${what}: inputs has ${inputs.length} values; count x features is ${count * features}`);
  if (labels.length !== count) throw new SizeMismatchError(`${what}: labels has ${labels.length} entries, count is ${count}`);
  return d as Dataset;
}

/** The samples at `indices`, in that order (copies). @category Data */
export function selectSamples(dataset: Dataset, indices: ArrayLike<number>): Dataset {
  const d = checkDataset(dataset);
  const f = d.features;
  const inputs = new Float32Array(indices.length * f);
  const labels = new Uint8Array(indices.length);
  for (let k = 0; k < indices.length; k++) {
    const i = indices[k]!;
    if (!Number.isInteger(i) || i < 0 || i >= d.count)
      throw new InvalidArgumentError(`selectSamples: index ${describeValue(i)} is outside [0, ${d.count})`);
    inputs.set(d.inputs.subarray(i * f, (i + 1) * f), k * f);
    labels[k] = d.labels[i]!;
  }
  return { inputs, labels, count: indices.length, features: f, classes: d.classes };
}

/** The data set in an order determined by `seed`. @category Data */
export function shuffleDataset(dataset: Dataset, seed: number): Dataset {
  const d = checkDataset(dataset);
  return selectSamples(d, shuffledIndices(d.count, checkSeed(seed, 'shuffleDataset(seed)')));
}

/** @category Data */
export interface SplitOptions {
  /** Fraction of the samples that go to the test set, in (0, 1). Default 0.2. */
  testFraction?: number;
  /** Seed of the permutation that decides which samples go where. Default 0. */
  seed?: number;
}

/** A seeded random split: the same seed gives the same split on every rank and every run. @category Data */
export function trainTestSplit(dataset: Dataset, options: SplitOptions = {}): { train: Dataset; test: Dataset } {
  const d = checkDataset(dataset);
  if (options === null || typeof options !== 'object') throw new InvalidArgumentError('trainTestSplit(options) must be an object');
  const fraction = options.testFraction ?? 0.2;
  if (typeof fraction !== 'number' || !(fraction > 0 && fraction < 1))
    throw new InvalidArgumentError(`trainTestSplit: testFraction must be a number in (0, 1), got ${describeValue(fraction)}`);
  const order = shuffledIndices(d.count, checkSeed(options.seed ?? 0, 'trainTestSplit: seed'));
  const testCount = Math.round(d.count * fraction);
  if (testCount === 0 || testCount === d.count)
    throw new InvalidArgumentError(`trainTestSplit: ${d.count} samples with testFraction ${fraction} leave one side empty; use more samples or another fraction`);
  return { test: selectSamples(d, order.subarray(0, testCount)), train: selectSamples(d, order.subarray(testCount)) };
}

/** Rank `rank`'s share of `size` (every size-th sample from `rank`), so ranks see disjoint data. @category Data */
export function shardDataset(dataset: Dataset, rank: number, size: number): Dataset {
  const d = checkDataset(dataset);
  if (!Number.isInteger(size) || size < 1) throw new InvalidArgumentError(`shardDataset: size must be a positive integer, got ${describeValue(size)}`);
  if (!Number.isInteger(rank) || rank < 0 || rank >= size) throw new InvalidArgumentError(`shardDataset: rank must be an integer in [0, ${size}), got ${describeValue(rank)}`);
  const indices: number[] = [];
  for (let i = rank; i < d.count; i += size) indices.push(i);
  return selectSamples(d, indices);
}
