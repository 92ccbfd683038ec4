/**
 * Checkpoints and recovery of the recommendation model (docs/ALGORITHMS.md section 7), ranks as
 * local communicators in this thread, real files:
 * - full recovery: a run cut after step 17 and resumed from its step-15 checkpoint ends, at step
 *   30, bit for bit where the uninterrupted run ends (shards and MLP);
 * - partial recovery (mfu): rank 1 of 3 lost at step 21; the survivors keep their shards and update
 *   counts untouched, bit for bit, the MLP comes from them, and rank 1's shard is its last full
 *   save with the priority saves after it applied (each row as it was when saved);
 * - ssu saves only rows that were updated; the interval rules' values; typed errors.
 */
import t from 'tap';

import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { LocalCommunicator, readRankCheckpoint } from '../../dist/index.js';
import {
  ClickModel,
  CprCheckpointer,
  cprIntervalSeconds,
  expectedOverhead,
  syntheticClicks,
  youngIntervalSeconds,
  type CprOptions,
} from '../../dist/apps/recsys/index.js';
import { sameValues } from '../helpers/same-values.js';

const TABLES = [300, 120, 40];
const DATA = syntheticClicks({ samples: 6000, tables: TABLES, dense: 2, seed: 7, sampleSeed: 1 });
const B = 16;

let group = 0;
async function job(size: number, options: Omit<CprOptions, 'policy'> & { policy: CprOptions['policy'] }): Promise<{ models: ClickModel[]; cprs: CprCheckpointer[]; comms: LocalCommunicator[] }> {
  const name = `cpr-${process.pid}-${group++}`;
  const comms = await Promise.all(Array.from({ length: size }, (_, rank) => LocalCommunicator.create({ group: name, rank, size, timeoutMs: 10_000 })));
  const models = await Promise.all(
    comms.map((comm) => ClickModel.create({ comm, tables: TABLES, dim: 4, denseFeatures: 2, hidden: [8], embeddingLr: 0.4, optimizer: { kind: 'sgd', lr: 0.05, momentum: 0.9 } })),
  );
  const cprs = await Promise.all(models.map((m) => CprCheckpointer.create(m, options)));
  return { models, cprs, comms };
}

/** Steps [from, to) on every rank, each followed by afterStep() and the wait for its file (so no priority save is skipped). */
async function train(j: Awaited<ReturnType<typeof job>>, from: number, to: number, each?: (step: number) => void): Promise<void> {
  const size = j.models.length;
  for (let s = from; s < to; s++) {
    await Promise.all(j.models.map((m, r) => m.trainStep(DATA, (s * size + r) * B, B)));
    await Promise.all(j.cprs.map((c) => c.afterStep()));
    await Promise.all(j.cprs.map((c) => c.close()));
    each?.(s + 1);
  }
}

async function end(j: Awaited<ReturnType<typeof job>>): Promise<void> {
  await Promise.all(j.models.map((m) => m.dispose()));
  for (const c of j.comms) c.destroy();
}

t.test('full recovery: cut at step 17, resumed from step 15, equals the uninterrupted run at step 30', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'sapipe-cpr-full-'));
  const other = mkdtempSync(join(tmpdir(), 'sapipe-cpr-full-ref-'));
  t.teardown(() => [dir, other].forEach((d) => rmSync(d, { recursive: true, force: true })));
  const whole = await job(2, { dir: other, policy: 'full', saveEvery: 5 });
  await train(whole, 0, 30);
  const cut = await job(2, { dir, policy: 'full', saveEvery: 5 });
  t.equal(cut.cprs[0]!.resumed.kind, 'fresh');
  await train(cut, 0, 17);
  await end(cut);
  const resumed = await job(2, { dir, policy: 'full', saveEvery: 5 });
  t.same(resumed.cprs.map((c) => [c.resumed.kind, c.resumed.step]), [['full', 15], ['full', 15]]);
  await train(resumed, 15, 30);
  for (let r = 0; r < 2; r++) {
    t.ok(whole.models[r]!.embedding.rows.every((rows, tb) => sameValues(rows, resumed.models[r]!.embedding.rows[tb]!)), `rank ${r}: shards bit for bit`);
    t.ok(sameValues(whole.models[r]!.mlp.params.weights.array, resumed.models[r]!.mlp.params.weights.array), `rank ${r}: MLP bit for bit`);
  }
  await end(whole);
  await end(resumed);
});

