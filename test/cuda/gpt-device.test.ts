/**
 * A GPT in Sequential on a device (`cuda:0`: embedding, transformer blocks, per-position layer
 * norm and head, tokenCrossEntropy) against the same model on the CPU: logits, loss, every
 * parameter gradient (whole and split backward, a 2-part cut), and 20 AdamW steps with the
 * weights and optimizer state in a DeviceParamSet. On a GPU this checks the kernels under the GPT
 * layers; on the CUDA plugin over host memory (test/cuda/emulated.test.ts imports this file) it
 * checks that the layers run on the op table alone (no host access to a device tensor); with
 * neither, the test asserts why no device is usable instead of passing.
 */
import t from 'tap';

import { cudaStatus, DeviceBuffer, DeviceParamSet } from '../../dist/device/index.js';
import { BackendUnavailableError } from '../../dist/errors.js';
import { gptLayers, tokenCrossEntropy } from '../../dist/nn/gpt.js';
import { Sequential } from '../../dist/nn/sequential.js';
import { AdamW } from '../../dist/optim/index.js';
import { FlatBuffer } from '../../dist/tensor.js';
import { worstError } from '../helpers/random.js';

const gpu = cudaStatus().available;
const [vocab, context, batch] = [13, 6, 3];
const layers = gptLayers({ vocab, context, dim: 16, heads: 2, layers: 2 });
const tokens = Array.from({ length: batch * context }, (_, i) => (i * 5 + 2) % vocab);
const targets = Array.from({ length: batch * context }, (_, i) => (i * 3 + 1) % vocab);
const up = (values: ArrayLike<number>): DeviceBuffer => {
  const b = DeviceBuffer.allocate(values.length, { device: 'cuda:0' });
  b.copyFromHost(Float32Array.from(values));
  return b;
};

t.test('GPU: a GPT on the device equals the CPU path (logits, loss, gradients whole, split and cut; 20 AdamW steps)', async (t) => {
  if (!gpu) {
    t.throws(() => DeviceBuffer.allocate(1, { device: 'cuda:0' }), BackendUnavailableError, 'no usable device, and the error says so, typed');
    return;
  }
  const close = (got: Float32Array, want: Float32Array, what: string, atol = 1e-5, rtol = 1e-4): void => {
    const e = worstError(got, want, atol, rtol);
    t.ok(e.ratio <= 1, `${what}: worst ${e.ratio.toFixed(3)} of ${atol} + ${rtol} relative`);
  };
  const rows = batch * context;
  const host = new Sequential(layers, { seed: 4 });
  const hx = FlatBuffer.from(tokens);
  const ht = FlatBuffer.from(targets);
  const hd = FlatBuffer.allocate(rows * vocab);
  const hLogits = host.forward(0, hx, batch).array.slice(0, rows * vocab);
  const hLoss = tokenCrossEntropy(host.forward(1, hx, batch), ht, batch, context, vocab, hd);
  host.release(0);
  host.backward(1, hd, { grads: host.params.grads });

  const device = new Sequential<DeviceBuffer>(layers, { seed: 4, device: 'cuda:0' });
  const onDevice = DeviceParamSet.create(device.params, { device: 'cuda:0' });
  const [dx, dt, dd] = [up(tokens), up(targets), DeviceBuffer.allocate(rows * vocab, { device: 'cuda:0' })];
  const dLogits = device.forward(0, dx, batch, onDevice.weights);
  close(dLogits.copyToHost(new Float32Array(rows * vocab)), hLogits, 'logits');
  const dLoss = tokenCrossEntropy(dLogits, dt, batch, context, vocab, dd);
  t.ok(Math.abs(dLoss - hLoss) < 1e-5 * (1 + hLoss), `loss ${dLoss.toFixed(6)} (CPU ${hLoss.toFixed(6)})`);
  device.backward(0, dd, { grads: onDevice.grads, inputGrad: false });
  const whole = onDevice.grads.copyToHost().slice(0, device.params.length);
  close(whole, host.params.grads.array, 'every parameter gradient');
  // The split backward: the same gradients from weightGrad().
  device.forward(1, dx, batch, onDevice.weights);
  device.backward(1, dd, { grads: onDevice.grads, inputGrad: false, weightGrad: false });
  device.weightGrad(1, { grads: onDevice.grads });
  close(onDevice.grads.copyToHost().slice(0, device.params.length), whole, 'split backward');
  t.equal(device.liveSlots, 0);
  // A 2-part cut on the device: the same logits.
  const parts = [0, 1].map((k) => Sequential.part<DeviceBuffer>(layers, [2], k, { seed: 4, device: 'cuda:0' }));
  const sets = parts.map((p) => DeviceParamSet.create(p.params, { device: 'cuda:0' }));
  const h = parts[0]!.forward(0, dx, batch, sets[0]!.weights);
  close(parts[1]!.forward(0, h, batch, sets[1]!.weights).copyToHost(new Float32Array(rows * vocab)), hLogits, 'a 2-part cut: logits');
  parts.forEach((p) => p.release(0));
  sets.forEach((s) => s.dispose());
  parts.forEach((p) => p.dispose());
  onDevice.dispose();
  device.dispose();

  // 20 AdamW steps on each side from the same weights and batch.
  const trainHost = new Sequential(layers, { seed: 4 });
  const hostOpt = new AdamW(trainHost.params, { lr: 0.003, weightDecay: 0.01 });
  const trainDevice = new Sequential<DeviceBuffer>(layers, { seed: 4, device: 'cuda:0' });
  const state = DeviceParamSet.create(trainDevice.params, { device: 'cuda:0', optimizer: new AdamW(trainDevice.params, { lr: 0.003, weightDecay: 0.01 }) });
  const losses: Array<[number, number]> = [];
  for (let step = 0; step < 20; step++) {
    const a = tokenCrossEntropy(trainHost.forward(0, hx, batch, hostOpt.forwardWeights), ht, batch, context, vocab, hd);
    trainHost.backward(0, hd, { grads: trainHost.params.grads, inputGrad: false });
    hostOpt.stepSync();
    const b = tokenCrossEntropy(trainDevice.forward(0, dx, batch, state.forwardWeights), dt, batch, context, vocab, dd);
    trainDevice.backward(0, dd, { grads: state.grads, inputGrad: false });
    state.step();
    losses.push([a, b]);
  }
  t.ok(losses.at(-1)![0] < losses[0]![0], `the CPU loss falls: ${losses[0]![0].toFixed(3)} -> ${losses.at(-1)![0].toFixed(3)}`);
  t.ok(losses.every(([a, b]) => Math.abs(a - b) < 1e-4 * (1 + a)), `the device's losses are the CPU's (last ${losses.at(-1)![1].toFixed(5)} vs ${losses.at(-1)![0].toFixed(5)})`);
  close(state.weights.copyToHost().slice(0, trainHost.params.length), trainHost.params.weights.array, 'the weights after 20 steps', 1e-4, 1e-3);
  for (const b of [dx, dt, dd]) b.dispose();
  for (const b of [hx, ht, hd]) b.dispose();
  state.dispose();
  trainDevice.dispose();
  hostOpt.dispose();
  trainHost.dispose();
});
