/**
 * Batches for training from a sample source: each epoch in its own seeded order, each rank its own
 * share of it, every rank the same number of batches (so no data-parallel rank waits on a peer
 * that ran out). An epoch copies no data set: it permutes an index array the loader keeps, and
 * fills two batch buffers it reuses, reading each sample from the source (memory, or a file
 * through the block cache).
 *
 * Sources: an in-memory Dataset (`datasetSource`), an IDX image/label pair read through the file
 * caches (`idxSource`), and a token sequence cut into next-token windows for a language model
 * (`tokenSource`).
 */
import { DisposedError, InvalidArgumentError, SizeMismatchError } from '../errors.js';
import { checkBoolean, checkInteger, checkOptions, describeValue, optionKeys } from '../validate.js';
import { checkDataset, type Dataset } from './dataset.js';
import { decompressedCopy, FileBlockCache, type FileBlockCacheOptions, type FileBlockCacheStats } from './file-cache.js';
import { decodeIdx } from './idx.js';
import { checkSeed, seededRandom } from './seeded-random.js';

/**
 * Where samples come from. A sample is `inputSize` input values and `targetSize` targets (class
 * numbers held as floats, as the model operations take them: one per image, one per token of a
 * language model's window).
 * @category Data
 */
export interface SampleSource {
  readonly count: number;
  readonly inputSize: number;
  readonly targetSize: number;
  /** Writes sample `index`'s inputs at `inputs[inputOffset..]` and targets at `targets[targetOffset..]`. */
  read(index: number, inputs: Float32Array, inputOffset: number, targets: Float32Array, targetOffset: number): void;
}

/** A Dataset as a source (its samples are already in memory). @category Data */
export function datasetSource(dataset: Dataset): SampleSource {
  const d = checkDataset(dataset, 'datasetSource(dataset)');
  return {
    count: d.count,
    inputSize: d.features,
    targetSize: 1,
    read(index, inputs, inputOffset, targets, targetOffset) {
      inputs.set(d.inputs.subarray(index * d.features, (index + 1) * d.features), inputOffset);
      targets[targetOffset] = d.labels[index]!;
    },
  };
}

/** @category Data */
export interface IdxSourceOptions extends FileBlockCacheOptions {
  /** Folder of the decompressed copies of `.gz` files. Default `defaultCacheDir()` ($SAPIPE_DATA_CACHE or the temp folder). */
  cacheDir?: string;
}
const IDX_SOURCE_KEYS = optionKeys<IdxSourceOptions>({ cacheDir: true, capacityBytes: true, blockBytes: true });

/** A source over files: its block caches' statistics, and close() to release the files. @category Data */
export interface FileSampleSource extends SampleSource {
  /** The images' block cache (the labels are small and read whole). */
  stats(): FileBlockCacheStats;
  close(): void;
}

/** Bytes of an IDX header of `rank` dimensions. */
const idxHeaderBytes = (rank: number): number => 4 + 4 * rank;

/**
 * Images and labels in IDX files (MNIST's format; `.gz` or not): images of bytes scaled to [0, 1],
 * read through a memory block cache over an uncompressed copy on disk; labels read whole.
 * @category Data
 */
