// Writes the demo's MNIST split (trainTestSplit with testFraction 0.2, seed 0: 8 000 train and
// 2 000 test digits) as plain arrays, so that train-mlp.mjs and torch-train-mlp.py read the same
// samples on a machine that has no npm packages:
//   <dir>/train-x.f32.gz, test-x.f32.gz   float32 [n, 784], little endian, gzip
//   <dir>/train-y.u8, test-y.u8           one class byte per sample
// Usage: node scripts/experiments/export-mnist.mjs <dir>   (after npm run build)
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { gzipSync } from 'node:zlib';

import { loadMnist, trainTestSplit } from '../../dist/index.js';

const dir = process.argv[2];
if (!dir) throw new Error('usage: node scripts/experiments/export-mnist.mjs <dir>');
mkdirSync(dir, { recursive: true });
const { train, test } = trainTestSplit(loadMnist(), { testFraction: 0.2, seed: 0 });
for (const [name, d] of [['train', train], ['test', test]]) {
  writeFileSync(join(dir, `${name}-x.f32.gz`), gzipSync(Buffer.from(d.inputs.buffer, d.inputs.byteOffset, d.inputs.byteLength)));
  writeFileSync(join(dir, `${name}-y.u8`), d.labels);
  console.log(`${name}: ${d.count} samples`);
}
