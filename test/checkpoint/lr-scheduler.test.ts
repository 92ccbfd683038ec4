/**
 * An LrScheduler drives either trainer (a PipelineTrainer through its `lr`), and its position
 * travels in the checkpoint: a fresh scheduler passed to the load continues where the saved one
 * stood, instead of the user replaying its steps by hand.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import t from 'tap';

import {
  CheckpointError,
  DataParallelTrainer,
  LocalCommunicator,
  LrScheduler,
  ParamSet,
  PipelineTrainer,
  loadCheckpoint,
  loadPipelineCheckpoint,
  mlpLayers,
  saveCheckpoint,
  savePipelineCheckpoint,
  stepDecay,
  type PipelineTrainerOptions,
} from '../../dist/index.js';

const work = mkdtempSync(path.join(tmpdir(), 'sapipe-lr-ckpt-'));
t.teardown(() => rmSync(work, { recursive: true, force: true }));

const pipelineOptions = (): PipelineTrainerOptions => ({
  schedule: '1f1b',
  stages: 2,
  microBatches: 2,
  microBatchSize: 2,
  model: { layers: mlpLayers([4, 3, 2]), seed: 0, boundaries: [1] },
  optimizer: { kind: 'sgd', lr: 0.4, momentum: 0.9 },
  data: { inputs: Float32Array.from({ length: 64 * 4 }, (_, i) => Math.sin(i)), labels: Int32Array.from({ length: 64 }, (_, i) => i % 2), features: 4 },
  shuffle: false,
});

t.test('an LrScheduler drives a PipelineTrainer, and its position comes back with the checkpoint', async (t) => {
  const dir = path.join(work, 'pipeline');
  const trainer = await PipelineTrainer.create(pipelineOptions());
  const schedule = stepDecay(2, 0.5);
  const scheduler = new LrScheduler(trainer, schedule);
  for (let round = 0; round < 5; round++) {
    await trainer.trainRound();
    scheduler.step();
  }
  t.equal(trainer.lr, 0.4 * 0.5 ** 2, 'after 5 steps of halving every 2: lr 0.1');
  const state = await trainer.exportState();
  t.same(state.parts.map((p) => p.optimizer.lr), [0.1, 0.1], "every part's optimizer took the rate");
  await (await savePipelineCheckpoint(trainer, { dir, scheduler })).written;
  await trainer.dispose();

  const again = await PipelineTrainer.create(pipelineOptions());
  const fresh = new LrScheduler(again, schedule);
  t.equal(again.lr, 0.4, 'a fresh scheduler starts at step 0');
  await loadPipelineCheckpoint(again, { dir, scheduler: fresh });
  t.equal(fresh.stepCount, 5, 'the loaded scheduler stands at step 5');
  t.equal(again.lr, 0.1, 'and the trainer at its rate');
  fresh.step();
  t.equal(again.lr, 0.4 * 0.5 ** 3, 'stepping on continues the schedule');
  await again.dispose();
});

t.test('DataParallelTrainer: the scheduler position saved and restored; a scheduler for a checkpoint without one is refused', async (t) => {
  const dir = path.join(work, 'dp');
  const make = async (group: string) => {
    const comm = await LocalCommunicator.create({ group: `${group}-${process.pid}`, rank: 0, size: 1 });
    const params = new ParamSet({ w: [3] });
    return DataParallelTrainer.create({ comm, params, mode: 'sync', optimizer: { kind: 'sgd', lr: 1 } });
  };
  const trainer = await make('lr-a');
  const scheduler = new LrScheduler(trainer, (step) => 1 / (1 + step));
  for (let i = 0; i < 3; i++) {
    trainer.grads.array.fill(0.1);
    await trainer.step();
    scheduler.step();
  }
  await (await saveCheckpoint(trainer, { dir, scheduler })).written;
  const resumed = await make('lr-b');
  const fresh = new LrScheduler(resumed, (step) => 1 / (1 + step));
  await loadCheckpoint(resumed, { dir, scheduler: fresh });
  t.equal(fresh.stepCount, 3);
  t.equal(resumed.optimizer.lr, 0.25, 'lr 1/(1+3)');

  const bare = path.join(work, 'dp-bare');
  await (await saveCheckpoint(trainer, { dir: bare })).written;
  const third = await make('lr-c');
  await t.rejects(loadCheckpoint(third, { dir: bare, scheduler: new LrScheduler(third, () => 1) }), CheckpointError, 'saved without a scheduler: refused, not restarted silently');
  t.throws(() => new LrScheduler({ notLr: 1 } as never, () => 1), /PipelineTrainer/, 'the error says which targets work');
});
