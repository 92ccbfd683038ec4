/**
 * Checkpointer: resumes from the newest complete checkpoint when created, saves every N steps (at
 * exactly those steps, keeping the newest `keep`), or on Young's interval sqrt(2 C M) from the
 * measured save cost C and the given mean time between failures M (a tiny M saves after every
 * step, a huge one only the first save, which measures C); its options are checked.
 */
import { mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t, { type Test } from 'tap';

import { Checkpointer, DataParallelTrainer, LocalCommunicator, ParamSet } from '../../dist/index.js';

async function setup(t: Test): Promise<{ trainer: DataParallelTrainer; dir: string }> {
  const dir = mkdtempSync(join(tmpdir(), 'sapipe-checkpointer-'));
  const comm = await LocalCommunicator.create({ group: `checkpointer-${process.pid}-${Math.random()}`, rank: 0, size: 1 });
  const params = new ParamSet({ w: [100] });
  const trainer = await DataParallelTrainer.create({ comm, params, mode: 'pipe-sgd', optimizer: { kind: 'sgd', lr: 0.1, momentum: 0.9 } });
  t.teardown(async () => {
    await trainer.dispose();
    comm.destroy();
    params.dispose();
    rmSync(dir, { recursive: true, force: true });
  });
  return { trainer, dir };
}

async function steps(trainer: DataParallelTrainer, checkpointer: Checkpointer, n: number): Promise<number[]> {
  const saved: number[] = [];
  for (let i = 0; i < n; i++) {
    trainer.grads.array.fill(0.01 * (i + 1));
    await trainer.step();
    if (await checkpointer.afterStep({ next: trainer.stepCalls })) saved.push(trainer.stepCalls);
  }
  return saved;
}

t.test('every N steps, keeping the newest; a new checkpointer resumes from the newest', async (t) => {
  const { trainer, dir } = await setup(t);
  const c = await Checkpointer.create(trainer, { dir, every: 3, keep: 2 });
  t.equal(c.resumed, null, 'nothing to resume on a first run');
  t.same(await steps(trainer, c, 10), [3, 6, 9], 'saved at steps 3, 6 and 9');
  await c.close();
  t.same(readdirSync(dir).sort(), ['step-0000000006', 'step-0000000009'], 'the newest two kept');
  t.equal(c.costSoFar.saves, 3);
  t.ok(c.costSoFar.snapshotMs >= 0 && c.costSoFar.lastSaved?.step === 9);
  await t.rejects(c.afterStep(), { code: 'ERR_INVALID_ARGUMENT', message: /closed/ });

  const { trainer: fresh } = await setup(t);
  const again = await Checkpointer.create(fresh, { dir, every: 3 });
  t.equal(again.resumed?.step, 9, 'resumed from step 9');
  t.same(again.resumed?.extra, { next: 9 }, 'with its extra');
  t.equal(fresh.stepCalls, 9, 'the trainer continues from there');
  await again.close();
});

t.test("Young's interval: a tiny mean time between failures saves after every step, a huge one only the first save", async (t) => {
  t.equal(Checkpointer.youngIntervalMs(2, 3600), Math.sqrt(2 * 2 * 3600 * 1000), 'sqrt(2 C M), in ms');
  const { trainer, dir } = await setup(t);
  const often = await Checkpointer.create(trainer, { dir, interval: { mtbfSeconds: 1e-9 } });
  t.same(await steps(trainer, often, 4), [1, 2, 3, 4]);
  t.ok(often.costSoFar.intervalMs! < 1, `interval ${often.costSoFar.intervalMs} ms`);
  await often.close();
  const { trainer: other, dir: otherDir } = await setup(t);
  const rarely = await Checkpointer.create(other, { dir: otherDir, interval: { mtbfSeconds: 1e9 } });
  t.same(await steps(other, rarely, 4), [1], 'the first save measures the cost; the next is days away');
  t.ok(rarely.costSoFar.intervalMs! > 1000, `interval ${rarely.costSoFar.intervalMs} ms`);
  await rarely.close();
});

t.test('options are checked', async (t) => {
  const { trainer, dir } = await setup(t);
  await t.rejects(Checkpointer.create(trainer, { dir }), { code: 'ERR_INVALID_ARGUMENT', message: /every .* or interval/ });
  await t.rejects(Checkpointer.create(trainer, { dir, every: 2, interval: { mtbfSeconds: 10 } }), { code: 'ERR_INVALID_ARGUMENT', message: /one of them/ });
  await t.rejects(Checkpointer.create(trainer, { dir, every: 0 }), { code: 'ERR_INVALID_ARGUMENT' });
  await t.rejects(Checkpointer.create(trainer, { dir, interval: { mtbfSeconds: 0 } }), { code: 'ERR_INVALID_ARGUMENT' });
  await t.rejects(Checkpointer.create(trainer, { dir, interval: { mtbf: 10 } as never }), { code: 'ERR_INVALID_ARGUMENT', message: /mtbf/ });
  const c = await Checkpointer.create(trainer, { dir, every: 1 });
  await t.rejects(c.afterStep(undefined, 'yes' as never), { code: 'ERR_INVALID_ARGUMENT', message: /due/ });
  t.equal(await c.afterStep(undefined, false), false, 'due: false skips a save the policy wants');
  await c.close();
});
