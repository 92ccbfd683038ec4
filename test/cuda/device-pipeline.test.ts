/**
 * The pipeline runtime with every stage on one device (PipelineTrainer `device: 'cuda:0'`: the
 * stages in this process, weights, gradients, optimizer state, activations, stashed and predicted
 * versions in device memory, transfers device-to-device copies) against the same schedule on the
 * CPU's stage threads: 50 rounds of an MLP, round losses and final weights. On a GPU this checks
 * cuBLAS and the kernels under the runtime; on the CUDA plugin over host memory
 * (test/cuda/emulated.test.ts imports this file) it checks the runtime's device path itself; with
 * neither, every test asserts why no device is usable instead of passing.
 */
import t, { type Test } from 'tap';

import { chooseDevice, cudaStatus } from '../../dist/device/index.js';
import { BackendUnavailableError, InvalidArgumentError } from '../../dist/errors.js';
import { mlpLayers } from '../../dist/nn/sequential.js';
import { PipelineTrainer } from '../../dist/pipeline/runtime/trainer.js';
import type { PipelineTrainerOptions } from '../../dist/pipeline/runtime/plan.js';
import { rng, worstError } from '../helpers/random.js';
import { emulated, logged } from '../helpers/stream-log.js';

const gpu = cudaStatus().available;

function deviceTest(name: string, fn: (t: Test) => Promise<void>): void {
  t.test(`GPU: ${name}`, async (t) => {
    if (!gpu) {
      await t.rejects(PipelineTrainer.create({ ...base('gpipe', 2), device: 'cuda:0' }), BackendUnavailableError, 'no usable device: the trainer says so, typed');
      return;
    }
    await fn(t);
  });
}

const samples = 256;
const features = 12;
const classes = 5;
const random = rng(7);
const inputs = Float32Array.from({ length: samples * features }, () => random() * 2 - 1);
// Labels a small MLP can learn: the class of the largest of the first `classes` features.
const labels = Int32Array.from({ length: samples }, (_, i) => {
  let best = 0;
  for (let c = 1; c < classes; c++) if (inputs[i * features + c]! > inputs[i * features + best]!) best = c;
  return best;
});

function base(schedule: PipelineTrainerOptions['schedule'], stages: number): PipelineTrainerOptions {
  return {
    schedule,
    stages,
    microBatches: 4,
    microBatchSize: 8,
    // 4 linear layers (7 layers with the ReLUs) cut by parameter count: the same cut on both sides.
    model: { layers: mlpLayers([features, 24, 24, 16, classes]), seed: 3, boundaries: 'params' },
    optimizer: { kind: 'sgd', lr: 0.05, momentum: 0.9 },
    data: { inputs, labels, features },
    seed: 5,
    timeoutMs: 20_000,
  };
}

async function train(options: PipelineTrainerOptions, rounds: number): Promise<{ losses: number[]; weights: Float32Array[]; versions: string; device: string }> {
  const trainer = await PipelineTrainer.create(options);
  try {
    const losses: number[] = [];
    let versions = '';
    for (let r = 0; r < rounds; r++) {
      const report = await trainer.trainRound();
      losses.push(report.loss);
      if (r === rounds - 1) versions = JSON.stringify(report.versions);
    }
    return { losses, weights: await trainer.weights(), versions, device: trainer.device.device };
  } finally {
    await trainer.dispose();
  }
}

/** A few rounds of `options` on cuda:0 enqueue nothing on the default stream, and on `streams` streams that each run model operations. */
async function onStreams(t: Test, options: PipelineTrainerOptions, streams: number): Promise<void> {
  const trainer = await PipelineTrainer.create({ ...options, device: 'cuda:0' });
  try {
    await trainer.trainRound(); // buffers allocated
    const { ops } = await logged(async () => {
      for (let r = 0; r < 3; r++) await trainer.trainRound();
    });
    // Only the host-memory plugin logs the streams; on a GPU, compute-sanitizer checks the order (docs/cuda.md).
    if (!emulated) return;
    const seen = new Set(ops.map((o) => o.stream));
    t.notOk(seen.has(0), 'nothing inside the rounds on the default stream');
    t.equal(seen.size, streams, `${streams} streams`);
    for (const s of seen) t.ok(ops.some((o) => o.stream === s && o.op === 'nn'), `stream ${s} runs model operations`);
    if (options.schedule !== 'avgpipe') t.ok(ops.some((o) => o.op === 'update'), 'the optimizer steps are on the streams too');
  } finally {
    await trainer.dispose();
  }
}

