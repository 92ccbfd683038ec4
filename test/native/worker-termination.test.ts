/**
 * Terminating a worker thread while it has native operations in flight must not abort the
 * process: while a worker's environment is torn down JS cannot run, so node-addon-api must swallow
 * the exceptions it cannot throw (NODE_API_SWALLOW_UNTHROWABLE_EXCEPTIONS) and completions must be
 * dropped quietly. Before that, this aborted the whole process with "terminate called after
 * throwing an instance of 'Napi::Error'".
 */
import { fileURLToPath } from 'node:url';
import { Worker } from 'node:worker_threads';
import t from 'tap';

const root = fileURLToPath(new URL('../..', import.meta.url));

// Plain JS so the worker needs no TypeScript loader: steps on a queue and reads getters in a loop.
const busyWorker = `
const { parentPort, workerData } = require('node:worker_threads');
const addon = require(require.resolve('node-gyp-build', { paths: [workerData.root] }))(workerData.root);
const queue = new addon.Queue();
const n = 1 << 18;
const w = new addon.NativeBuffer(n), g = new addon.NativeBuffer(n), m = new addon.NativeBuffer(n), v = new addon.NativeBuffer(n);
let step = 1;
(async () => {
  parentPort.postMessage('started');
  for (;;) {
    const pending = addon.updateAsync(queue, { optimizer: 1, lr: 1e-3, step: step++ }, { weights: w, grad: g, momentum: m, secondMoment: v });
    void w.disposed; void queue.pending;
    await pending;
  }
})();
`;

t.test('terminating workers mid-operation leaves the process running', async (t) => {
  for (let round = 0; round < 20; round++) {
    const worker = new Worker(busyWorker, { eval: true, workerData: { root } });
    await new Promise<void>((resolve, reject) => {
      worker.once('message', () => resolve());
      worker.once('error', reject);
    });
    await new Promise((r) => setTimeout(r, round % 5));
    const code = await worker.terminate();
    t.equal(code, 1, `round ${round}: terminated`);
  }
  t.pass('the process survived 20 terminations with operations in flight');
});
