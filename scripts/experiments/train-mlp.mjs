// Trains sapipe's MLP on the exported MNIST split (export-mnist.mjs) on one device, and times its
// training steps: the same loop on `cpu` or `cuda:N` (lib/nn's MLP over the model-operation table;
// on a device the weights, gradients and optimizer state live in a DeviceParamSet and the step is
// the fused update there). torch-train-mlp.py runs the same model, batch and optimizer in PyTorch.
//
//   node scripts/experiments/train-mlp.mjs --data DIR [--device cuda:0] [--sizes 784,128,10]
//     [--batch 256] [--epochs 8] [--lr 0.05] [--momentum 0.9] [--update plain|dc|wp|dc+wp]
//     [--steps 300] [--repeats 3] [--breakdown] [--json]
// Prints the test accuracy after the epochs, then the throughput of `steps` steps (after 20 warm-up
// steps) in samples/s, `repeats` times: every batch is on the device before the clock starts and
// the loss is read back once every 50 steps, as a training loop that logs would. --breakdown also
// times `steps` steps phase by phase, waiting for the device between phases: the JavaScript time
// to enqueue forward, loss and backward, the device's time to finish them, and the step (the
// fused update, run to completion); medians in microseconds.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { gunzipSync } from 'node:zlib';

import { DeviceParamSet } from '../../dist/device/index.js';
import { MLP } from '../../dist/nn/mlp.js';
import { modelDevice } from '../../dist/nn/ops.js';
import { SGD } from '../../dist/optim/index.js';

const { values: a } = parseArgs({
  options: {
    data: { type: 'string' },
    device: { type: 'string', default: 'cpu' },
    sizes: { type: 'string', default: '784,128,10' },
    batch: { type: 'string', default: '256' },
    epochs: { type: 'string', default: '8' },
    lr: { type: 'string', default: '0.05' },
    momentum: { type: 'string', default: '0.9' },
    update: { type: 'string', default: 'plain' },
    steps: { type: 'string', default: '300' },
    repeats: { type: 'string', default: '3' },
    json: { type: 'boolean', default: false },
    breakdown: { type: 'boolean', default: false },
  },
});
if (!a.data) throw new Error('--data DIR (written by export-mnist.mjs) is required');
const sizes = a.sizes.split(',').map(Number);
const batch = Number(a.batch);
const read = (name) => {
  const x = gunzipSync(readFileSync(join(a.data, `${name}-x.f32.gz`)));
  return { x: new Float32Array(x.buffer, x.byteOffset, x.byteLength / 4), y: new Uint8Array(readFileSync(join(a.data, `${name}-y.u8`))) };
};
const train = read('train');
const test = read('test');
const updates = {
  plain: {},
  dc: { compensation: {} },
  wp: { prediction: { kind: 'sapipe', estimate: 'prev-sync' } },
  'dc+wp': { compensation: {}, prediction: { kind: 'sapipe', estimate: 'prev-sync', compensate: true } },
};
if (!(a.update in updates)) throw new Error(`--update must be one of ${Object.keys(updates).join(', ')}`);

const memory = modelDevice(a.device);
const model = new MLP(sizes, { seed: 1, device: a.device });
const optimizer = new SGD(model.params, { lr: Number(a.lr), momentum: Number(a.momentum), ...updates[a.update] });
const onDevice = a.device === 'cpu' ? undefined : DeviceParamSet.create(model.params, { device: a.device, optimizer });
const weights = () => (onDevice ? onDevice.forwardWeights : optimizer.forwardWeights);
const grads = onDevice ? onDevice.grads : model.params.grads;
const step = () => (onDevice ? onDevice.step() : optimizer.stepSync());

// Every batch of the training set in the model's memory: inputs and labels (as floats).
const f = sizes[0];
const batches = [];
for (let start = 0; start + batch <= train.y.length; start += batch) {
  const x = memory.allocate(batch * f);
  memory.write(x, train.x.subarray(start * f, (start + batch) * f));
  const y = memory.allocate(batch);
  memory.write(y, Float32Array.from(train.y.subarray(start, start + batch)));
  batches.push({ x, y });
}
const trainStep = (b, readLoss) => {
  model.forwardLogits(b.x, batch, weights());
  const loss = model.loss(b.y, { read: readLoss });
  model.backward(grads);
  step();
  return loss;
};

const epochs = Number(a.epochs);
let lastLoss = NaN;
const t0 = performance.now();
for (let e = 0; e < epochs; e++) for (let i = 0; i < batches.length; i++) lastLoss = trainStep(batches[i], i === batches.length - 1) || lastLoss;
const trainSeconds = (performance.now() - t0) / 1000;
const accuracy = model.accuracy(test.x, Array.from(test.y), weights());

const steps = Number(a.steps);
const throughput = [];
for (let r = 0; r < Number(a.repeats); r++) {
  for (let i = 0; i < 20; i++) trainStep(batches[i % batches.length], i === 19);
  const start = performance.now();
  for (let i = 0; i < steps; i++) trainStep(batches[i % batches.length], i % 50 === 49 || i === steps - 1);
  throughput.push((steps * batch) / ((performance.now() - start) / 1000));
}
let breakdown;
if (a.breakdown) {
  const probe = new Float32Array(1);
  const wait = () => (onDevice ? onDevice.grads.copyToHost(probe) : undefined);
  const phases = { enqueueUs: [], deviceUs: [], stepUs: [] };
  for (let i = 0; i < steps; i++) {
    const b = batches[i % batches.length];
    wait();
    const t0 = performance.now();
    model.forwardLogits(b.x, batch, weights());
    model.loss(b.y, { read: false });
    model.backward(grads);
    const t1 = performance.now();
    wait();
    const t2 = performance.now();
    step();
    const t3 = performance.now();
    phases.enqueueUs.push((t1 - t0) * 1000);
    phases.deviceUs.push((t2 - t1) * 1000);
    phases.stepUs.push((t3 - t2) * 1000);
  }
  const median = (v) => v.sort((x, y) => x - y)[v.length >> 1];
  breakdown = Object.fromEntries(Object.entries(phases).map(([k, v]) => [k, Number(median(v).toFixed(1))]));
}
const result = { device: a.device, sizes, batch, update: a.update, epochs, trainSeconds, finalLoss: lastLoss, testAccuracy: accuracy, samplesPerSecond: throughput, ...(breakdown ? { breakdown } : {}) };
if (a.json) console.log(JSON.stringify(result));
else
  console.log(
    `sapipe ${a.device} MLP ${sizes.join('-')} batch ${batch} SGD-momentum ${a.update}: test accuracy ${(accuracy * 100).toFixed(2)}% after ${epochs} epochs ` +
      `(${trainSeconds.toFixed(2)} s), ${throughput.map((v) => v.toFixed(0)).join(' / ')} samples/s` +
      (breakdown ? `; per step (median us): enqueue ${breakdown.enqueueUs}, device ${breakdown.deviceUs}, step ${breakdown.stepUs}` : ''),
  );
