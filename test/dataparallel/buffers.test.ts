/**
 * The gradient buffer a caller fills is never the one being reduced: after every step and after a
 * flush() at any point of the pipeline, `trainer.grads` is free for a native kernel to write.
 * (A step right after a flush() that followed an odd number of steps once handed out the buffer
 * whose all-reduce had just started.)
 */
import t from 'tap';

import { DataParallelTrainer, LocalCommunicator, ParamSet, scale } from '../../lib/index.js';

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
