// A complete training loop on sapipe's optimizer: least-squares regression y = X w* + noise,
// trained with Adam. Every gradient here is applied to the weights it was computed at, so there is
// nothing for delay compensation or weight prediction to correct: those belong to loops whose
// gradients are stale, such as DataParallelTrainer's staleness-1 modes (README, "A training loop").
// Run: node examples/linear-regression.mjs   (after npm install)
import { Adam, ParamSet } from '../dist/index.js';
import { regressionData } from './regression-data.mjs';

const features = 64;
const samples = 512;
const batch = 32;
const { addGradient, loss } = regressionData({ features, samples });

const params = new ParamSet({ weight: [features], bias: [1] });
const optimizer = new Adam(params, {
  lr: 0.05,
  gradScale: 1 / batch, // the gradient below is a sum over the batch: average it on read
});
const weight = params.get('weight');
const bias = params.get('bias');

for (let epoch = 0; epoch < 20; epoch++) {
  for (let start = 0; start < samples; start += batch) {
    // The weights the forward and backward passes read (the predicted ones when prediction is on).
    const w = optimizer.forwardView('weight');
    const b = optimizer.forwardView('bias');
    params.zeroGrad();
    for (let s = start; s < start + batch; s++) addGradient(s, w, b, weight.grad, bias.grad);
    await optimizer.step(); // one native call: the update and the NaN guard
  }
  if (epoch % 5 === 4 || epoch === 0) console.log(`epoch ${epoch + 1}: loss ${loss(weight.data, bias.data).toExponential(3)}`);
}
optimizer.dispose();
params.dispose();
