/**
 * The recommendation model's pieces: the Zipf click data (deterministic, Zipf-shaped, labels
 * from the hidden model), the ROC AUC against counting every pair, the sharded embedding on 1, 2
 * and 3 ranks against whole tables trained by the plain-TypeScript reference (vectors and rows
 * bit for bit over 15 steps), and the model learning the data (AUC well above chance).
 */
import t from 'tap';

import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { LocalCommunicator, rocAuc } from '../../dist/index.js';
import { ClickModel, readClickData, ShardedEmbedding, syntheticClicks, writeClickData } from '../../dist/apps/recsys/index.js';
import { seededRandom } from '../../dist/data/seeded-random.js';
import { referenceAuc, referenceLookup, referenceSgd, referenceTables } from '../reference/recsys.js';
import { sameValues } from '../helpers/same-values.js';

async function comms(n: number, name: string): Promise<LocalCommunicator[]> {
  return Promise.all(Array.from({ length: n }, (_, rank) => LocalCommunicator.create({ group: `${name}-${process.pid}`, rank, size: n, timeoutMs: 10_000 })));
}

t.test('click data: deterministic, Zipf-shaped, labels from the hidden model', async (t) => {
  const a = syntheticClicks({ samples: 20_000, tables: [1000, 50], dense: 3, seed: 4, sampleSeed: 1 });
  const b = syntheticClicks({ samples: 20_000, tables: [1000, 50], dense: 3, seed: 4, sampleSeed: 1 });
  t.ok(sameValues(a.sparse, b.sparse) && sameValues(a.labels, b.labels) && sameValues(a.dense, b.dense), 'the same seeds give the same samples');
  const c = syntheticClicks({ samples: 20_000, tables: [1000, 50], dense: 3, seed: 4, sampleSeed: 2 });
  t.notOk(sameValues(c.sparse, a.sparse), 'another sample seed, other samples');
  // Zipf(1.05) over 1000 rows: the hottest row takes 1 / H(1000, 1.05) of the draws (about 0.14).
  const counts = new Map<number, number>();
  for (let i = 0; i < a.samples; i++) counts.set(a.sparse[2 * i]!, (counts.get(a.sparse[2 * i]!) ?? 0) + 1);
  const sorted = [...counts.values()].sort((x, y) => y - x);
  let h = 0;
  for (let k = 1; k <= 1000; k++) h += 1 / Math.pow(k, 1.05);
  t.ok(Math.abs(sorted[0]! / a.samples - 1 / h) < 0.01, `hottest row's share ${(sorted[0]! / a.samples).toFixed(4)} against 1/H = ${(1 / h).toFixed(4)}`);
  t.ok(Math.abs(sorted[9]! / sorted[0]! - Math.pow(10, -1.05)) < 0.05, 'the 10th hottest row, 10^-1.05 of the first');
  t.ok(counts.size > 500, `a long tail: ${counts.size} of 1000 rows drawn`);
  let clicks = 0;
  for (const l of a.labels) clicks += l;
  t.ok(clicks > 0.1 * a.samples && clicks < 0.9 * a.samples, `click rate ${(clicks / a.samples).toFixed(3)}`);
  t.throws(() => syntheticClicks({ samples: 0, tables: [10] }), { code: 'ERR_INVALID_ARGUMENT' });
  t.throws(() => syntheticClicks({ samples: 10, tables: [] }), { code: 'ERR_INVALID_ARGUMENT' });
  t.throws(() => syntheticClicks({ samples: 10, tables: [10], zipf: -1 }), { code: 'ERR_INVALID_ARGUMENT' });
  t.throws(() => syntheticClicks({ samples: 10, tables: [10], rows: 3 } as never), { code: 'ERR_INVALID_ARGUMENT' });

  const dir = mkdtempSync(join(tmpdir(), 'sapipe-clicks-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  writeClickData(join(dir, 'a.safetensors'), a);
  const back = readClickData(join(dir, 'a.safetensors'));
  t.same([back.samples, back.tables, back.denseFeatures], [a.samples, a.tables, a.denseFeatures]);
  t.ok(sameValues(back.sparse, a.sparse) && sameValues(back.dense, a.dense) && sameValues(back.labels, a.labels), 'the file holds the same data');
  writeFileSync(join(dir, 'bad'), 'not safetensors');
  t.throws(() => readClickData(join(dir, 'bad')), { code: 'ERR_CHECKPOINT' });
  t.throws(() => readClickData(join(dir, 'missing')), { code: 'ERR_CHECKPOINT', reason: 'missing' });
  t.throws(() => writeClickData(join(dir, 'x'), { ...a, labels: new Uint8Array(3) }), { code: 'ERR_INVALID_ARGUMENT' });
  t.throws(() => writeClickData(join(dir, 'x'), { ...a, sparse: a.sparse.map((v) => v + 1000) }), { code: 'ERR_INVALID_ARGUMENT', message: /outside table 0/ });
  t.throws(() => writeClickData(join(dir, 'no-such-dir', 'x'), a), { code: 'ERR_CHECKPOINT' });
  t.throws(() => syntheticClicks({ samples: 1 << 26, tables: [10, 10, 10, 10, 10] }), { code: 'ERR_INVALID_ARGUMENT', message: /2\^28/ });
});

t.test('rocAuc equals the share of pairs ordered right', async (t) => {
  const next = seededRandom(9);
  for (const n of [2, 7, 50, 301]) {
    const labels = Array.from({ length: n }, (_, i) => (i < 1 ? 1 : i < 2 ? 0 : next() < 0.3 ? 1 : 0));
    // Rounded scores, so that ties happen.
    const scores = labels.map((l) => Math.round((next() + 0.3 * l) * 20) / 20);
    t.ok(Math.abs(rocAuc(scores, labels) - referenceAuc(scores, labels)) < 1e-12, `n = ${n}`);
  }
  t.equal(rocAuc([0.1, 0.9], [0, 1]), 1);
  t.equal(rocAuc([0.9, 0.1], [0, 1]), 0);
  t.equal(rocAuc([0.5, 0.5], [0, 1]), 0.5);
  t.ok(Number.isNaN(rocAuc([0.1, 0.2], [1, 1])), 'one class only: NaN');
  t.throws(() => rocAuc([0.1], [2]), { code: 'ERR_INVALID_ARGUMENT' });
  t.throws(() => rocAuc([0.1, 0.2], [1]), { code: 'ERR_SIZE_MISMATCH' });
  t.throws(() => rocAuc([NaN, 0.2], [1, 0]), { code: 'ERR_INVALID_ARGUMENT' });
});

t.test('sharded embedding equals whole tables trained by the reference, on 1, 2 and 3 ranks', async (t) => {
  const tables = [37, 5, 101];
  const dim = 3;
  const batch = 6;
  const lr = 0.3;
  for (const size of [1, 2, 3]) {
    const cs = await comms(size, `emb${size}`);
    const shards = cs.map((comm) => new ShardedEmbedding(comm, { tables, dim, seed: 2 }));
    const whole = referenceTables(tables, dim, 2);
    const next = seededRandom(size);
    let worst = 0;
    for (let step = 0; step < 15; step++) {
      const indices = cs.map(() => Int32Array.from({ length: batch * tables.length }, (_, i) => Math.floor(Math.pow(next(), 3) * tables[i % tables.length]!)));
      const vectors = await Promise.all(shards.map((s, r) => s.forward(indices[r]!, batch)));
      vectors.forEach((v, r) => {
        if (!sameValues(v, referenceLookup(whole, dim, indices[r]!))) t.fail(`size ${size}, step ${step}, rank ${r}: the vectors differ from the reference's`);
      });
      const grads = cs.map(() => Float32Array.from({ length: batch * tables.length * dim }, () => next() - 0.5));
      await Promise.all(shards.map((s, r) => s.backward(grads[r]!, lr)));
      referenceSgd(whole, dim, indices, grads, lr);
      for (const s of shards)
        s.rows.forEach((rows, tb) => {
          for (let local = 0; local < s.ownedRows(tb); local++) {
            const row = local * size + s.rank;
            for (let j = 0; j < dim; j++) worst = Math.max(worst, Math.abs(rows[local * dim + j]! - whole[tb]![row * dim + j]!));
          }
        });
    }
    t.equal(worst, 0, `size ${size}: every row bit for bit after 15 steps`);
    // Each row lives on exactly one rank.
    t.same(
      tables.map((_, tb) => shards.reduce((n, s) => n + s.ownedRows(tb), 0)),
      tables,
      'the shards partition the rows',
    );
    // Update counts and the touched list of the last step.
    const s0 = shards[0]!;
    t.ok(s0.touchedCount > 0 && s0.updates.some((u) => u.some((c) => c > 1)), 'updates are counted');
    for (const s of shards) s.dispose();
    for (const c of cs) c.destroy();
  }
  const [c] = await comms(1, 'emb-bad');
  const e = new ShardedEmbedding(c!, { tables: [4], dim: 2 });
  await t.rejects(e.forward(Int32Array.from([4]), 1), { code: 'ERR_INVALID_ARGUMENT' }, 'a row outside the table');
  await t.rejects(e.forward(Int32Array.from([1]), 2), { code: 'ERR_SIZE_MISMATCH' });
  await t.rejects(e.backward(new Float32Array(2), 0.1), { code: 'ERR_INVALID_ARGUMENT' }, 'backward before forward');
  t.throws(() => new ShardedEmbedding(c!, { tables: [0], dim: 2 }), { code: 'ERR_INVALID_ARGUMENT' });
  e.dispose();
  await t.rejects(e.forward(Int32Array.from([1]), 1), { code: 'ERR_DISPOSED' });
  c!.destroy();
});

t.test('the click model learns the hidden model (2 ranks)', async (t) => {
  const tables = [2000, 2000, 300];
  const train = syntheticClicks({ samples: 24_000, tables, dense: 4, seed: 5, sampleSeed: 1 });
  const test = syntheticClicks({ samples: 4000, tables, dense: 4, seed: 5, sampleSeed: 2 });
  const cs = await comms(2, 'click');
  const models = await Promise.all(cs.map((comm) => ClickModel.create({ comm, tables, dim: 4, denseFeatures: 4, hidden: [16], embeddingLr: 0.5, optimizer: { kind: 'sgd', lr: 0.05, momentum: 0.9 } })));
  const before = (await Promise.all(models.map((m) => m.evaluate(test))))[0]!;
  const B = 64;
  for (let s = 0; s < Math.floor(train.samples / (2 * B)); s++) await Promise.all(models.map((m, r) => m.trainStep(train, (s * 2 + r) * B, B)));
  const after = await Promise.all(models.map((m) => m.evaluate(test)));
  t.same(after[0], after[1], 'every rank computes the same metrics');
  // Scores do not depend on how the test set is cut into batches (the tail batch moved back inside the data).
  const small = syntheticClicks({ samples: 1000, tables, dense: 4, seed: 5, sampleSeed: 3 });
  const whole = await Promise.all(models.map((m) => m.evaluate(small, 500)));
  const cut = await Promise.all(models.map((m) => m.evaluate(small, 64)));
  t.ok(Math.abs(whole[0]!.loss - cut[0]!.loss) < 1e-9 && Math.abs(whole[0]!.auc - cut[0]!.auc) < 1e-9, `batch 500 and 64 agree (${whole[0]!.auc.toFixed(6)}, ${cut[0]!.auc.toFixed(6)})`);
  t.ok(after[0]!.auc > 0.7 && after[0]!.auc > before.auc + 0.15, `AUC ${before.auc.toFixed(3)} -> ${after[0]!.auc.toFixed(3)}`);
  t.ok(after[0]!.loss < before.loss, `loss ${before.loss.toFixed(4)} -> ${after[0]!.loss.toFixed(4)}`);
  await t.rejects(models[0]!.trainStep(test, test.samples, B), { code: 'ERR_INVALID_ARGUMENT' }, 'a batch past the end');
  await t.rejects(models[0]!.trainStep({ samples: 3 } as never, 0, B), { code: 'ERR_INVALID_ARGUMENT' }, 'not click data');
  await t.rejects(models[0]!.evaluate(syntheticClicks({ samples: 10, tables: [5], dense: 4 })), { code: 'ERR_INVALID_ARGUMENT' }, 'data of another shape');
  await t.rejects(ClickModel.create({ comm: {} as never, tables, denseFeatures: 4, embeddingLr: 0.1, optimizer: { kind: 'sgd', lr: 0.1 } }), { code: 'ERR_INVALID_ARGUMENT' });
  await t.rejects(ClickModel.create({ comm: cs[0]!, tables, denseFeatures: 4, embeddingLr: 0.1, optimizer: { kind: 'sgd', lr: 0.1 }, rows: 3 } as never), { code: 'ERR_INVALID_ARGUMENT' });
  await Promise.all(models.map((m) => m.dispose()));
  await t.rejects(models[0]!.trainStep(train, 0, B), { code: 'ERR_DISPOSED' });
  for (const c of cs) c.destroy();
});