for (const [schedule, stages] of [['1f1b', 4], ['gpipe', 2]] as const) {
  deviceTest(`${schedule} on ${stages} stages of one device: each stage's work on a stream of its own, none on the default stream in a round`, (t) => onStreams(t, base(schedule, stages), stages));
}

// The device runs the same kernels in another order (cuBLAS's products, FMAs): a few ulps per
// step, compounded over 50 updates. On the host-memory plugin the two paths agree far closer.
const WEIGHT_RTOL = 1e-4;
const WEIGHT_ATOL = 1e-5;
const LOSS_TOL = 1e-3;

const cases: Array<[PipelineTrainerOptions['schedule'], number, PipelineTrainerOptions['optimizer']?]> = [
  ['gpipe', 2],
  ['gpipe', 4],
  ['1f1b', 2],
  ['1f1b', 4],
  ['pipeoptim', 2, { kind: 'adamw', lr: 0.003, weightDecay: 0.01 }],
  ['pipeoptim', 4, { kind: 'adamw', lr: 0.003, weightDecay: 0.01 }],
  // Stashed versions (PipeDream) and SpecTrain's backward prediction on the device.
  ['pipedream', 2],
  ['spectrain', 2],
];

/**
 * `options` trained `rounds` rounds on the CPU's stage threads and on cuda:0: the same weight
 * versions read, the round losses and the final weights (AvgPipe's: each part's center) within the
 * tolerances above, and a loss that falls to `falls` of its first.
 */
async function trainsAsOnCpu(t: Test, options: PipelineTrainerOptions, rounds: number, falls = 0.9): Promise<void> {
  const cpu = await train(options, rounds);
  const dev = await train({ ...options, device: 'cuda:0' }, rounds);
  t.equal(dev.device, 'cuda:0');
  t.equal(cpu.device, 'cpu');
  t.equal(dev.versions, cpu.versions, 'every pass read the same weight version (and prediction) as on the CPU');
  const lossGap = Math.max(...dev.losses.map((l, i) => Math.abs(l - cpu.losses[i]!)));
  t.ok(lossGap <= LOSS_TOL, `round losses within ${LOSS_TOL} (worst ${lossGap.toExponential(2)})`);
  t.ok(cpu.losses[rounds - 1]! < cpu.losses[0]! * falls, `it trains: loss ${cpu.losses[0]!.toFixed(3)} -> ${cpu.losses[rounds - 1]!.toFixed(3)}`);
  cpu.weights.forEach((w, part) => {
    const e = worstError(dev.weights[part]!, w, WEIGHT_ATOL, WEIGHT_RTOL);
    t.ok(e.ratio <= 1, `part ${part}'s weights within ${WEIGHT_RTOL} relative (worst ${e.ratio.toFixed(3)} of the tolerance)`);
  });
}

for (const [schedule, stages, optimizer] of cases) {
  deviceTest(`${schedule} on ${stages} stages of one device trains 50 rounds as on the CPU`, (t) => trainsAsOnCpu(t, { ...base(schedule, stages), ...(optimizer ? { optimizer } : {}) }, 50));
}

// AvgPipe's shared stages on one device: N = 2 pipelines on the S stages, each pipeline's work on
// a stream of its own, each stage's elastic averaging with the center in device memory.
const avgpipe = (stages: number): PipelineTrainerOptions => ({ ...base('avgpipe', stages), pipelines: 2, advance: stages - 1 });

deviceTest('avgpipe (shared stages, N = 2) on 2 stages of one device: a stream per stage and pipeline, none on the default stream in a round', (t) => onStreams(t, avgpipe(2), 2 * 2));