export function idxSource(imagesPath: string, labelsPath: string, options: IdxSourceOptions = {}): FileSampleSource {
  checkOptions(options, IDX_SOURCE_KEYS, 'idxSource options');
  const local = (path: string): string => (typeof path === 'string' && path.endsWith('.gz') ? decompressedCopy(path, options.cacheDir) : path);
  const labelsFile = FileBlockCache.open(local(labelsPath), {});
  const labelBytes = new Uint8Array(labelsFile.size);
  labelsFile.read(0, labelsFile.size, labelBytes);
  labelsFile.close();
  const labels = decodeIdx(labelBytes, labelsPath);
  if (labels.dims.length !== 1) throw new InvalidArgumentError(`idxSource: ${labelsPath} has ${labels.dims.length} dimensions; labels have 1`);
  const cache = FileBlockCache.open(local(imagesPath), { ...(options.capacityBytes !== undefined && { capacityBytes: options.capacityBytes }), ...(options.blockBytes !== undefined && { blockBytes: options.blockBytes }) });
  try {
    // The header alone, to know the shape; the pixels stay in the file until a batch asks.
    const magic = new Uint8Array(4);
    if (cache.size >= 4) cache.read(0, 4, magic);
    const rank = magic[3]!;
    if (cache.size < idxHeaderBytes(rank) || magic[0] !== 0 || magic[1] !== 0 || magic[2] !== 0x08 || rank < 2 || rank > 8)
      throw new InvalidArgumentError(`idxSource: ${imagesPath} is not an IDX file of unsigned-byte images`);
    const header = new Uint8Array(idxHeaderBytes(rank));
    cache.read(0, header.length, header);
    const view = new DataView(header.buffer);
    const count = view.getUint32(4, false);
    let inputSize = 1;
    for (let d = 1; d < rank; d++) inputSize *= view.getUint32(4 + 4 * d, false);
    if (cache.size !== idxHeaderBytes(rank) + count * inputSize)
      throw new InvalidArgumentError(`idxSource: ${imagesPath} declares ${count} images of ${inputSize} bytes but holds ${cache.size - idxHeaderBytes(rank)} bytes after its header (truncated or corrupt)`);
    if (labels.dims[0] !== count) throw new SizeMismatchError(`idxSource: ${imagesPath} holds ${count} images, ${labelsPath} ${labels.dims[0]} labels`);
    const start = idxHeaderBytes(rank);
    const pixels = new Uint8Array(inputSize);
    let closed = false;
    return {
      count,
      inputSize,
      targetSize: 1,
      read(index, inputs, inputOffset, targets, targetOffset) {
        if (closed) throw new DisposedError(`idxSource(${imagesPath}) is closed`);
        cache.read(start + index * inputSize, inputSize, pixels);
        for (let i = 0; i < inputSize; i++) inputs[inputOffset + i] = pixels[i]! / 255;
        targets[targetOffset] = labels.data[index]!;
      },
      stats: () => cache.stats(),
      close() {
        closed = true;
        cache.close();
      },
    };
  } catch (error) {
    cache.close();
    throw error;
  }
}

/** @category Data */
export interface TokenSourceOptions {
  /** Tokens a window holds (the model's context). */
  context: number;
  /** Tokens between the starts of consecutive windows. Default `context` (windows do not overlap). */
  stride?: number;
}
const TOKEN_SOURCE_KEYS = optionKeys<TokenSourceOptions>({ context: true, stride: true });

/**
 * A token sequence (bytes: a byte-level language model's tokens) cut into windows: sample i's
 * inputs are the `context` tokens from `i * stride`, its targets the `context` tokens one further
 * (each position's next token).
 * @category Data
 */
export function tokenSource(tokens: Uint8Array, options: TokenSourceOptions): SampleSource {
  if (!(tokens instanceof Uint8Array)) throw new InvalidArgumentError(`tokenSource: tokens must be a Uint8Array, got ${describeValue(tokens)}`);
  checkOptions(options, TOKEN_SOURCE_KEYS, 'tokenSource options');
  const context = checkInteger(options.context, 'tokenSource: context', 1, 1 << 20);
  const stride = checkInteger(options.stride ?? context, 'tokenSource: stride', 1, 1 << 30);
  if (tokens.length < context + 1) throw new InvalidArgumentError(`tokenSource: ${tokens.length} tokens make no window of ${context} tokens and their next ones; give at least ${context + 1}`);
  const count = Math.floor((tokens.length - context - 1) / stride) + 1;
  return {
    count,
    inputSize: context,
    targetSize: context,
    read(index, inputs, inputOffset, targets, targetOffset) {
      const at = index * stride;
      for (let i = 0; i < context; i++) {
        inputs[inputOffset + i] = tokens[at + i]!;
        targets[targetOffset + i] = tokens[at + i + 1]!;
      }
    },
  };
}

/** @category Data */
export interface DataLoaderOptions {
  /** Samples per batch (per rank). */
  batchSize: number;
  /** Seed of every epoch's order (with the epoch number). Default 0. */
  seed?: number;
  /** Whether each epoch has its own random order; false reads the source in order. Default true. */
  shuffle?: boolean;
  /** This rank and the number of ranks: each reads every worldSize-th sample of the epoch's order. Default 0 of 1. */
  rank?: number;
  worldSize?: number;
  /** Drop the last batch when it would be short. Default true (every batch has batchSize samples). */
  dropLast?: boolean;
}
const LOADER_KEYS = optionKeys<DataLoaderOptions>({ batchSize: true, seed: true, shuffle: true, rank: true, worldSize: true, dropLast: true });

/**
 * One batch. `inputs` and `targets` are the loader's buffers, rewritten by the next batch: use
 * (or copy) them before asking for it. `indices` are the source's sample numbers, in batch order.
 * @category Data
 */
export interface Batch {
  readonly inputs: Float32Array;
  readonly targets: Float32Array;
  readonly count: number;
  readonly indices: Uint32Array;
}

