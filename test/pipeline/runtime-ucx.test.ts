/**
 * The pipeline runtime across processes: stages started by `sapipe launch` (one rank per stage)
 * over the ucx backend train 1F1B and PipeOptim, and parallel pipelines (2 x 1F1B coupled by
 * sapipe-wp, AvgPipe with 2 pipelines: one rank per stage of every pipeline) to the weights, loss
 * and accuracy the worker-thread trainer reaches on the same job over `local`; a stage SIGKILLed mid-round fails the others with
 * ERR_PEER_LOST within the timeout. Needs the UCX plugin (`npm run build:native` with
 * libucx-dev); in CI a missing plugin fails the run, elsewhere the tests say why they cannot run.
 */
import { fileURLToPath } from 'node:url';
import { availableParallelism } from 'node:os';
import t from 'tap';

import { ucxStatus } from '../../dist/comm/ucx-native.js';
import type { PipelineOptimizerSpec, RuntimeScheduleName } from '../../dist/index.js';
import { launchStages, threadReference } from '../helpers/launched-stages.js';

const FAULTY = fileURLToPath(new URL('../fixtures/pipeline/faulty-stage.mjs', import.meta.url));

const status = ucxStatus();
if (!status.available) {
  if (process.env.CI) t.fail(`the ucx plugin is not available in CI, so pipeline stages over ucx are untested: ${status.reason ?? 'unknown'}`);
  else t.comment(`ucx pipeline tests cannot run here: ${status.reason ?? 'unknown'}`);
}
const needsUcx = status.available ? {} : { skip: `the ucx plugin is unavailable: ${status.reason ?? 'unknown'}` };

const SAMPLES = 160;
const optimizer: PipelineOptimizerSpec = { kind: 'sgd', lr: 0.05, momentum: 0.9 };
const job = { stages: 3, microBatches: 4, microBatchSize: 4, boundaries: [3, 6], seed: 1 };

// Parallel pipelines: N x S ranks, each joining its pipeline's and its stage's ucx groups. The sums
// over 2 replicas are the same either way round, so the processes match the threads as closely.
const parallel: { name: string; schedule: RuntimeScheduleName; stages: number; boundaries: number[]; extra: Record<string, unknown> }[] = [
  { name: '1f1b', schedule: '1f1b', stages: 3, boundaries: job.boundaries, extra: {} },
  { name: 'pipeoptim', schedule: 'pipeoptim', stages: 3, boundaries: job.boundaries, extra: {} },
  { name: '2 pipelines x 1f1b, sapipe-wp', schedule: '1f1b', stages: 2, boundaries: [4], extra: { pipelines: 2, dataParallel: { mode: 'sapipe-wp' } } },
  { name: 'avgpipe, 2 pipelines', schedule: 'avgpipe', stages: 2, boundaries: [4], extra: { pipelines: 2, advance: 1 } },
];

for (const c of parallel) {
  const ranks = c.stages * ((c.extra.pipelines as number | undefined) ?? 1);
  t.test(`${c.name} on ${ranks} processes over ucx equals the worker-thread trainer over local`, needsUcx, async (t) => {
    const launched = await launchStages({ ...job, schedule: c.schedule, stages: c.stages, boundaries: c.boundaries, ...c.extra, epochs: 2, optimizer, samples: SAMPLES }, ranks);
    t.equal(launched.exitCode, 0, `the job succeeded\n${launched.stderr.slice(-2000)}`);
    const { trainer, epochs, weights, inputs, labels } = await threadReference({ ...job, schedule: c.schedule, stages: c.stages, boundaries: c.boundaries }, optimizer, SAMPLES, c.extra);
    try {
      const got = launched.result!.weights;
      t.equal(got.length, c.stages, 'rank 0 gathered every part');
      let worst = 0;
      weights.forEach((w, j) => w.forEach((v, i) => (worst = Math.max(worst, Math.abs(v - got[j]![i]!)))));
      t.ok(worst <= 1e-6, `largest difference ${worst.toExponential(2)} (same kernels, same order)`);
      t.equal(launched.result!.epochs.length, 2);
      t.ok(Math.abs(launched.result!.epochs[1]!.loss - epochs[1]!.loss) <= 1e-5, `the mean loss over every pipeline's micro-batches (${launched.result!.epochs[1]!.loss} against ${epochs[1]!.loss})`);
      t.equal(launched.result!.epochs[1]!.accuracy, await trainer.evaluate(inputs, labels), 'rank 0 evaluated the whole model as the trainer does');
      t.equal(launched.result!.kernelThreads, Math.max(1, Math.floor(availableParallelism() / ranks)), "each process's kernels on its share of the cores (LOCAL_WORLD_SIZE processes split them)");
    } finally {
      await trainer.dispose();
    }
  });
}

t.test('a stage SIGKILLed mid-round fails the others with ERR_PEER_LOST within the timeout', needsUcx, async (t) => {
  const timeoutMs = 4000;
  const launched = await launchStages(
    { ...job, schedule: '1f1b', epochs: 1, optimizer, samples: SAMPLES, timeoutMs, model: { module: FAULTY, options: { boundaries: [2, 4], fail: { part: 1, microBatch: 2, how: 'kill' } } } },
    3,
  );
  t.equal(launched.exitCode, 128 + 9, `the job fails with the killed rank's signal\n${launched.stderr.slice(-1500)}`);
  for (const rank of [0, 2]) {
    const f = launched.failures.get(rank);
    t.equal(f?.code, 'ERR_PEER_LOST', `rank ${rank} failed with ERR_PEER_LOST (${f?.message ?? 'no report'})`);
  }
  t.ok(launched.elapsedMs < 20000, `the job ended in ${launched.elapsedMs} ms`);
});