t.test('partial recovery (mfu): only the lost shard comes from disk, the survivors keep their state', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'sapipe-cpr-part-'));
  const handoffDir = mkdtempSync(join(tmpdir(), 'sapipe-cpr-handoff-'));
  t.teardown(() => [dir, handoffDir].forEach((d) => rmSync(d, { recursive: true, force: true })));
  const options: CprOptions = { dir, policy: 'mfu', saveEvery: 8, priorityFraction: 0.25, handoffDir };
  const a = await job(3, options);
  t.equal(a.cprs[0]!.priorityEvery, 2);
  // Rank 1's shard after every step, to know each saved row's value when it was saved.
  const history = new Map<number, Float32Array[]>();
  await train(a, 0, 21, (step) => history.set(step, a.models[1]!.embedding.rows.map((r) => r.slice())));
  const live = a.models.map((m) => ({ rows: m.embedding.rows.map((r) => r.slice()), updates: m.embedding.updates.map((u) => u.slice()), mlp: m.mlp.params.weights.array.slice() }));
  t.same(a.cprs.map((c) => [c.costSoFar.fullSaves, c.costSoFar.prioritySaves]), Array(3).fill([3, 8]), 'full saves at 0 (the fresh start), 8 and 16, priority saves at the even steps between');
  // Rank 1 is lost; the survivors hand off, every process starts again.
  a.cprs[0]!.handOff();
  a.cprs[2]!.handOff();
  await end(a);

  // What rank 1's shard must come back as: its step-16 rows, then the priority saves of 18 and 20 applied.
  const expected = history.get(16)!.map((r) => r.slice());
  for (const step of [18, 20]) {
    const file = await readRankCheckpoint(dir, 1, step);
    t.equal((file!.extra as { cpr: string }).cpr, 'priority');
    expected.forEach((rows, tb) => {
      const ids = file!.tensors.get(`embedding/${tb}/rows`)!.data as Int32Array;
      t.ok(ids.length > 0 && ids.length <= Math.round((rows.length / 4) * 0.25) + 1, `step ${step}, table ${tb}: ${ids.length} priority rows`);
      for (const id of ids) rows.set(history.get(step)![tb]!.subarray(id * 4, id * 4 + 4), id * 4);
    });
  }

  // A recovery that fails on one rank (its checkpoint corrupt) fails on every rank, typed, and
  // keeps the survivors' hand-offs for the next attempt.
  const victim = join(dir, 'step-0000000016', 'rank-1.safetensors');
  const intact = readFileSync(victim);
  writeFileSync(victim, Buffer.from('garbage'));
  const name = `cpr-${process.pid}-${group++}`;
  const cs = await Promise.all(Array.from({ length: 3 }, (_, rank) => LocalCommunicator.create({ group: name, rank, size: 3, timeoutMs: 10_000 })));
  const ms = await Promise.all(cs.map((comm) => ClickModel.create({ comm, tables: TABLES, dim: 4, denseFeatures: 2, hidden: [8], embeddingLr: 0.4, optimizer: { kind: 'sgd', lr: 0.05, momentum: 0.9 } })));
  const attempts = await Promise.allSettled(ms.map((m) => CprCheckpointer.create(m, options)));
  t.ok(
    attempts.every((a) => a.status === 'rejected' && (a.reason as { code?: string }).code === 'ERR_CHECKPOINT'),
    `every rank fails, typed: ${attempts.map((a) => (a.status === 'rejected' ? (a.reason as Error).message.slice(0, 60) : 'resolved')).join(' | ')}`,
  );
  t.ok(existsSync(join(handoffDir, 'rank-0.handoff')) && existsSync(join(handoffDir, 'rank-2.handoff')), 'the hand-offs are kept');
  await end({ models: ms, cprs: [], comms: cs });
  writeFileSync(victim, intact);

  const b = await job(3, options);
  t.notOk(existsSync(join(handoffDir, 'rank-0.handoff')), 'a hand-off is removed once the recovery succeeded');
  for (const c of b.cprs) {
    t.equal(c.resumed.kind, 'partial');
    t.equal(c.resumed.step, 21);
    t.same(c.resumed.reloaded, [1]);
    t.same(c.resumed.reloadedFrom, [20], 'rank 1 got back the state of step 20 (its newest priority save)');
  }
  for (const r of [0, 2]) {
    const e = b.models[r]!.embedding;
    t.ok(e.rows.every((rows, tb) => sameValues(rows, live[r]!.rows[tb]!)), `survivor ${r}: shard untouched, bit for bit`);
    t.ok(e.updates.every((u, tb) => sameValues(u, live[r]!.updates[tb]!)), `survivor ${r}: update counts kept`);
  }
  t.ok(b.models[1]!.embedding.rows.every((rows, tb) => sameValues(rows, expected[tb]!)), 'rank 1: its step-16 save with the priority rows of 18 and 20');
  t.notOk(b.models[1]!.embedding.rows.every((rows, tb) => sameValues(rows, live[1]!.rows[tb]!)), 'rank 1 lost some updates (partial recovery)');
  for (const m of b.models) t.ok(sameValues(m.mlp.params.weights.array, live[0]!.mlp), `rank ${m.comm.rank}: the MLP from a survivor`);
  t.equal(b.models[1]!.trainer.stepCalls, 21);
  await train(b, 21, 24);
  t.equal(b.models[2]!.trainer.stepCalls, 24, 'training goes on');
  await end(b);

  // No survivor left a hand-off: the next start is a full recovery.
  const c = await job(3, options);
  t.same([c.cprs[0]!.resumed.kind, c.cprs[0]!.resumed.step], ['full', 24]);
  await end(c);
});

