/**
 * Each thread's kernels on cores of their own (lib/kernel-threads.ts; the native side is checked
 * by sapipe_cpu_check's "thread pools"): the binding and its errors, a worker thread's binding
 * apart from the main thread's, the pipeline trainer's `kernelThreads` (resolved, refused, and
 * training the same weights on its own cores as on the shared pool), and the machine profile
 * timed with the workers' threads.
 */
import { availableParallelism } from 'node:os';
import { Worker } from 'node:worker_threads';
import t from 'tap';

import { PipelineTrainer, kernelThreads, measurePassCores, nativeInfo, profilePartCosts, useKernelThreads } from '../../dist/index.js';
import { LAYERS, dataset, evenBoundaries } from '../pipeline/runtime-helpers.js';

const DIST = new URL('../../dist/index.js', import.meta.url).href;

t.test('useKernelThreads binds the calling thread and back', async (t) => {
  t.equal(kernelThreads(), nativeInfo().threads, 'a thread starts on the process-wide pool');
  t.equal(useKernelThreads(3), 3);
  t.equal(kernelThreads(), 3);
  t.equal(useKernelThreads(1), 1);
  t.equal(kernelThreads(), 1);
  t.equal(useKernelThreads('shared'), nativeInfo().threads);
  t.equal(kernelThreads(), nativeInfo().threads);
  for (const bad of [0, -1, 1.5, 2000, Number.NaN, '2', null, undefined, 'auto'])
    t.throws(() => useKernelThreads(bad as never), { code: 'ERR_INVALID_ARGUMENT', message: /useKernelThreads: threads \(or 'shared'\)/ }, `refuses ${String(bad)}`);
  t.equal(kernelThreads(), nativeInfo().threads, 'a refused call leaves the binding as it was');
});

t.test("a worker thread's binding is its own", async (t) => {
  useKernelThreads(2);
  const code = `
    const { parentPort } = require('node:worker_threads');
    import(${JSON.stringify(DIST)}).then((s) => {
      const before = s.kernelThreads();
      s.useKernelThreads(1);
      parentPort.postMessage({ before, after: s.kernelThreads() });
    });`;
  const reply = await new Promise<{ before: number; after: number }>((resolve, reject) => {
    const w = new Worker(code, { eval: true });
    w.once('message', (m) => {
      resolve(m);
      void w.terminate();
    });
    w.once('error', reject);
  });
  t.same(reply, { before: nativeInfo().threads, after: 1 }, 'a new worker starts on the process-wide pool and binds its own');
  t.equal(kernelThreads(), 2, "the main thread's binding is untouched");
  useKernelThreads('shared');
});

const { inputs, labels } = dataset(512);
const options = (kernel: unknown) =>
  ({
    schedule: '1f1b',
    stages: 2,
    microBatches: 4,
    microBatchSize: 8,
    model: { layers: LAYERS, seed: 3, boundaries: evenBoundaries(LAYERS.length, 2) },
    optimizer: { kind: 'sgd', lr: 0.05, momentum: 0.9 },
    data: { inputs, labels, features: 12 },
    shuffle: false,
    ...(kernel === undefined ? {} : { kernelThreads: kernel }),
  }) as never;

t.test('PipelineTrainer: kernelThreads resolved and refused', async (t) => {
  const auto = await PipelineTrainer.create(options(undefined));
  t.equal(auto.kernelThreads, Math.max(1, Math.floor(availableParallelism() / 2)), "auto: this process's cores split among the 2 workers, at least 1 each");
  await auto.dispose();
  const avg = await PipelineTrainer.create({ ...(options('auto') as object), schedule: 'avgpipe', averaging: { layout: 'worker-per-replica' } } as never);
  t.equal(avg.kernelThreads, Math.max(1, Math.floor(availableParallelism() / 4)), 'auto counts the workers: 2 pipelines x 2 stages');
  await avg.dispose();
  for (const bad of [0, 1.5, 'all', null, 4096])
    await t.rejects(PipelineTrainer.create(options(bad)), { code: 'ERR_INVALID_ARGUMENT', message: /PipelineTrainer: kernelThreads/ }, `refuses ${String(bad)}`);
});

t.test('PipelineTrainer: the same training on cores of their own as on the shared pool', async (t) => {
  const run = async (kernel: number | 'shared'): Promise<{ weights: Float32Array[]; losses: number[] }> => {
    const trainer = await PipelineTrainer.create(options(kernel));
    t.equal(trainer.kernelThreads, kernel, `kernelThreads ${kernel} as given`);
    try {
      const losses: number[] = [];
      for (let r = 0; r < 8; r++) losses.push((await trainer.trainRound()).loss);
      return { weights: await trainer.weights(), losses };
    } finally {
      await trainer.dispose();
    }
  };
  const shared = await run('shared');
  for (const kernel of [1, 2]) {
    const own = await run(kernel);
    let worst = 0;
    own.weights.forEach((w, j) => w.forEach((x, i) => (worst = Math.max(worst, Math.abs(x - shared.weights[j]![i]!)))));
    t.ok(worst <= 1e-6, `kernelThreads ${kernel}: weights within 1e-6 of the shared pool's after 8 rounds (worst ${worst})`);
    t.ok(own.losses.every((l, r) => Math.abs(l - shared.losses[r]!) <= 1e-6 * Math.abs(shared.losses[r]!)), `kernelThreads ${kernel}: every round's loss within 1e-6 relative`);
  }
});

t.test('the machine profile is timed with the workers\' kernel threads', async (t) => {
  const boundaries = evenBoundaries(LAYERS.length, 2);
  const parts = profilePartCosts(LAYERS, boundaries, { microBatchSizes: [4, 8], repeats: 2, kernelThreads: 1 });
  t.equal(parts.length, 2);
  t.equal(kernelThreads(), nativeInfo().threads, 'profiling restores the calling thread\'s pool');
  useKernelThreads(2);
  profilePartCosts(LAYERS, boundaries, { microBatchSizes: [4, 8], repeats: 1, kernelThreads: 1 });
  t.equal(kernelThreads(), 2, "and a thread's own pool");
  useKernelThreads('shared');
  const wide = await measurePassCores(LAYERS, [0, 4], 8, { passes: 2, cores: 4, kernelThreads: 2 });
  t.equal(wide.threads, 2, '4 cores at 2 kernel threads each: 2 threads at once');
  t.ok(wide.passCores >= 1 && wide.passCores <= 4, 'a pass uses between 1 core and all of them');
  t.throws(() => profilePartCosts(LAYERS, boundaries, { microBatchSizes: [4, 8], kernelThreads: 0 }), { code: 'ERR_INVALID_ARGUMENT', message: /profilePartCosts: options.kernelThreads/ });
  await t.rejects(measurePassCores(LAYERS, [0, 4], 8, { kernelThreads: 'auto' as never }), { code: 'ERR_INVALID_ARGUMENT', message: /measurePassCores: options.kernelThreads/ });
});
