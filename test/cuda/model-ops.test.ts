/**
 * The CUDA table of model operations against the CPU table, and an MLP trained on a device against
 * the same MLP trained on the CPU. On a GPU this checks the plugin's kernels and cuBLAS; on the
 * CUDA plugin over host memory (test/cuda/emulated.test.ts imports this file) it checks the
 * bindings, the dispatch on device buffers and the device training loop; with neither, every test
 * asserts why no device is usable instead of passing.
 */
import t, { type Test } from 'tap';

import { cudaStatus, DeviceBuffer, DeviceParamSet, probeCublas } from '../../dist/device/index.js';
import type { SapipeError } from '../../dist/errors.js';
import { MLP } from '../../dist/nn/mlp.js';
import { biasAdd } from '../../dist/nn/ops.js';
import { Adam, SGD } from '../../dist/optim/index.js';
import { FlatBuffer } from '../../dist/tensor.js';
import { runLayerOps } from '../helpers/layer-ops.js';
import { gemmCases, runOps, softmaxCases } from '../helpers/model-ops.js';
import { assertNoUsableDevice } from '../helpers/nccl-trainer.js';
import { fillUniform, rng, worstError } from '../helpers/random.js';

const gpu = cudaStatus().available;

function deviceTest(name: string, fn: (t: Test) => Promise<void>): void {
  t.test(`GPU: ${name}`, async (t) => {
    if (!gpu) {
      assertNoUsableDevice(t);
      return;
    }
    await fn(t);
  });
}

deviceTest('cuBLAS is found, and sapipe info reports its version and file', async (t) => {
  const status = probeCublas();
  t.equal(status.available, true, `cublas: ${JSON.stringify(status)}`);
  t.ok(String(status.details?.library ?? '').length > 0, `from ${String(status.details?.library)}`);
});

t.test('without a usable device cuBLAS is reported unavailable with the reason', async (t) => {
  if (gpu) return;
  const status = probeCublas();
  t.equal(status.available, false);
  t.ok((status.reason ?? '').length > 20, status.reason ?? '');
});

// cuBLAS and the kernels contract multiply-adds into FMAs and sum in another order than the CPU:
// a few ulps per product, relative to the magnitude of its terms.
deviceTest('every model operation on the device equals the CPU table (1e-5 relative)', async (t) => {
  const cpu = runOps('cpu');
  const dev = runOps('cuda:0');
  gemmCases.forEach((g, i) => {
    const e = worstError(dev.gemm[i]!, cpu.gemm[i]!, 1e-5, 1e-5);
    t.ok(e.ratio <= 1, `gemm ${JSON.stringify(g)}: worst ${e.ratio.toFixed(3)} of tolerance`);
  });
  t.ok(worstError(dev.biasAdd, cpu.biasAdd, 0, 1e-6).ratio <= 1, 'bias add');
  t.ok(worstError(dev.biasGrad, cpu.biasGrad, 1e-6, 1e-5).ratio <= 1, 'bias gradient');
  t.ok(worstError(dev.biasGradAccumulated, cpu.biasGradAccumulated, 1e-6, 1e-5).ratio <= 1, 'bias gradient, accumulated');
  t.same(Array.from(dev.relu), Array.from(cpu.relu), 'relu exactly (NaN -> 0)');
  t.same(Array.from(dev.reluInPlace), Array.from(cpu.reluInPlace), 'relu in place exactly');
  t.same(Array.from(dev.reluGrad), Array.from(cpu.reluGrad), 'relu gradient exactly');
  softmaxCases.forEach(({ rows, classes }, i) => {
    const [d, c] = [dev.softmax[i]!, cpu.softmax[i]!];
    const finite = (a: Float32Array) => a.filter((_, r) => r !== 2);
    t.ok(worstError(finite(d.losses), finite(c.losses), 1e-6, 1e-5).ratio <= 1, `softmax ${rows}x${classes}: losses`);
    t.ok(Number.isNaN(d.losses[2]!), `softmax ${rows}x${classes}: a label that is no class gives NaN`);
    t.ok(worstError(d.dlogits, c.dlogits, 1e-7, 1e-5).ratio <= 1, `softmax ${rows}x${classes}: gradient`);
    t.ok(worstError(d.inPlace, c.inPlace, 1e-7, 1e-5).ratio <= 1, `softmax ${rows}x${classes}: gradient over the logits`);
    t.same(Array.from(d.correct), Array.from(c.correct), `softmax ${rows}x${classes}: hits`);
  });
});

