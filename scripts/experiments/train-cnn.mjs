// Trains a small CNN on Fashion-MNIST on one worker (this thread, the CPU): sapipe's Sequential of
// conv2d / ReLU / max-pooling / linear layers (cnnLayers, by default conv(1->8, k3, p1) - ReLU -
// max-pool 2 - conv(8->16, k3, p1) - ReLU - max-pool 2 - linear(784 -> 10)), batches from a
// DataLoader over the file-backed fashionMnistSource, SGD with momentum. Each step is forward,
// softmax cross-entropy, backward and the optimizer's step. Prints per epoch the mean training
// loss, the test accuracy (all 10 000 test images) and the training throughput in samples/s (the
// steps only: data loading included, evaluation not).
//
//   node scripts/experiments/train-cnn.mjs [--epochs 2] [--batch 64] [--lr 0.05] [--momentum 0.9]
//     [--channels 8,16] [--train-samples N] [--seed 1] [--dir /usr/share/datasets/fashion-mnist] [--json]
//
// --train-samples N trains on the first N images of each epoch's shuffled order (shorter runs).
import { parseArgs } from 'node:util';

import { DataLoader, FlatBuffer, SGD, Sequential, cnnLayers, fashionMnistSource, layerParams, loadFashionMnist, softmaxCrossEntropy } from '../../dist/index.js';

const { values: a } = parseArgs({
  options: {
    epochs: { type: 'string', default: '2' },
    batch: { type: 'string', default: '64' },
    lr: { type: 'string', default: '0.05' },
    momentum: { type: 'string', default: '0.9' },
    channels: { type: 'string', default: '8,16' },
    'train-samples': { type: 'string' },
    seed: { type: 'string', default: '1' },
    dir: { type: 'string' },
    json: { type: 'boolean', default: false },
  },
});
const epochs = Number(a.epochs);
const batch = Number(a.batch);
const dirOption = a.dir === undefined ? {} : { dir: a.dir };
const layers = cnnLayers({ channels: 1, height: 28, width: 28 }, a.channels.split(',').map(Number), 10);
const model = new Sequential(layers, { seed: Number(a.seed) });
const optimizer = new SGD(model.params, { lr: Number(a.lr), momentum: Number(a.momentum) });
const loader = new DataLoader(fashionMnistSource({ ...dirOption, split: 'train' }), { batchSize: batch, seed: Number(a.seed) });
const stepsPerEpoch = Math.min(loader.batchesPerEpoch, a['train-samples'] === undefined ? Infinity : Math.floor(Number(a['train-samples']) / batch));
const test = loadFashionMnist({ ...dirOption, split: 'test' });

const input = FlatBuffer.allocate(batch * model.inputSize);
const gradLogits = FlatBuffer.allocate(batch * 10);

function accuracy() {
  const chunk = 500;
  const x = FlatBuffer.allocate(chunk * model.inputSize);
  let correct = 0;
  for (let start = 0; start < test.count; start += chunk) {
    const n = Math.min(chunk, test.count - start);
    x.array.set(test.inputs.subarray(start * model.inputSize, (start + n) * model.inputSize));
    const logits = model.forward(0, x, n, optimizer.forwardWeights).array;
    for (let r = 0; r < n; r++) {
      let best = 0;
      for (let c = 1; c < 10; c++) if (logits[r * 10 + c] > logits[r * 10 + best]) best = c;
      if (best === test.labels[start + r]) correct++;
    }
    model.release(0);
  }
  x.dispose();
  return correct / test.count;
}

const params = layerParams(layers).reduce((x, y) => x + y, 0);
if (!a.json) {
  console.log(`layers: ${layers.map((l) => l.kind).join(' - ')}; ${params} parameters; batch ${batch}, SGD lr ${a.lr} momentum ${a.momentum}`);
  console.log(`epoch of ${stepsPerEpoch} steps (${stepsPerEpoch * batch} samples); test accuracy before training ${(100 * accuracy()).toFixed(2)}%`);
}
const results = [];
for (let epoch = 0; epoch < epochs; epoch++) {
  let lossSum = 0;
  let steps = 0;
  const start = performance.now();
  for (const b of loader.epoch(epoch)) {
    if (steps === stepsPerEpoch) break;
    input.array.set(b.inputs);
    const logits = model.forward(0, input, batch, optimizer.forwardWeights);
    lossSum += softmaxCrossEntropy(logits.array.subarray(0, batch * 10), b.targets, batch, 10, gradLogits.array);
    model.backward(0, gradLogits, { grads: model.params.grads, inputGrad: false });
    optimizer.stepSync();
    steps++;
  }
  const seconds = (performance.now() - start) / 1000;
  const row = { epoch: epoch + 1, loss: lossSum / steps, testAccuracy: accuracy(), samplesPerSecond: (steps * batch) / seconds, seconds };
  results.push(row);
  if (!a.json)
    console.log(`epoch ${row.epoch}: train loss ${row.loss.toFixed(4)}, test accuracy ${(100 * row.testAccuracy).toFixed(2)}%, ${row.samplesPerSecond.toFixed(0)} samples/s (${seconds.toFixed(1)} s)`);
}
if (a.json) console.log(JSON.stringify({ layers, batch, lr: Number(a.lr), momentum: Number(a.momentum), stepsPerEpoch, results }));
input.dispose();
gradLogits.dispose();
optimizer.dispose?.();
model.dispose();
