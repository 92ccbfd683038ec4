/**
 * The gradient buffer a caller fills is never the one being reduced: after every step and after a
 * flush() at any point of the pipeline, `trainer.grads` is free for a native kernel to write.
 * (A step right after a flush() that followed an odd number of steps once handed out the buffer
 * whose all-reduce had just started.)
 */
import t from 'tap';

import { DataParallelTrainer, LocalCommunicator, ParamSet, scale } from '../../dist/index.js';

for (const mode of ['pipe-sgd', 'sapipe-dc'] as const) {
  t.test(`${mode}: trainer.grads is writable after every step and flush`, async (t) => {
    const comm = await LocalCommunicator.create({ group: `dp-buffers-${mode}-${process.pid}`, rank: 0, size: 1 });
    const params = new ParamSet({ w: [40] });
    const trainer = await DataParallelTrainer.create({ comm, params, mode, optimizer: { kind: 'sgd', lr: 0.1, momentum: 0.9 } });
    const writable = (when: string): void => {
      t.doesNotThrow(() => scale(trainer.grads, 0.5), `${when}: grads is not in flight`);
    };
    for (const stepsBeforeFlush of [1, 2, 3]) {
      for (let i = 0; i < stepsBeforeFlush; i++) {
        trainer.grads.array.fill(0.01);
        await trainer.step();
        writable(`after step ${i + 1} of ${stepsBeforeFlush}`);
      }
      await trainer.flush();
      writable(`after a flush following ${stepsBeforeFlush} step(s)`);
      trainer.grads.array.fill(0.01);
      await trainer.step();
      writable(`after the first step following a flush after ${stepsBeforeFlush} step(s)`);
      await trainer.flush();
    }
    trainer.dispose();
    comm.destroy();
    params.dispose();
  });
}

// The API fuzzer once disposed trainer.grads while step() awaited the update in flight: the
// overlapped step then queued its buckets before a native check refused the disposed buffer, and
// the buckets' rejections killed the process as unhandled.
for (const overlapUpdate of [true, false]) {
  t.test(`pipe-sgd (overlapUpdate: ${overlapUpdate}): a gradient disposed while step() runs fails that step with a typed error, and every later call too`, async (t) => {
    const comm = await LocalCommunicator.create({ group: `dp-buffers-disposed-${overlapUpdate}-${process.pid}`, rank: 0, size: 1 });
    const params = new ParamSet({ w: [40] });
    const trainer = await DataParallelTrainer.create({ comm, params, mode: 'pipe-sgd', optimizer: { kind: 'sgd', lr: 0.1 }, overlapUpdate });
    trainer.grads.array.fill(0.01);
    await trainer.step();
    const pending = trainer.step();
    trainer.grads.dispose(); // the buffer step() just took, before it starts the reduction
    await t.rejects(pending, { code: 'ERR_DISPOSED' });
    await t.rejects(trainer.step(), { code: 'ERR_DISPOSED' }, 'the trainer refuses to go on');
    t.ok(params.weights.array.every(Number.isFinite), 'the weights are finite');
    t.doesNotThrow(() => trainer.dispose(), 'the optimizer is not left stepping (dispose refuses a step in flight)');
    comm.destroy();
    params.dispose();
  });
}