// The layer operations: element maths in float on both sides (tanhf, the same dropout mask from
// integer maths), row sums in another order on a device (a warp per row), parameter gradients
// summed in the CPU's row order.
deviceTest('every layer operation on the device equals the CPU table (GELU, add, layer norm, embedding, dropout, attention, conv2d, pooling)', async (t) => {
  const cpu = runLayerOps('cpu');
  const dev = runLayerOps('cuda:0');
  const text = (a: Float32Array) => Array.from(a, String);
  const finite = (a: Float32Array, like: Float32Array) => a.filter((_, i) => Number.isFinite(like[i]!));
  const near = (d: Float32Array, c: Float32Array, atol: number, rtol: number, what: string) => {
    t.same(text(d).map((v, i) => (Number.isFinite(c[i]!) ? '' : v)), text(c).map((v, i) => (Number.isFinite(c[i]!) ? '' : v)), `${what}: NaN and infinities alike`);
    const e = worstError(finite(d, c), finite(c, c), atol, rtol);
    t.ok(e.ratio <= 1, `${what}: worst ${e.ratio.toFixed(3)} of ${atol} + ${rtol} relative`);
  };
  near(dev.gelu, cpu.gelu, 1e-7, 1e-6, 'gelu');
  near(dev.geluInPlace, cpu.geluInPlace, 1e-7, 1e-6, 'gelu in place');
  near(dev.geluGrad, cpu.geluGrad, 1e-6, 1e-6, 'gelu gradient');
  t.same(text(dev.add), text(cpu.add), 'add exactly');
  t.same(text(dev.addInPlace), text(cpu.addInPlace), 'add in place exactly');
  near(dev.layerNorm.y, cpu.layerNorm.y, 1e-5, 1e-5, 'layer norm');
  near(dev.layerNorm.mean, cpu.layerNorm.mean, 1e-6, 1e-6, 'layer norm mean');
  near(dev.layerNorm.rstd, cpu.layerNorm.rstd, 1e-6, 1e-5, 'layer norm rstd');
  near(dev.layerNorm.inPlace, cpu.layerNorm.inPlace, 1e-5, 1e-5, 'layer norm in place');
  for (const key of ['dx', 'dgamma', 'dbeta', 'dgammaAccumulated', 'dbetaAccumulated', 'dxInPlace'] as const)
    near(dev.layerNormGrad[key], cpu.layerNormGrad[key], 1e-5, 1e-5, `layer norm gradient ${key}`);
  t.same(text(dev.embedding), text(cpu.embedding), 'embedding exactly (NaN rows alike)');
  for (const key of ['dtoken', 'dposition', 'dtokenAccumulated', 'dpositionAccumulated'] as const)
    t.same(text(dev.embeddingGrad[key]), text(cpu.embeddingGrad[key]), `embedding gradient ${key} exactly (summed in the same order)`);
  t.same(text(dev.dropout), text(cpu.dropout), 'dropout exactly (the same mask)');
  t.same(text(dev.dropoutInPlace), text(cpu.dropoutInPlace), 'dropout in place exactly');
  t.same(text(dev.dropoutShifted), text(cpu.dropoutShifted), 'dropout from an offset exactly');
  // Attention: float dot products and an online softmax on a device, double accumulators on the CPU.
  dev.attention.forEach((d, i) => {
    const c = cpu.attention[i]!;
    for (const key of ['o', 'lse', 'dq', 'dk', 'dv'] as const) near(d[key], c[key], 1e-5, 1e-4, `attention case ${i}: ${key}`);
  });
  // Pooling: the same window maths and the same gradient sums in the same order on both sides.
  dev.pool.forEach((d, i) => {
    const c = cpu.pool[i]!;
    for (const key of ['max', 'avg', 'maxGrad', 'avgGrad'] as const) t.same(text(d[key]), text(c[key]), `pool2d case ${i}: ${key} exactly`);
  });
  // Convolution: a direct kernel on a device against im2col and the SGEMM on the CPU.
  dev.conv.forEach((d, i) => {
    const c = cpu.conv[i]!;
    for (const key of ['y', 'yNoBias', 'dx', 'dw', 'db', 'dwAccumulated', 'dbAccumulated'] as const) near(d[key], c[key], 1e-5, 1e-5, `conv2d case ${i}: ${key}`);
  });
});

