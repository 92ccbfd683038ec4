// A complete training loop on sapipe's optimizer: least-squares regression y = X w* + noise,
// trained with Adam fused with delay compensation and SAPipe weight prediction.
// Run: node examples/linear-regression.mjs   (after npm install)
import { Adam, ParamSet } from '../dist/index.js';

const features = 64;
const samples = 512;
const batch = 32;

// A deterministic data set.
let seed = 42;
const random = () => ((seed = (Math.imul(seed, 1664525) + 1013904223) >>> 0) / 4294967296) * 2 - 1;
const trueWeights = Float32Array.from({ length: features }, random);
const X = Float32Array.from({ length: samples * features }, random);
const Y = new Float32Array(samples);
for (let s = 0; s < samples; s++) {
  let y = 0.5; // true bias
  for (let f = 0; f < features; f++) y += X[s * features + f] * trueWeights[f];
  Y[s] = y + 0.01 * random();
}

const params = new ParamSet({ weight: [features], bias: [1] });
const optimizer = new Adam(params, {
  lr: 0.05,
  gradScale: 1 / batch, // the gradient below is a sum over the batch: average it on read
  compensation: { lambda: 0.2 },
  prediction: { kind: 'sapipe', estimate: 'prev-sync' },
});
const weight = params.get('weight');
const bias = params.get('bias');

function loss(w, b) {
  let total = 0;
  for (let s = 0; s < samples; s++) {
    let e = b[0] - Y[s];
    for (let f = 0; f < features; f++) e += X[s * features + f] * w[f];
    total += e * e;
  }
  return total / samples;
}

for (let epoch = 0; epoch < 20; epoch++) {
  for (let start = 0; start < samples; start += batch) {
    // The forward and backward passes read the predicted weights.
    const w = optimizer.forwardView('weight');
    const b = optimizer.forwardView('bias');
    params.zeroGrad();
    for (let s = start; s < start + batch; s++) {
      let e = b[0] - Y[s];
      for (let f = 0; f < features; f++) e += X[s * features + f] * w[f];
      for (let f = 0; f < features; f++) weight.grad[f] += 2 * e * X[s * features + f];
      bias.grad[0] += 2 * e;
    }
    await optimizer.step(); // one native call: update + compensation + prediction + NaN guard
  }
  if (epoch % 5 === 4 || epoch === 0) console.log(`epoch ${epoch + 1}: loss ${loss(weight.data, bias.data).toExponential(3)}`);
}
optimizer.dispose();
params.dispose();
