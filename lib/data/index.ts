export { type Dataset, type SplitOptions, checkDataset, selectSamples, shuffleDataset, trainTestSplit, shardDataset } from './dataset.js';
export { checkSeed, seededRandom, shuffledIndices } from './seeded-random.js';
export { syntheticDataset, type SyntheticOptions } from './synthetic.js';
export { loadMnist, mnistPackageDir, MNIST_FEATURES, MNIST_CLASSES, MNIST_SIDE, type MnistOptions } from './mnist.js';
