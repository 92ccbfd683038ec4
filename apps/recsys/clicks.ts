/**
 * Synthetic click data for the recommendation model: each sample has one categorical value per
 * table, drawn from a Zipf distribution (a few rows are hot, most are rare, as in real click logs),
 * a few dense features, and a click label drawn from a hidden logistic model of those values. The
 * hidden model gives every row its own effect, so rows updated rarely still matter to the loss:
 * what partial recovery loses on them shows in the loss and AUC.
 */
import { readFileSync, writeFileSync } from 'node:fs';

import { CheckpointError, checkSeed, decodeSafetensors, encodeSafetensors, InvalidArgumentError, type SafetensorsTensor, seededRandom } from 'sapipe';
import { checkInteger, checkNumber, checkObject, checkOptions, describeValue, optionKeys } from 'sapipe/validate';

/** Options of {@link syntheticClicks}. @category Recommendation */
export interface ClickDataOptions {
  samples: number;
  /** Rows of each embedding table (one categorical feature per table). */
  tables: readonly number[];
  /** Dense features per sample. Default 4. */
  dense?: number;
  /** Zipf exponent s: P(row of rank k) is proportional to 1 / k^s. Default 1.05. */
  zipf?: number;
  /** Seed of the hidden model (the same for the training and the test set). Default 0. */
  seed?: number;
  /** Seed of the samples drawn from it. Default 1. */
  sampleSeed?: number;
}
const CLICK_OPTION_KEYS = optionKeys<ClickDataOptions>({ samples: true, tables: true, dense: true, zipf: true, seed: true, sampleSeed: true });

/** Click samples: row-major arrays. @category Recommendation */
export interface ClickData {
  readonly samples: number;
  readonly tables: readonly number[];
  readonly denseFeatures: number;
  /** Rows of each table, sample by sample (samples x tables). */
  readonly sparse: Int32Array;
  /** Dense features, sample by sample (samples x denseFeatures). */
  readonly dense: Float32Array;
  /** 1 for a click, 0 otherwise. */
  readonly labels: Uint8Array;
}

/** Box-Muller: a standard normal number from two uniforms. */
function normal(next: () => number): number {
  const u = 1 - next();
  return Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * next());
}

/**
 * Maps a uniform number in [0, 1) to a row of a table of `rows` rows by Zipf(s); which rows are
 * hot is fixed by `permute`, so hot rows are scattered over the table (and over its shards).
 */
function zipfSampler(rows: number, s: number, permute: () => number): (u: number) => number {
  const cdf = new Float64Array(rows);
  let total = 0;
  for (let k = 0; k < rows; k++) cdf[k] = total += 1 / Math.pow(k + 1, s);
  // Rank k is row perm[k]: hot rows land on every shard, not all on the first.
  const perm = new Int32Array(rows);
  for (let i = 0; i < rows; i++) perm[i] = i;
  for (let i = rows - 1; i > 0; i--) {
    const j = Math.floor(permute() * (i + 1));
    [perm[i], perm[j]] = [perm[j]!, perm[i]!];
  }
  return (uniform) => {
    const u = uniform * total;
    let lo = 0;
    let hi = rows - 1;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (cdf[mid]! < u) lo = mid + 1;
      else hi = mid;
    }
    return perm[lo]!;
  };
}

/**
 * Generates click samples. The hidden model: logit = sum over tables of effect[t][row] + the
 * dot product of the first two tables' row vectors (an interaction the MLP must learn) + w . dense
 * - 1; P(click) = sigmoid(logit).
 *
 * @category Recommendation
 */
export function syntheticClicks(options: ClickDataOptions): ClickData {
  checkOptions(options, CLICK_OPTION_KEYS, 'syntheticClicks(options)');
  const samples = checkInteger(options.samples, 'syntheticClicks: samples', 1, 1 << 26);
  if (!Array.isArray(options.tables) || options.tables.length < 1 || options.tables.length > 64)
    throw new InvalidArgumentError('syntheticClicks: tables must list 1 to 64 table sizes (rows), e.g. [10000, 5000]');
  const tables = options.tables.map((r, i) => checkInteger(r, `syntheticClicks: tables[${i}]`, 1, 1 << 24));
  const denseFeatures = checkInteger(options.dense ?? 4, 'syntheticClicks: dense', 0, 1024);
  if (samples * (tables.length + denseFeatures) > 1 << 28 || tables.reduce((a, b) => a + b, 0) > 1 << 26)
    throw new InvalidArgumentError('syntheticClicks: at most 2^28 values of samples (samples x (tables + dense)) and 2^26 rows over the tables; generate in parts');
  const s = checkNumber(options.zipf ?? 1.05, 'syntheticClicks: zipf', 0, 4);
  const seed = checkSeed(options.seed ?? 0, 'syntheticClicks: seed');
  const sampleSeed = checkSeed(options.sampleSeed ?? 1, 'syntheticClicks: sampleSeed');

  // The hidden model, from `seed` only.
  const model = seededRandom(seed);
  const samplers = tables.map((rows) => zipfSampler(rows, s, model));
  const effects = tables.map((rows) => Float32Array.from({ length: rows }, () => 0.8 * normal(model)));
  const VECTOR = 4;
  const vectors = tables.slice(0, 2).map((rows) => Float32Array.from({ length: rows * VECTOR }, () => 0.7 * normal(model)));
  const w = Float32Array.from({ length: denseFeatures }, () => 0.5 * normal(model));

  // The samples, from `sampleSeed`.
  const next = seededRandom(sampleSeed);
  const T = tables.length;
  const sparse = new Int32Array(samples * T);
  const dense = new Float32Array(samples * denseFeatures);
  const labels = new Uint8Array(samples);
  for (let i = 0; i < samples; i++) {
    let logit = -1;
    for (let t = 0; t < T; t++) {
      const row = samplers[t]!(next());
      sparse[i * T + t] = row;
      logit += effects[t]![row]!;
    }
    if (vectors.length === 2) {
      const a = sparse[i * T]! * VECTOR;
      const b = sparse[i * T + 1]! * VECTOR;
      for (let j = 0; j < VECTOR; j++) logit += vectors[0]![a + j]! * vectors[1]![b + j]!;
    }
    for (let j = 0; j < denseFeatures; j++) {
      const x = normal(next);
      dense[i * denseFeatures + j] = x;
      logit += w[j]! * x;
    }
    labels[i] = next() < 1 / (1 + Math.exp(-logit)) ? 1 : 0;
  }
  return { samples, tables, denseFeatures, sparse, dense, labels };
}