for (const stages of [2, 4]) {
  // trainer.weights() is each part's center: the model the pipelines agree on.
  deviceTest(`avgpipe (shared stages, N = 2) on ${stages} stages of one device trains 30 rounds as on the CPU: the centers and the round losses`, (t) => trainsAsOnCpu(t, avgpipe(stages), 30));
}

// Every other layer kind on the device, under a split backward (ZB-H1: the weight gradients of a
// convolution and a layer norm are computed with the input gradient and written in later).
deviceTest('a CNN (conv2d, max and average pooling, layer norm, GELU) under zb-h1 on 2 stages of one device trains as on the CPU', async (t) => {
  const image = { channels: 1, height: 4, width: 3 }; // the 12 features as a 1 x 4 x 3 image
  const layers = [
    { kind: 'conv2d', inChannels: 1, height: 4, width: 3, outChannels: 4, kernel: 3, padding: 1 },
    { kind: 'relu' },
    { kind: 'maxPool', channels: 4, height: 4, width: 3, kernel: 2, stride: 1 },
    { kind: 'layerNorm', features: 4 * 3 * 2 },
    { kind: 'gelu' },
    { kind: 'avgPool', channels: 4, height: 3, width: 2, kernel: 2, stride: 1 },
    { kind: 'linear', in: 4 * 2 * 1, out: classes },
  ] as const;
  t.equal(image.channels * image.height * image.width, features);
  await trainsAsOnCpu(t, { ...base('zb-h1', 2), model: { layers, seed: 4, boundaries: [3] }, optimizer: { kind: 'adam', lr: 0.01 } }, 50, 1);
});

for (const [what, options] of [
  ['a device trainer', { ...base('1f1b', 2), device: 'cuda:0' as const }],
  ["AvgPipe's shared stages on a device (every replica and each part's center)", { ...avgpipe(2), device: 'cuda:0' as const }],
] as const) {
  deviceTest(`${what} exports its state from the device and resumes from it exactly`, async (t) => {
    const whole = await train(options, 12);
    const first = await PipelineTrainer.create(options);
    let state;
    try {
      for (let r = 0; r < 6; r++) await first.trainRound();
      state = await first.exportState();
    } finally {
      await first.dispose();
    }
    const second = await PipelineTrainer.create(options);
    try {
      await second.importState(state);
      for (let r = 6; r < 12; r++) await second.trainRound();
      const weights = await second.weights();
      weights.forEach((w, part) => t.same(Array.from(w), Array.from(whole.weights[part]!), `part ${part}: resumed = uninterrupted`));
    } finally {
      await second.dispose();
    }
  });
}

deviceTest('what a device pipeline does not run yet is refused before any stage starts, typed', async (t) => {
  await t.rejects(PipelineTrainer.create({ ...base('gpipe', 2), pipelines: 2, device: 'cuda:0' }), InvalidArgumentError);
  await t.rejects(PipelineTrainer.create({ ...base('wavelet', 2), device: 'cuda:0' }), InvalidArgumentError);
  await t.rejects(PipelineTrainer.create({ ...avgpipe(2), averaging: { layout: 'worker-per-replica' }, device: 'cuda:0' }), InvalidArgumentError, "AvgPipe's worker-per-replica layout");
});

t.test('device auto picks cuda:0 where it is usable, else the CPU, and says why', async (t) => {
  const choice = chooseDevice('auto');
  t.equal(choice.device, gpu ? 'cuda:0' : 'cpu', choice.reason);
  t.ok(choice.reason.length > 5);
  t.throws(() => chooseDevice('tpu:0'), InvalidArgumentError);
  t.throws(() => chooseDevice(7), InvalidArgumentError);
  t.equal(chooseDevice('cpu').device, 'cpu');
  const trainer = await PipelineTrainer.create({ ...base('gpipe', 2), device: 'auto' });
  try {
    t.equal(trainer.device.device, choice.device, `auto ran on ${trainer.device.device}: ${trainer.device.reason}`);
    const report = await trainer.trainRound();
    t.ok(Number.isFinite(report.loss));
  } finally {
    await trainer.dispose();
  }
  await t.rejects(PipelineTrainer.create({ ...base('gpipe', 2), device: 'gpu' as never }), InvalidArgumentError);
});
