/**
 * Fashion-MNIST (Zalando; 60 000 training and 10 000 test images of clothing, 28 x 28 grey levels,
 * 10 classes) as Debian's `dataset-fashion-mnist` installs it: four gzipped IDX files in
 * /usr/share/datasets/fashion-mnist. A harder drop-in for the MNIST digits, for the CNN.
 */
import { existsSync } from 'node:fs';
import { join } from 'node:path';

import { BackendUnavailableError, InvalidArgumentError, SizeMismatchError } from '../errors.js';
import { checkOneOf, checkOptions, describeValue, optionKeys } from '../validate.js';
import type { Dataset } from './dataset.js';
import { readIdx } from './idx.js';
import { idxSource, type FileSampleSource, type IdxSourceOptions } from './loader.js';

/** Where Debian's package puts the files. @category Data */
export const FASHION_MNIST_DIR = '/usr/share/datasets/fashion-mnist';
/** The classes, by label. @category Data */
export const FASHION_MNIST_CLASSES: readonly string[] = ['T-shirt/top', 'Trouser', 'Pullover', 'Dress', 'Coat', 'Sandal', 'Shirt', 'Sneaker', 'Bag', 'Ankle boot'];

const INSTALL_HINT = "install Debian's dataset-fashion-mnist (`apt-get install dataset-fashion-mnist`), or pass dir: a folder holding train-images-idx3-ubyte.gz and the three other files";

/** @category Data */
export interface FashionMnistOptions {
  /** The folder of the four files. Default {@link FASHION_MNIST_DIR}. */
  dir?: string;
  /** `train` (60 000 images) or `test` (10 000). Default `train`. */
  split?: 'train' | 'test';
}
const OPTION_KEYS = optionKeys<FashionMnistOptions>({ dir: true, split: true });

/** The images and labels files of a split, or a BackendUnavailableError saying how to install them. @category Data */
export function fashionMnistFiles(options: FashionMnistOptions = {}): { images: string; labels: string } {
  checkOptions(options, OPTION_KEYS, 'Fashion-MNIST options');
  const dir = options.dir ?? FASHION_MNIST_DIR;
  if (typeof dir !== 'string' || dir === '') throw new InvalidArgumentError(`Fashion-MNIST: dir must be a folder path, got ${describeValue(dir)}`);
  const prefix = checkOneOf(options.split ?? 'train', 'Fashion-MNIST: split', ['train', 'test'] as const) === 'train' ? 'train' : 't10k';
  const files = { images: join(dir, `${prefix}-images-idx3-ubyte.gz`), labels: join(dir, `${prefix}-labels-idx1-ubyte.gz`) };
  for (const file of [files.images, files.labels]) if (!existsSync(file)) throw new BackendUnavailableError(`Fashion-MNIST: ${file} is missing; ${INSTALL_HINT}`);
  return files;
}

/** A split as a Dataset in memory: inputs [n, 784] in [0, 1], labels 0-9. @category Data */
export function loadFashionMnist(options: FashionMnistOptions = {}): Dataset {
  const files = fashionMnistFiles(options);
  const images = readIdx(files.images);
  const labels = readIdx(files.labels);
  if (images.dims.length !== 3 || images.dims[1] !== 28 || images.dims[2] !== 28) throw new InvalidArgumentError(`Fashion-MNIST: ${files.images} holds ${images.dims.join(' x ')}, not n x 28 x 28`);
  const count = images.dims[0]!;
  if (labels.dims.length !== 1 || labels.dims[0] !== count) throw new SizeMismatchError(`Fashion-MNIST: ${files.images} holds ${count} images, ${files.labels} ${labels.dims.join(' x ')} labels`);
  const inputs = new Float32Array(images.data.length);
  for (let i = 0; i < inputs.length; i++) inputs[i] = images.data[i]! / 255;
  for (const label of labels.data) if (label >= FASHION_MNIST_CLASSES.length) throw new InvalidArgumentError(`Fashion-MNIST: ${files.labels} holds the label ${label}; there are 10 classes`);
  return { inputs, labels: new Uint8Array(labels.data), count, features: 28 * 28, classes: FASHION_MNIST_CLASSES.length };
}

/**
 * A split as a file-backed source for a DataLoader: decompressed once to the data cache on disk,
 * then read through a memory block cache (see idxSource).
 * @category Data
 */
export function fashionMnistSource(options: FashionMnistOptions & IdxSourceOptions = {}): FileSampleSource {
  const { dir, split, ...cache } = options ?? {};
  const files = fashionMnistFiles({ ...(dir !== undefined && { dir }), ...(split !== undefined && { split }) });
  return idxSource(files.images, files.labels, cache);
}
