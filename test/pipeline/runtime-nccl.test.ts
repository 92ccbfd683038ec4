/**
 * Launched pipeline stages on GPUs: stages started by `sapipe launch` (one rank per stage), each
 * with its part on `cuda:0` of its own process and activations and gradients sent by NCCL
 * send/recv between neighbours, train GPipe, 1F1B and PipeOptim on 2 and 4 stages to the weights
 * and losses the worker-thread trainer reaches on the CPU; a stage SIGKILLed mid-training fails
 * the others with ERR_PEER_LOST (or ERR_TIMEOUT) within the timeout. Runs on the CUDA plugin over
 * host memory (native/tests/fakes/plugin_host_memory.cpp: each process's cuda:0 is its own host
 * memory, the NCCL ranks meet over Unix sockets), so the device runtime, the NCCL bindings and
 * the launcher run for real and the arithmetic is the CPU's; on GPUs, docs/cuda.md says how to
 * run the same job. Needs the UCX plugin too (the losses and weights go to rank 0 over the host
 * communicator).
 */
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import t from 'tap';

import { ucxStatus } from '../../dist/comm/ucx-native.js';
import { InvalidArgumentError, trainPipelineStage, type PipelineOptimizerSpec, type RuntimeScheduleName } from '../../dist/index.js';
import { FEATURES, LAYERS, dataset } from '../fixtures/pipeline/data.mjs';
import { launchStages, threadReference } from '../helpers/launched-stages.js';

const PLUGIN = fileURLToPath(new URL('../../build/Release/test-fakes/sapipe_test_plugin_host_memory.so', import.meta.url));
if (!existsSync(PLUGIN)) throw new Error(`${PLUGIN} is missing: build the native targets (npm run build:native)`);
// The launched processes inherit it; this process's refusals below plan on cuda:0 of the plugin
// too (read when the addon first opens it).
process.env.SAPIPE_CUDA_PLUGIN = PLUGIN;

const status = ucxStatus();
if (!status.available) {
  if (process.env.CI) t.fail(`the ucx plugin is not available in CI, so launched device stages are untested: ${status.reason ?? 'unknown'}`);
  else t.comment(`launched device stages cannot run here: ${status.reason ?? 'unknown'}`);
}
const needsUcx = status.available ? {} : { skip: `the ucx plugin is unavailable: ${status.reason ?? 'unknown'}` };

const SAMPLES = 96;
const optimizer: PipelineOptimizerSpec = { kind: 'sgd', lr: 0.05, momentum: 0.9 };
// The device stages run the CPU's kernels behind the plugin, in the order the threads run them:
// the tolerance (that of test/cuda/device-pipeline.test.ts) leaves room for a GPU's rounding.
const WEIGHT_RTOL = 1e-4;
const WEIGHT_ATOL = 1e-5;
const LOSS_TOL = 1e-4;

const cases: { schedule: RuntimeScheduleName; stages: number; boundaries: number[] }[] = [
  { schedule: 'gpipe', stages: 2, boundaries: [4] },
  { schedule: '1f1b', stages: 4, boundaries: [2, 4, 6] },
  { schedule: 'pipeoptim', stages: 4, boundaries: [2, 4, 6] },
];

