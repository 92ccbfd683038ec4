/**
 * The checkpoint API's bad input is typed: something that is not a trainer is an
 * InvalidArgumentError saying what was expected (not a TypeError from inside), and a directory
 * that cannot take a checkpoint (under a regular file, in procfs or sysfs) is a CheckpointError
 * naming the directory and the OS error, promptly: a save into `/proc/self` once never settled.
 */
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t, { type Test } from 'tap';

import { Checkpointer, DataParallelTrainer, LocalCommunicator, ParamSet, PipelineTrainer, loadCheckpoint, loadPipelineCheckpoint, saveCheckpoint, savePipelineCheckpoint } from '../../dist/index.js';

async function oneRank(t: Test): Promise<DataParallelTrainer> {
  const comm = await LocalCommunicator.create({ group: `ckpt-bad-${process.pid}-${Math.random()}`, rank: 0, size: 1 });
  const params = new ParamSet({ w: [8] });
  const trainer = await DataParallelTrainer.create({ comm, params, mode: 'sync', optimizer: { kind: 'sgd', lr: 0.1 } });
  t.teardown(async () => {
    await trainer.dispose();
    comm.destroy();
    params.dispose();
  });
  return trainer;
}

/** How `work` ends within `ms`: its value, its error, or 'pending' (a promise that never settles fails the test instead of hanging it). */
async function within(work: () => Promise<unknown>, ms = 5000): Promise<{ value?: unknown; error?: unknown; pending?: true }> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<{ pending: true }>((resolve) => (timer = setTimeout(() => resolve({ pending: true }), ms)));
  try {
    return await Promise.race([work().then((value) => ({ value }), (error: unknown) => ({ error })), timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/** A save through to its file on disk. */
async function saveAndWrite(trainer: DataParallelTrainer, dir: string): Promise<unknown> {
  return (await saveCheckpoint(trainer, { dir })).written;
}

t.test('something that is not a DataParallelTrainer is an InvalidArgumentError saying what was expected', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'sapipe-ckpt-bad-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const trainer = await oneRank(t);
  // Object.create(prototype): passes a plain instanceof, but is no trainer (its fields were never set).
  const notTrainers: unknown[] = [undefined, null, 42, 'trainer', {}, { comm: { rank: 0, size: 1 }, exportState: () => ({}) }, trainer.params, Object.create(DataParallelTrainer.prototype)];
  for (const x of notTrainers) {
    const expected = { code: 'ERR_INVALID_ARGUMENT', message: /trainer must be a DataParallelTrainer, got/ };
    await t.rejects(saveCheckpoint(x as never, { dir }), expected, `saveCheckpoint(${String(x)})`);
    await t.rejects(loadCheckpoint(x as never, { dir }), expected, `loadCheckpoint(${String(x)})`);
    await t.rejects(Checkpointer.create(x as never, { dir, every: 1 }), expected, `Checkpointer.create(${String(x)})`);
  }
  await t.rejects(savePipelineCheckpoint(trainer as never, { dir }), { code: 'ERR_INVALID_ARGUMENT', message: /PipelineTrainer/ }, 'the pipeline entry points want a PipelineTrainer');
  await t.rejects(loadPipelineCheckpoint(trainer as never, { dir }), { code: 'ERR_INVALID_ARGUMENT', message: /PipelineTrainer/ });
  await t.rejects(savePipelineCheckpoint(Object.create(PipelineTrainer.prototype) as never, { dir }), { code: 'ERR_INVALID_ARGUMENT', message: /PipelineTrainer/ }, 'nor an object with its prototype');
  await t.rejects(loadCheckpoint(trainer, null as never), { code: 'ERR_INVALID_ARGUMENT', message: /options/ });
  await t.rejects(Checkpointer.create(trainer, { dir: 7, every: 1 } as never), { code: 'ERR_INVALID_ARGUMENT', message: /dir must be a directory path/ });
});

t.test('a directory under a regular file is a CheckpointError naming it and ENOTDIR', async (t) => {
  const base = mkdtempSync(join(tmpdir(), 'sapipe-ckpt-bad-'));
  t.teardown(() => rmSync(base, { recursive: true, force: true }));
  const file = join(base, 'a-file');
  writeFileSync(file, 'not a directory');
  const dir = join(file, 'ckpt');
  const trainer = await oneRank(t);
  const unwritable = { code: 'ERR_CHECKPOINT', reason: 'unwritable', message: new RegExp(`${dir.replace(/[/.-]/g, '\\$&')}.*ENOTDIR`) };
  t.match(await within(() => saveAndWrite(trainer, dir)), { error: unwritable }, 'saveCheckpoint');
  t.match(await within(() => Checkpointer.create(trainer, { dir, every: 1 })), { error: unwritable }, 'Checkpointer.create, before training');
  t.match(await within(() => loadCheckpoint(trainer, { dir })), { error: { code: 'ERR_CHECKPOINT', message: /ENOTDIR/ } }, 'loadCheckpoint');
});

t.test('/proc/self: the save settles promptly with a CheckpointError naming the directory', existsSync('/proc/self') ? {} : { skip: 'no procfs here' }, async (t) => {
  const trainer = await oneRank(t);
  const named = (dir: string): object => ({ code: 'ERR_CHECKPOINT', reason: 'unwritable', message: new RegExp(`cannot write a checkpoint to ${dir.replace(/[/.-]/g, '\\$&')}: E[A-Z]+`) });
  for (const dir of ['/proc/self', '/proc/self/sapipe-checkpoints']) {
    const saved = await within(() => saveAndWrite(trainer, dir));
    t.notOk(saved.pending, `${dir}: settled within 5 s`);
    t.match(saved, { error: named(dir) }, `${dir}: saveCheckpoint`);
    const created = await within(async () => {
      const c = await Checkpointer.create(trainer, { dir, every: 1 });
      await trainer.step();
      await c.afterStep();
      await c.close();
    });
    t.notOk(created.pending, `${dir}: the Checkpointer settled within 5 s`);
    t.match(created, { error: named(dir) }, `${dir}: Checkpointer.create refuses it`);
  }
  if (existsSync('/sys/kernel')) {
    const dir = '/sys/kernel/sapipe-checkpoints';
    t.match(await within(() => saveAndWrite(trainer, dir)), { error: named(dir) }, `${dir}: sysfs refuses mkdir`);
  }
});
