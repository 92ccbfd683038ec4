/**
 * The data loader and its file caches: IDX files (gzipped or not) decode or are refused with a
 * typed error; the memory block cache returns the file's bytes for any read, within its capacity,
 * and allocates nothing once warm; the disk cache decompresses once per source version; each epoch
 * is its own seeded order, the same on every rank, and the ranks' shares are disjoint and equal;
 * an epoch copies no data set; and the real data sets (Debian's dataset-fashion-mnist and fortunes,
 * which .ci/run installs) load as documented.
 */
import { existsSync, mkdtempSync, readFileSync, rmSync, statSync, utimesSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { gzipSync } from 'node:zlib';
import t from 'tap';

import {
  DataLoader,
  datasetSource,
  decodeIdx,
  decompressedCopy,
  FASHION_MNIST_DIR,
  fashionMnistSource,
  FileBlockCache,
  FORTUNES_DIR,
  idxSource,
  loadFashionMnist,
  loadTextCorpus,
  readIdx,
  seededRandom,
  splitText,
  syntheticDataset,
  tokenSource,
  type Dataset,
} from '../../dist/index.js';

function tempDir(): string {
  const dir = mkdtempSync(join(tmpdir(), 'sapipe-data-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/** An IDX file of unsigned bytes with these dimensions and elements. */
function idx(dims: number[], data: Uint8Array): Buffer {
  const header = Buffer.alloc(4 + 4 * dims.length);
  header[2] = 0x08;
  header[3] = dims.length;
  dims.forEach((d, i) => header.writeUInt32BE(d, 4 + 4 * i));
  return Buffer.concat([header, data]);
}

function randomBytes(n: number, seed: number): Uint8Array {
  const next = seededRandom(seed);
  return Uint8Array.from({ length: n }, () => Math.floor(next() * 256));
}

t.test('IDX: decodes dimensions and bytes, gzipped or not; anything else is a typed error naming the file', async (t) => {
  const dir = tempDir();
  const data = randomBytes(3 * 4 * 5, 1);
  const file = idx([3, 4, 5], data);
  const decoded = decodeIdx(new Uint8Array(file));
  t.same(decoded.dims, [3, 4, 5]);
  t.same([...decoded.data], [...data]);
  writeFileSync(join(dir, 'a.idx.gz'), gzipSync(file));
  t.same([...readIdx(join(dir, 'a.idx.gz')).data], [...data], 'gzipped');
  const bad: [Uint8Array, RegExp][] = [
    [new Uint8Array([0, 0]), /shorter than the 4-byte magic/],
    [new Uint8Array([1, 0, 8, 1, 0, 0, 0, 0]), /magic starts 1, 0/],
    [new Uint8Array([0, 0, 0x0d, 1, 0, 0, 0, 0]), /element type is 0xd/],
    [new Uint8Array([0, 0, 8, 0]), /declares 0 dimensions/],
    [new Uint8Array(file.subarray(0, file.length - 1)), /make 60 elements, but 59 bytes follow/],
  ];
  for (const [bytes, why] of bad) t.throws(() => decodeIdx(bytes, 'x.idx'), { code: 'ERR_INVALID_ARGUMENT', message: why });
  writeFileSync(join(dir, 'b.gz'), 'not gzip');
  t.throws(() => readIdx(join(dir, 'b.gz')), { code: 'ERR_INVALID_ARGUMENT', message: /not valid gzip/ });
  t.throws(() => readIdx(join(dir, 'missing')), { code: 'ERR_BACKEND_UNAVAILABLE', message: /ENOENT/ });
  t.throws(() => decodeIdx('x' as never), { code: 'ERR_INVALID_ARGUMENT' });
});

t.test('FileBlockCache: any read returns the file bytes, the cache stays within capacity and reuses evicted blocks', async (t) => {
  const dir = tempDir();
  const bytes = randomBytes(10_000, 2);
  writeFileSync(join(dir, 'f'), bytes);
  const cache = FileBlockCache.open(join(dir, 'f'), { blockBytes: 512, capacityBytes: 2048 });
  t.equal(cache.size, 10_000);
  t.equal(cache.maxBlocks, 4);
  const next = seededRandom(3);
  const out = new Uint8Array(3000);
  for (let i = 0; i < 300; i++) {
    const offset = Math.floor(next() * 10_000);
    const length = Math.floor(next() * Math.min(3000, 10_000 - offset));
    cache.read(offset, length, out);
    if (Buffer.compare(Buffer.from(out.subarray(0, length)), Buffer.from(bytes.subarray(offset, offset + length))) !== 0) t.fail(`read(${offset}, ${length}) differs`);
    if (cache.stats().blocks > 4) t.fail('more blocks than capacity');
  }
  const { hits, misses } = cache.stats();
  t.ok(hits > 0 && misses > 0, `hits ${hits}, misses ${misses}`);
  // A cache that holds the whole file reads it once.
  const whole = FileBlockCache.open(join(dir, 'f'), { blockBytes: 1024, capacityBytes: 16 * 1024 });
  for (let pass = 0; pass < 3; pass++) for (let o = 0; o < 10_000; o += 100) whole.read(o, 100, out);
  t.equal(whole.stats().bytesFromFile, 10_000, 'each byte read from the file once');
  t.equal(whole.stats().misses, 10);
  whole.close();
  cache.close();
  cache.close();
  t.throws(() => cache.read(0, 1, out), { code: 'ERR_DISPOSED' });
  t.throws(() => FileBlockCache.open(join(dir, 'missing')), { code: 'ERR_BACKEND_UNAVAILABLE' });
  t.throws(() => FileBlockCache.open(dir), { code: 'ERR_INVALID_ARGUMENT', message: /not a regular file/ });
  t.throws(() => FileBlockCache.open(join(dir, 'f'), { blockBytes: 1024, capacityBytes: 512 }), { code: 'ERR_INVALID_ARGUMENT', message: /capacityBytes/ });
  t.throws(() => FileBlockCache.open(join(dir, 'f'), { capacity: 1 } as never), { code: 'ERR_INVALID_ARGUMENT', message: /capacityBytes/ });
  const open = FileBlockCache.open(join(dir, 'f'));
  t.throws(() => open.read(9_999, 2, out), { code: 'ERR_INVALID_ARGUMENT' }, 'past the end');
  t.throws(() => open.read(0, 10, new Uint8Array(5)), { code: 'ERR_INVALID_ARGUMENT' }, 'past the output');
  open.close();
});

t.test('the disk cache decompresses a file once per version of it', async (t) => {
  const dir = tempDir();
  const cacheDir = join(dir, 'cache');
  const source = join(dir, 'x.gz');
  writeFileSync(source, gzipSync(Buffer.from('hello, data')));
  const copy = decompressedCopy(source, cacheDir);
  t.equal(readFileSync(copy, 'utf8'), 'hello, data');
  const made = statSync(copy).mtimeMs;
  t.equal(decompressedCopy(source, cacheDir), copy, 'the same copy');
  t.equal(statSync(copy).mtimeMs, made, 'not written again');
  writeFileSync(source, gzipSync(Buffer.from('changed')));
  utimesSync(source, new Date(), new Date(Date.now() + 5000));
  const second = decompressedCopy(source, cacheDir);
  t.not(second, copy, 'a changed source gets a new copy');
  t.equal(readFileSync(second, 'utf8'), 'changed');
});

function dataset(count: number, features: number, seed: number): Dataset {
  return syntheticDataset({ count, features, classes: 7, seed });
}

t.test('DataLoader: each epoch a seeded order, the same on every rank; ranks read disjoint, equal shares', async (t) => {
  const d = dataset(103, 5, 4);
  const W = 3;
  const order = (rank: number, epoch: number, seed = 9): number[] => {
    const loader = new DataLoader(datasetSource(d), { batchSize: 4, seed, rank, worldSize: W });
    return [...loader.epoch(epoch)].flatMap((b) => [...b.indices]);
  };
  const loader = new DataLoader(datasetSource(d), { batchSize: 4, seed: 9, rank: 0, worldSize: W });
  t.equal(loader.samplesPerEpoch, 34, '103 samples over 3 ranks: 34 each');
  t.equal(loader.batchesPerEpoch, 8, '34 in batches of 4, the short one dropped');
  for (const epoch of [0, 1]) {
    const shares = [0, 1, 2].map((r) => order(r, epoch));
    t.same(shares.map((s) => s.length), [32, 32, 32], 'every rank the same number');
    const all = shares.flat();
    t.equal(new Set(all).size, all.length, `epoch ${epoch}: no sample on two ranks`);
    t.same(order(1, epoch), shares[1], 'the same (seed, epoch) gives the same order');
  }
  t.not(order(0, 0).join(), order(0, 1).join(), 'another epoch, another order');
  t.not(order(0, 0, 9).join(), order(0, 0, 10).join(), 'another seed, another order');
  const inOrder = new DataLoader(datasetSource(d), { batchSize: 10, shuffle: false, dropLast: false });
  const batches = [...inOrder.epoch(0)];
  t.same(batches.map((b) => b.count), [10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 3], 'dropLast false keeps the short batch');
  t.same(batches.flatMap((b) => [...b.indices]), Array.from({ length: 103 }, (_, i) => i), 'shuffle false reads in order');
});

t.test('DataLoader: a batch holds its samples, in reused buffers; an epoch copies no data set', async (t) => {
  const d = dataset(20_000, 100, 5); // 8 MB of inputs
  const loader = new DataLoader(datasetSource(d), { batchSize: 64, seed: 1 });
  let buffer: ArrayBufferLike | undefined;
  let checked = 0;
  for (const b of loader.epoch(0)) {
    buffer ??= b.inputs.buffer;
    if (b.inputs.buffer !== buffer) t.fail('a new buffer for a batch');
    for (let k = 0; k < b.count; k += 17) {
      const i = b.indices[k]!;
      if (b.targets[k] !== d.labels[i]) t.fail(`target ${k}`);
      for (let f = 0; f < 100; f += 13) if (b.inputs[k * 100 + f] !== d.inputs[i * 100 + f]) t.fail(`input ${k}, ${f}`);
      checked++;
    }
  }
  t.ok(checked > 1000, `${checked} samples checked against the data set`);
  global.gc?.();
  const before = process.memoryUsage().arrayBuffers;
  for (let e = 1; e <= 3; e++) for (const b of loader.epoch(e)) if (b.count === 0) t.fail();
  const grown = process.memoryUsage().arrayBuffers - before;
  t.ok(grown < 1 << 20, `three epochs of an 8 MB data set allocated ${grown} bytes of array buffers`);
});

t.test('tokenSource: windows of the sequence, each target the next token', async (t) => {
  const tokens = Uint8Array.from({ length: 50 }, (_, i) => i);
  const source = tokenSource(tokens, { context: 8, stride: 5 });
  t.equal(source.count, 9, 'windows from 0, 5, ..., 40 (41 + 8 = 49 is the last next-token)');
  const loader = new DataLoader(source, { batchSize: 2, shuffle: false });
  const [first] = loader.epoch(0);
  t.same([...first!.inputs.subarray(0, 8)], [0, 1, 2, 3, 4, 5, 6, 7]);
  t.same([...first!.targets.subarray(0, 8)], [1, 2, 3, 4, 5, 6, 7, 8]);
  t.same([...first!.inputs.subarray(8, 16)], [5, 6, 7, 8, 9, 10, 11, 12], 'the second window starts a stride on');
  t.throws(() => tokenSource(tokens, { context: 50 }), { code: 'ERR_INVALID_ARGUMENT', message: /give at least 51/ });
  t.throws(() => tokenSource(tokens, { contxt: 4 } as never), { code: 'ERR_INVALID_ARGUMENT', message: /context/ });
  const { train, validation } = splitText(tokens, 0.2);
  t.same([train.length, validation.length], [40, 10]);
  t.equal(validation[0], 40, 'validation is the end of the text');
});

t.test('idxSource: images scaled to [0, 1] and labels, read through the caches from gzipped IDX files', async (t) => {
  const dir = tempDir();
  const pixels = randomBytes(30 * 6 * 5, 6);
  const labels = Uint8Array.from({ length: 30 }, (_, i) => i % 10);
  writeFileSync(join(dir, 'images.gz'), gzipSync(idx([30, 6, 5], pixels)));
  writeFileSync(join(dir, 'labels.gz'), gzipSync(idx([30], labels)));
  const source = idxSource(join(dir, 'images.gz'), join(dir, 'labels.gz'), { cacheDir: join(dir, 'cache'), blockBytes: 512, capacityBytes: 1024 });
  t.equal(source.count, 30);
  t.equal(source.inputSize, 30);
  const loader = new DataLoader(source, { batchSize: 7, seed: 2, worldSize: 2, rank: 1 });
  for (const b of loader.epoch(0))
    for (let k = 0; k < b.count; k++) {
      const i = b.indices[k]!;
      if (b.targets[k] !== labels[i]) t.fail(`label of ${i}`);
      for (let p = 0; p < 30; p++) if (b.inputs[k * 30 + p] !== Math.fround(pixels[i * 30 + p]! / 255)) t.fail(`pixel ${p} of ${i}`);
    }
  t.ok(source.stats().misses > 0);
  source.close();
  t.throws(() => source.read(0, new Float32Array(30), 0, new Float32Array(1), 0), { code: 'ERR_DISPOSED' });
  writeFileSync(join(dir, 'few-labels'), idx([29], labels.subarray(0, 29)));
  t.throws(() => idxSource(join(dir, 'images.gz'), join(dir, 'few-labels'), { cacheDir: join(dir, 'cache') }), { code: 'ERR_SIZE_MISMATCH', message: /30 images.*29 labels/ });
  writeFileSync(join(dir, 'short'), idx([30, 6, 5], pixels).subarray(0, 100));
  t.throws(() => idxSource(join(dir, 'short'), join(dir, 'labels.gz'), { cacheDir: join(dir, 'cache') }), { code: 'ERR_INVALID_ARGUMENT', message: /truncated or corrupt/ });
  t.throws(() => new DataLoader({} as never, { batchSize: 1 }), { code: 'ERR_INVALID_ARGUMENT', message: /SampleSource/ });
  t.throws(() => new DataLoader(tokenSource(new Uint8Array(10), { context: 2 }), { batchSize: 100 }), { code: 'ERR_INVALID_ARGUMENT', message: /make no batch/ });
  t.throws(() => new DataLoader(tokenSource(new Uint8Array(10), { context: 2 }), { batchSize: 1, rank: 2, worldSize: 2 }), { code: 'ERR_INVALID_ARGUMENT', message: /rank/ });
});

// The real data sets: Debian packages that .ci/run installs (CI fails rather than skips without them).
const fashion = existsSync(join(FASHION_MNIST_DIR, 'train-images-idx3-ubyte.gz'));
const fortunes = existsSync(join(FORTUNES_DIR, 'fortunes'));
if ((!fashion || !fortunes) && process.env.CI) t.fail('CI installs dataset-fashion-mnist and fortunes (.ci/run); they are missing');

t.test("Fashion-MNIST: Debian's files load as 60 000 + 10 000 images; the file-backed source reads the same samples", fashion ? {} : { skip: 'dataset-fashion-mnist is not installed (apt-get install dataset-fashion-mnist)' }, async (t) => {
  const train = loadFashionMnist();
  const test = loadFashionMnist({ split: 'test' });
  t.same([train.count, test.count, train.features, train.classes], [60_000, 10_000, 784, 10]);
  t.same([...train.labels.subarray(0, 5)], [9, 0, 0, 3, 0], "the first labels of the published training file (ankle boot, T-shirt, T-shirt, dress, T-shirt)");
  t.ok(train.inputs.every((v) => v >= 0 && v <= 1), 'grey levels in [0, 1]');
  const source = fashionMnistSource({ split: 'test', cacheDir: join(tempDir(), 'cache') });
  const inputs = new Float32Array(784);
  const targets = new Float32Array(1);
  for (const i of [0, 1, 4_999, 9_999]) {
    source.read(i, inputs, 0, targets, 0);
    t.same([...inputs], [...test.inputs.subarray(i * 784, (i + 1) * 784)], `image ${i}`);
    t.equal(targets[0], test.labels[i]);
  }
  source.close();
  t.throws(() => loadFashionMnist({ dir: tempDir() }), { code: 'ERR_BACKEND_UNAVAILABLE', message: /apt-get install dataset-fashion-mnist/ });
});

t.test("the fortunes collection: a few MB of English text from Debian's fortunes package", fortunes ? {} : { skip: 'fortunes is not installed (apt-get install fortunes)' }, async (t) => {
  const corpus = loadTextCorpus();
  t.ok(corpus.bytes.length > 2_000_000, `${corpus.bytes.length} bytes`);
  t.ok(corpus.files.includes('fortunes') && !corpus.files.some((f) => f.endsWith('.dat') || f.endsWith('.u8')), corpus.files.join(' '));
  const text = Buffer.from(corpus.bytes).toString('latin1');
  const letters = text.match(/[A-Za-z ]/g)?.length ?? 0;
  t.ok(letters / text.length > 0.75, `mostly letters and spaces (${((100 * letters) / text.length).toFixed(1)} %)`);
  t.throws(() => loadTextCorpus({ dir: join(tempDir(), 'none') }), { code: 'ERR_BACKEND_UNAVAILABLE', message: /apt-get install fortunes/ });
});