/** Batches of a source for one rank, epoch after epoch. @category Data */
export class DataLoader {
  readonly source: SampleSource;
  readonly batchSize: number;
  readonly rank: number;
  readonly worldSize: number;
  /** Samples this rank reads per epoch (the same on every rank: the epoch's tail that does not divide evenly is left out). */
  readonly samplesPerEpoch: number;
  /** Batches per epoch on every rank. */
  readonly batchesPerEpoch: number;
  private readonly seed: number;
  private readonly shuffle: boolean;
  private readonly order: Uint32Array;
  private readonly mine: Uint32Array;
  private readonly inputs: Float32Array;
  private readonly targets: Float32Array;

  constructor(source: SampleSource, options: DataLoaderOptions) {
    checkSource(source);
    checkOptions(options, LOADER_KEYS, 'DataLoader options');
    this.source = source;
    this.batchSize = checkInteger(options.batchSize, 'DataLoader: batchSize', 1, 1 << 20);
    this.worldSize = checkInteger(options.worldSize ?? 1, 'DataLoader: worldSize', 1, 1 << 16);
    this.rank = checkInteger(options.rank ?? 0, 'DataLoader: rank', 0, this.worldSize - 1);
    this.seed = checkSeed(options.seed ?? 0, 'DataLoader: seed');
    this.shuffle = checkBoolean(options.shuffle ?? true, 'DataLoader: shuffle');
    const dropLast = checkBoolean(options.dropLast ?? true, 'DataLoader: dropLast');
    this.samplesPerEpoch = Math.floor(source.count / this.worldSize);
    this.batchesPerEpoch = dropLast ? Math.floor(this.samplesPerEpoch / this.batchSize) : Math.ceil(this.samplesPerEpoch / this.batchSize);
    if (this.batchesPerEpoch === 0)
      throw new InvalidArgumentError(`DataLoader: ${source.count} samples over ${this.worldSize} rank(s) make no batch of ${this.batchSize}; use a smaller batchSize`);
    this.order = new Uint32Array(source.count);
    this.mine = new Uint32Array(this.samplesPerEpoch);
    this.inputs = new Float32Array(this.batchSize * source.inputSize);
    this.targets = new Float32Array(this.batchSize * source.targetSize);
  }

  /**
   * The batches of epoch `epoch` (0, 1, ...). The order is a function of (seed, epoch) alone,
   * the same on every rank, so the ranks' shares never overlap.
   */
  *epoch(epoch: number): Generator<Batch, void, undefined> {
    checkInteger(epoch, 'DataLoader.epoch: epoch', 0, 0xffffffff);
    this.orderOf(epoch);
    const { source, batchSize, inputs, targets, mine } = this;
    for (let b = 0; b < this.batchesPerEpoch; b++) {
      const from = b * batchSize;
      const count = Math.min(batchSize, mine.length - from);
      const indices = mine.subarray(from, from + count);
      for (let k = 0; k < count; k++) source.read(indices[k]!, inputs, k * source.inputSize, targets, k * source.targetSize);
      yield {
        inputs: count === batchSize ? inputs : inputs.subarray(0, count * source.inputSize),
        targets: count === batchSize ? targets : targets.subarray(0, count * source.targetSize),
        count,
        indices,
      };
    }
  }

  /** Fills `mine` with this rank's samples of the epoch: the epoch's order, every worldSize-th from rank. */
  private orderOf(epoch: number): void {
    const { order } = this;
    for (let i = 0; i < order.length; i++) order[i] = i;
    if (this.shuffle) {
      // Fisher-Yates from a seed mixed from (seed, epoch), in place: no allocation per epoch.
      const next = seededRandom((Math.imul(this.seed ^ 0x9e3779b9, 0x85ebca6b) + Math.imul(epoch + 1, 0xc2b2ae35)) >>> 0);
      for (let i = order.length - 1; i > 0; i--) {
        const j = Math.floor(next() * (i + 1));
        const t = order[i]!;
        order[i] = order[j]!;
        order[j] = t;
      }
    }
    for (let k = 0; k < this.mine.length; k++) this.mine[k] = order[this.rank + k * this.worldSize]!;
  }
}

function checkSource(source: unknown): asserts source is SampleSource {
  if (source === null || typeof source !== 'object' || typeof (source as SampleSource).read !== 'function')
    throw new InvalidArgumentError(`DataLoader: source must be a SampleSource ({ count, inputSize, targetSize, read }), e.g. datasetSource(dataset), got ${describeValue(source)}`);
  const s = source as SampleSource;
  checkInteger(s.count, 'DataLoader: source.count', 1, 2 ** 31 - 1);
  checkInteger(s.inputSize, 'DataLoader: source.inputSize', 1, 1 << 26);
  checkInteger(s.targetSize, 'DataLoader: source.targetSize', 1, 1 << 26);
}
