export { type Dataset, type SplitOptions, checkDataset, selectSamples, shuffleDataset, trainTestSplit, shardDataset } from './dataset.js';
export { checkSeed, seededRandom, shuffledIndices } from './seeded-random.js';
export { syntheticDataset, type SyntheticOptions } from './synthetic.js';
export { loadMnist, mnistPackageDir, MNIST_FEATURES, MNIST_CLASSES, MNIST_SIDE, type MnistOptions } from './mnist.js';
export { decodeIdx, readIdx, type IdxArray } from './idx.js';
export { DEFAULT_BLOCK_BYTES, DEFAULT_CACHE_BYTES, decompressedCopy, defaultCacheDir, FileBlockCache, type FileBlockCacheOptions, type FileBlockCacheStats } from './file-cache.js';
export {
  DataLoader,
  datasetSource,
  idxSource,
  tokenSource,
  type Batch,
  type DataLoaderOptions,
  type FileSampleSource,
  type IdxSourceOptions,
  type SampleSource,
  type TokenSourceOptions,
} from './loader.js';
export { FASHION_MNIST_CLASSES, FASHION_MNIST_DIR, fashionMnistFiles, fashionMnistSource, loadFashionMnist, type FashionMnistOptions } from './fashion-mnist.js';
export { FORTUNES_DIR, loadTextCorpus, splitText, textWindows, type TextCorpus, type TextCorpusOptions, type TextWindows } from './text.js';