deviceTest('host and device operands in one operation: ERR_INVALID_ARGUMENT naming both, nothing run', async (t) => {
  const y = DeviceBuffer.allocate(12, { device: 'cuda:0' });
  const bias = FlatBuffer.allocate(4);
  bias.array.fill(1);
  try {
    biasAdd({ buffer: y }, { buffer: bias }, 3, 4);
    t.fail('mixed memory ran');
  } catch (error) {
    t.equal((error as SapipeError).code, 'ERR_INVALID_ARGUMENT');
    t.match(String(error), /host memory.*cuda:0|cuda:0.*host memory/, String(error));
  }
  t.same(Array.from(y.copyToHost()), new Array(12).fill(0), 'the device buffer is untouched');
  y.dispose();
  bias.dispose();
});

// The MLP on a device, its weights, gradients and optimizer state in a DeviceParamSet, against the
// same MLP and optimizer on the CPU, from the same initial weights and batches.
deviceTest('an MLP trained 50 steps on the device equals the CPU path (SGD with momentum, Adam)', async (t) => {
  const sizes = [37, 29, 23, 11];
  const batch = 19;
  const next = rng(7);
  const batches = Array.from({ length: 5 }, () => ({
    x: fillUniform(new Float32Array(batch * sizes[0]!), next),
    labels: Array.from({ length: batch }, () => Math.floor(next() * sizes[3]!)),
  }));
  for (const [name, make] of [
    ['sgd momentum 0.9', (p: MLP['params']) => new SGD(p, { lr: 0.05, momentum: 0.9 })],
    ['adam', (p: MLP['params']) => new Adam(p, { lr: 0.003 })],
  ] as const) {
    const host = new MLP(sizes, { seed: 3 });
    const hostOpt = make(host.params);
    const device = new MLP(sizes, { seed: 3, device: 'cuda:0' });
    const deviceOpt = make(device.params);
    const onDevice = DeviceParamSet.create(device.params, { device: 'cuda:0', optimizer: deviceOpt });
    let worstW = 0;
    let worstLoss = 0;
    for (let step = 0; step < 50; step++) {
      const { x, labels } = batches[step % batches.length]!;
      host.forward(x, batch, hostOpt.forwardWeights);
      const hostLoss = host.loss(labels);
      host.backward();
      hostOpt.stepSync();
      device.forwardLogits(x, batch, onDevice.forwardWeights);
      const deviceLoss = device.loss(labels, { read: step % 10 === 9 });
      device.backward(onDevice.grads);
      onDevice.step();
      if (step % 10 === 9) {
        worstLoss = Math.max(worstLoss, Math.abs(deviceLoss - hostLoss) / (1e-6 + 1e-4 * Math.abs(hostLoss)));
        const w = onDevice.weights.copyToHost().subarray(0, host.params.length);
        worstW = Math.max(worstW, worstError(w, host.params.weights.array, 1e-5, 1e-4).ratio);
      }
    }
    t.ok(worstLoss <= 1, `${name}: the losses agree (worst ${worstLoss.toFixed(3)} of 1e-4 relative)`);
    t.ok(worstW <= 1, `${name}: the weights agree at every 10th step (worst ${worstW.toFixed(3)} of 1e-4 relative + 1e-5)`);
    const { x, labels } = batches[0]!;
    t.equal(device.accuracy(x, labels, onDevice.forwardWeights), host.accuracy(x, labels, hostOpt.forwardWeights), `${name}: the same accuracy`);
    onDevice.dispose();
    device.dispose();
    host.dispose();
  }
});

deviceTest('an MLP on a device refuses host weights and gradients with a message that says what to pass', async (t) => {
  const model = new MLP([5, 3], { device: 'cuda:0' });
  const refused = (fn: () => void): string => {
    try {
      fn();
    } catch (error) {
      return `${(error as SapipeError).code}: ${(error as Error).message}`;
    }
    return 'ran';
  };
  t.match(refused(() => model.forward(new Float32Array(5), 1)), /ERR_INVALID_ARGUMENT: .*runs on cuda:0.*DeviceParamSet/);
  t.match(refused(() => model.forward(new Float32Array(5), 1, model.params.weights)), /ERR_INVALID_ARGUMENT: .*DeviceBuffer on cuda:0/);
  model.dispose();
});
