/** Deterministic synthetic data, shuffles and shards. */
import t from 'tap';

import { InvalidArgumentError, SizeMismatchError, shardDataset, shuffledIndices, syntheticDataset } from '../../dist/index.js';
import { seededRandom } from '../../dist/data/seeded-random.js';

t.test('the synthetic data set is deterministic and separable by class', async (t) => {
  const a = syntheticDataset({ count: 300, features: 4, classes: 3, seed: 5 });
  const b = syntheticDataset({ count: 300, features: 4, classes: 3, seed: 5 });
  t.same(a.inputs, b.inputs);
  t.same(a.labels, b.labels);
  t.notSame(syntheticDataset({ count: 300, features: 4, classes: 3, seed: 6 }).inputs, a.inputs);
  t.same([0, 1, 2].map((c) => a.labels.filter((l) => l === c).length), [100, 100, 100]);
  // Nearest class mean classifies most samples: the classes really are clusters.
  const means = [0, 1, 2].map((c) => [0, 1, 2, 3].map((j) => { let s = 0; for (let i = c; i < 300; i += 3) s += a.inputs[i * 4 + j]!; return s / 100; }));
  let correct = 0;
  for (let i = 0; i < 300; i++) {
    const d = means.map((m) => m.reduce((s, mj, j) => s + (a.inputs[i * 4 + j]! - mj) ** 2, 0));
    if (d.indexOf(Math.min(...d)) === a.labels[i]) correct++;
  }
  t.ok(correct > 240, `${correct}/300 by nearest class mean`);
  t.throws(() => syntheticDataset({ count: 0, features: 4, classes: 3 }), InvalidArgumentError);
  t.throws(() => syntheticDataset({ count: 10, features: 4, classes: 1 }), InvalidArgumentError);
  t.throws(() => syntheticDataset({ count: 10, features: 4, classes: 2, noise: -1 }), InvalidArgumentError);
});

t.test('seeded permutations and shards', async (t) => {
  const p = shuffledIndices(100, 3);
  t.same([...p].sort((x, y) => x - y), Array.from({ length: 100 }, (_, i) => i), 'a permutation');
  t.same(p, shuffledIndices(100, 3));
  t.notSame(p, shuffledIndices(100, 4));
  t.equal(seededRandom(9)(), seededRandom(9)());
  t.throws(() => seededRandom(-1), InvalidArgumentError);
  t.throws(() => shuffledIndices(1.5, 0), InvalidArgumentError);
  const d = syntheticDataset({ count: 10, features: 2, classes: 2 });
  const shards = [0, 1, 2].map((r) => shardDataset(d, r, 3));
  t.same(shards.map((s) => s.count), [4, 3, 3]);
  t.same(shards[1]!.inputs, d.inputs.slice(2, 4).length ? Float32Array.from([...d.inputs.slice(2, 4), ...d.inputs.slice(8, 10), ...d.inputs.slice(14, 16)]) : null);
  t.throws(() => shardDataset(d, 3, 3), InvalidArgumentError);
  t.throws(() => shardDataset({ ...d, count: 11 }, 0, 1), SizeMismatchError);
});