t.test('ssu saves a sub-sample of the updated rows', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'sapipe-cpr-ssu-'));
  const handoffDir = mkdtempSync(join(tmpdir(), 'sapipe-cpr-ssu-h-'));
  t.teardown(() => [dir, handoffDir].forEach((d) => rmSync(d, { recursive: true, force: true })));
  const j = await job(2, { dir, policy: 'ssu', saveEvery: 10, priorityFraction: 0.5, ssuSampleRate: 0.5, handoffDir });
  const updated = TABLES.map(() => new Set<number>());
  const before = j.models[0]!.embedding.rows.map((r) => r.slice());
  await train(j, 0, 5);
  // Rows of rank 0 updated in steps 1-5: those whose values moved.
  j.models[0]!.embedding.rows.forEach((rows, tb) => {
    for (let r = 0; r < rows.length / 4; r++) if (!sameValues(rows.subarray(r * 4, r * 4 + 4), before[tb]!.subarray(r * 4, r * 4 + 4))) updated[tb]!.add(r);
  });
  const file = await readRankCheckpoint(dir, 0, 5);
  let saved = 0;
  TABLES.forEach((_, tb) => {
    const ids = file!.tensors.get(`embedding/${tb}/rows`)!.data as Int32Array;
    saved += ids.length;
    t.ok([...ids].every((id) => updated[tb]!.has(id)), `table ${tb}: only updated rows (${ids.length} of ${updated[tb]!.size})`);
  });
  t.ok(saved > 0, 'some rows sampled');
  await end(j);
});

t.test('interval rules and typed errors', async (t) => {
  t.equal(youngIntervalSeconds(0.5, 3600), 60);
  t.equal(cprIntervalSeconds({ saveSeconds: 0.5, mtbfSeconds: 3600, shards: 4, lostFraction: 0.02 }), 2 * 0.02 * 4 * 3600);
  t.equal(cprIntervalSeconds({ saveSeconds: 50, mtbfSeconds: 3600, shards: 1, lostFraction: 0.001 }), 600, "never shorter than Young's");
  // Full recovery at Young's interval: 2 * sqrt(O / (2 T)) + L / T.
  const full = expectedOverhead({ intervalSeconds: 60, saveSeconds: 0.5, loadSeconds: 10, mtbfSeconds: 3600, partial: false });
  t.ok(Math.abs(full - (0.5 / 60 + (10 + 30) / 3600)) < 1e-15);
  t.ok(Math.abs(expectedOverhead({ intervalSeconds: 60, saveSeconds: 0.5, loadSeconds: 10, mtbfSeconds: 3600, partial: true }) - (0.5 / 60 + 10 / 3600)) < 1e-15);
  t.throws(() => youngIntervalSeconds(-1, 10), { code: 'ERR_INVALID_ARGUMENT' });
  t.throws(() => cprIntervalSeconds({ saveSeconds: 1, mtbfSeconds: 10, shards: 0, lostFraction: 0.1 }), { code: 'ERR_INVALID_ARGUMENT' });
  t.throws(() => cprIntervalSeconds({ saveSeconds: 1, mtbfSeconds: 10, shards: 2, lostFraction: 0 }), { code: 'ERR_INVALID_ARGUMENT' });

  const dir = mkdtempSync(join(tmpdir(), 'sapipe-cpr-bad-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const comm = await LocalCommunicator.create({ group: `cpr-bad-${process.pid}`, rank: 0, size: 1 });
  const model = await ClickModel.create({ comm, tables: [10], dim: 2, denseFeatures: 1, embeddingLr: 0.1, optimizer: { kind: 'sgd', lr: 0.1 } });
  await t.rejects(CprCheckpointer.create(model, { dir, policy: 'sometimes' as never, saveEvery: 1 }), { code: 'ERR_INVALID_ARGUMENT' });
  await t.rejects(CprCheckpointer.create(model, { dir, policy: 'partial', saveEvery: 1 }), { code: 'ERR_INVALID_ARGUMENT', message: /handoffDir/ });
  await t.rejects(CprCheckpointer.create(model, { dir, policy: 'full', saveEvery: 0 }), { code: 'ERR_INVALID_ARGUMENT' });
  await t.rejects(CprCheckpointer.create(model, { dir, policy: 'full', saveEvery: 1, every: 2 } as never), { code: 'ERR_INVALID_ARGUMENT' });
  const cpr = await CprCheckpointer.create(model, { dir, policy: 'full', saveEvery: 1 });
  await t.rejects(cpr.save('priority'), { code: 'ERR_INVALID_ARGUMENT' });
  await model.dispose();
  comm.destroy();
});