/**
 * Writes click data to a safetensors file (`sparse` and `labels` as I32, `dense` as F32), so that
 * the ranks of a job read one generated data set instead of each generating it.
 *
 * @category Recommendation
 */
export function writeClickData(path: string, data: ClickData): void {
  if (typeof path !== 'string' || path === '') throw new InvalidArgumentError('writeClickData: path must be a file path');
  checkClickData(data, 'writeClickData(path, data): data');
  const T = data.tables.length;
  const tensors = new Map<string, SafetensorsTensor>([
    ['sparse', { shape: [data.samples, T], data: data.sparse }],
    ['dense', { shape: [data.samples, data.denseFeatures], data: data.dense }],
    ['labels', { shape: [data.samples], data: Int32Array.from(data.labels) }],
  ]);
  try {
    writeFileSync(path, Buffer.concat(encodeSafetensors(tensors, { tables: JSON.stringify(data.tables) })));
  } catch (error) {
    throw new CheckpointError(`writeClickData: cannot write ${path} (${(error as Error).message})`, { reason: 'missing', cause: error });
  }
}

/**
 * Checks that `data` is click data (syntheticClicks' or readClickData's shape): its arrays of the
 * right types and lengths and, with `rows` (default), every row inside its table (a pass over the
 * data: a training step leaves it out, the embedding checks its batch's rows). Throws
 * InvalidArgumentError naming what is wrong.
 *
 * @category Recommendation
 */
export function checkClickData(data: unknown, what = 'data', rows = true): asserts data is ClickData {
  if (typeof what !== 'string') what = 'data';
  if (typeof rows !== 'boolean') throw new InvalidArgumentError(`checkClickData: rows must be true or false, got ${describeValue(rows)}`);
  checkObject(data, what);
  const d = data as Partial<ClickData>;
  const samples = checkInteger(d.samples, `${what}.samples`, 1, 1 << 30);
  if (!Array.isArray(d.tables) || d.tables.length < 1) throw new InvalidArgumentError(`${what}.tables must list the rows of each table`);
  const tables = d.tables.map((r, i) => checkInteger(r, `${what}.tables[${i}]`, 1, 1 << 24));
  const dense = checkInteger(d.denseFeatures, `${what}.denseFeatures`, 0, 1024);
  if (!(d.sparse instanceof Int32Array) || d.sparse.length !== samples * tables.length)
    throw new InvalidArgumentError(`${what}.sparse must be an Int32Array of samples x tables (${samples * tables.length}) rows`);
  if (!(d.dense instanceof Float32Array) || d.dense.length !== samples * dense)
    throw new InvalidArgumentError(`${what}.dense must be a Float32Array of samples x denseFeatures (${samples * dense}) values`);
  if (!(d.labels instanceof Uint8Array) || d.labels.length !== samples) throw new InvalidArgumentError(`${what}.labels must be a Uint8Array of ${samples} labels (0 or 1)`);
  if (!rows) return;
  const T = tables.length;
  for (let i = 0; i < d.sparse.length; i++) {
    const row = d.sparse[i]!;
    if (row < 0 || row >= tables[i % T]!) throw new InvalidArgumentError(`${what}.sparse[${i}] = ${row} is outside table ${i % T}'s ${tables[i % T]} rows`);
  }
}

/** Reads what writeClickData wrote; a file of another shape is a CheckpointError naming it. @category Recommendation */
export function readClickData(path: string): ClickData {
  if (typeof path !== 'string' || path === '') throw new InvalidArgumentError('readClickData: path must be a file path');
  let bytes: Buffer;
  try {
    bytes = readFileSync(path);
  } catch (error) {
    throw new CheckpointError(`readClickData: cannot read ${path} (${(error as Error).message})`, { reason: 'missing', cause: error });
  }
  const { tensors, metadata } = decodeSafetensors(bytes, path);
  const sparse = tensors.get('sparse');
  const dense = tensors.get('dense');
  const labels = tensors.get('labels');
  let tables: number[];
  try {
    tables = JSON.parse(metadata.tables ?? '') as number[];
  } catch (error) {
    throw new CheckpointError(`${path}: not click data (no table sizes)`, { reason: 'foreign', cause: error });
  }
  if (!(sparse?.data instanceof Int32Array) || !(dense?.data instanceof Float32Array) || !(labels?.data instanceof Int32Array) || !Array.isArray(tables))
    throw new CheckpointError(`${path}: not click data (sparse, dense, labels)`, { reason: 'foreign' });
  const samples = labels.data.length;
  const data = { samples, tables, denseFeatures: dense.shape[1]!, sparse: sparse.data, dense: dense.data, labels: Uint8Array.from(labels.data) };
  try {
    checkClickData(data, path);
  } catch (error) {
    throw new CheckpointError(`${path}: not consistent click data: ${(error as Error).message}`, { reason: 'corrupt', cause: error });
  }
  return data;
}