for (const c of cases) {
  t.test(`${c.schedule} on ${c.stages} processes on devices over NCCL equals the worker-thread trainer on the CPU`, needsUcx, async (t) => {
    const job = { schedule: c.schedule, stages: c.stages, microBatches: 4, microBatchSize: 4, boundaries: c.boundaries, seed: 1 };
    const launched = await launchStages({ ...job, epochs: 2, optimizer, samples: SAMPLES, device: 'cuda:0' }, c.stages);
    t.equal(launched.exitCode, 0, `the job succeeded\n${launched.stderr.slice(-2000)}`);
    const { trainer, epochs, weights } = await threadReference(job, optimizer, SAMPLES);
    try {
      const got = launched.result?.weights ?? [];
      t.equal(got.length, c.stages, 'rank 0 gathered every part');
      let worst = 0;
      weights.forEach((w, j) => w.forEach((v, i) => (worst = Math.max(worst, Math.abs(v - (got[j]?.[i] ?? NaN)) / (WEIGHT_ATOL + WEIGHT_RTOL * Math.abs(v))))));
      t.ok(worst <= 1, `every weight within ${WEIGHT_RTOL} relative + ${WEIGHT_ATOL} (worst ${worst.toFixed(3)} of the tolerance)`);
      t.equal(launched.result?.epochs.length, 2);
      for (const e of [0, 1]) {
        const loss = launched.result?.epochs[e]?.loss ?? NaN;
        t.ok(Math.abs(loss - epochs[e]!.loss) <= LOSS_TOL, `epoch ${e + 1}'s mean loss within ${LOSS_TOL} (${loss} against ${epochs[e]!.loss})`);
      }
    } finally {
      await trainer.dispose();
    }
  });
}

t.test('a device stage SIGKILLed mid-training fails the others with ERR_PEER_LOST within the timeout', needsUcx, async (t) => {
  const timeoutMs = 6000;
  // A job that cannot end first, and a kill late enough to land in training after every rank joined
  // (they join within 2-3 s here, on a loaded machine too).
  const afterMs = 8000;
  const launched = await launchStages(
    { schedule: '1f1b', stages: 3, microBatches: 4, microBatchSize: 4, boundaries: [3, 6], seed: 1, epochs: 100000, optimizer, samples: SAMPLES, device: 'cuda:0', timeoutMs, kill: { rank: 1, afterMs } },
    3,
  );
  t.equal(launched.exitCode, 128 + 9, `the job fails with the killed rank's signal\n${launched.stderr.slice(-1500)}`);
  for (const rank of [0, 2]) {
    const f = launched.failures.get(rank);
    t.match(f?.code, /^ERR_(PEER_LOST|TIMEOUT)$/, `rank ${rank} failed with ERR_PEER_LOST or ERR_TIMEOUT (${f?.message ?? 'no report'})`);
  }
  t.ok(launched.elapsedMs < afterMs + timeoutMs + 10000, `the job ended in ${launched.elapsedMs} ms (the kill came at ${afterMs} ms)`);
});

t.test("launched device stages refuse the schedules they do not run and a given communicator, saying what runs; 'cuda' and 'auto' take the local rank's GPU", async (t) => {
  const { inputs, labels } = dataset(SAMPLES);
  const base = { stages: 2, microBatches: 4, microBatchSize: 4, model: { layers: LAYERS, seed: 3, boundaries: [4] }, optimizer, data: { inputs, labels, features: FEATURES }, epochs: 1, device: 'cuda:0' as const };
  await t.rejects(trainPipelineStage({ ...base, schedule: 'pipedream' }), { name: InvalidArgumentError.name, code: 'ERR_INVALID_ARGUMENT', message: /run gpipe, 1f1b, pipeoptim; 'pipedream' runs launched on the CPU/ });
  await t.rejects(trainPipelineStage({ ...base, schedule: '1f1b', comm: {} as never }), { code: 'ERR_INVALID_ARGUMENT', message: /create their communicators .* leave out comm/ });
  // 'cuda' and 'auto' take the GPU of the local rank: the plugin has only cuda:0.
  const saved = { RANK: process.env.RANK, WORLD_SIZE: process.env.WORLD_SIZE, LOCAL_RANK: process.env.LOCAL_RANK };
  Object.assign(process.env, { RANK: '1', WORLD_SIZE: '2', LOCAL_RANK: '1' });
  t.teardown(() => {
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
  });
  for (const device of ['cuda', 'auto'])
    await t.rejects(trainPipelineStage({ ...base, schedule: '1f1b', device: device as never }), { code: 'ERR_BACKEND_UNAVAILABLE', message: /cuda:1 does not exist/ }, `'${device}' on local rank 1`);
});
