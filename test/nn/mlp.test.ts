/**
 * The MLP: gradients against central finite differences of a double-precision reference loss,
 * forward/backward with another weight buffer, training to a stated accuracy on a separable
 * problem, determinism of the seeded initialisation, and argument checks.
 */
import t from 'tap';

import { MLP } from '../../dist/nn/mlp.js';
import { softmaxCrossEntropy } from '../../dist/nn/softmax-cross-entropy.js';
import { FlatBuffer } from '../../dist/tensor.js';
import { fillNormal, rng } from '../helpers/random.js';
import { referenceLoss } from './mlp-reference.js';

function offsetsOf(model: MLP): Array<{ weight: number; bias: number }> {
  return model.layers.map((l) => ({ weight: l.weight.offset, bias: l.bias.offset }));
}

t.test('gradients match finite differences of a double-precision reference', (t) => {
  const sizes = [5, 7, 6, 3];
  const model = new MLP(sizes, { seed: 3 });
  const batch = 4;
  const next = rng(11);
  const x = fillNormal(new Float32Array(batch * sizes[0]!), next);
  const labels = [0, 2, 1, 2];
  const logits = model.forward(x, batch);
  const loss = model.loss(labels);
  model.backward();
  const w = Float64Array.from(model.params.weights.array);
  const offsets = offsetsOf(model);
  t.ok(Math.abs(loss - referenceLoss(sizes, offsets, w, x, labels)) < 1e-5, 'the loss matches the reference');
  t.equal(logits.length, batch * 3);
  // Tolerance: |analytic - numeric| <= 2e-5 + 1e-3 |numeric|. The analytic gradient is computed in
  // fp32 (relative error ~1e-6 here), the central difference with h = 1e-5 in double has error
  // ~h^2 |f'''| plus ~1e-11 / h cancellation, both far below the bound; a wrong transpose, a
  // missing ReLU mask or a missing 1/batch breaks it by orders of magnitude.
  const h = 1e-5;
  let worst = 0;
  const grads = model.params.grads.array;
  for (const layout of model.params.tensors.map((tensor) => tensor.layout))
    for (let i = layout.offset; i < layout.offset + layout.size; i++) {
      const saved = w[i]!;
      w[i] = saved + h;
      const up = referenceLoss(sizes, offsets, w, x, labels);
      w[i] = saved - h;
      const down = referenceLoss(sizes, offsets, w, x, labels);
      w[i] = saved;
      const numeric = (up - down) / (2 * h);
      worst = Math.max(worst, Math.abs(grads[i]! - numeric) / (2e-5 + 1e-3 * Math.abs(numeric)));
    }
  t.ok(worst <= 1, `worst gradient error ratio ${worst.toExponential(2)} (<= 1)`);
  // Padding between tensors stays zero.
  for (let i = 0; i < model.params.length; i++)
    if (!model.params.tensors.some((tensor) => i >= tensor.layout.offset && i < tensor.layout.offset + tensor.layout.size)) t.equal(grads[i], 0);
  model.dispose();
  t.end();
});

t.test('forward reads the given weights; backward writes the given gradient buffer', (t) => {
  const a = new MLP([6, 8, 4], { seed: 1 });
  const b = new MLP([6, 8, 4], { seed: 2 });
  const x = fillNormal(new Float32Array(3 * 6), rng(5));
  const labels = [1, 3, 0];
  const own = Float32Array.from(b.forward(x, 3));
  b.loss(labels);
  b.backward();
  const ownGrads = Float32Array.from(b.params.grads.array);
  // Model a with b's weights as its "predicted" weights behaves like b.
  const predicted = FlatBuffer.from(b.params.weights.array);
  const grads = FlatBuffer.allocate(a.params.length);
  t.same([...a.forward(x, 3, predicted)], [...own], 'logits from the given weights');
  a.loss(labels);
  a.params.grads.array.fill(7);
  a.backward(grads);
  t.same([...grads.array], [...ownGrads], 'gradients with respect to the given weights');
  t.ok(a.params.grads.array.every((v) => v === 7), 'the ParamSet gradients are untouched');
  t.notSame([...a.forward(x, 3)], [...own], 'without the argument, the model reads its own weights');
  a.dispose();
  b.dispose();
  t.end();
});

t.test('seeded initialisation is deterministic and Kaiming-scaled', (t) => {
  const a = new MLP([784, 128, 10], { seed: 9 });
  const b = new MLP([784, 128, 10], { seed: 9 });
  const c = new MLP([784, 128, 10], { seed: 10 });
  t.same([...a.params.weights.array.subarray(0, 64)], [...b.params.weights.array.subarray(0, 64)]);
  t.notSame([...a.params.weights.array.subarray(0, 64)], [...c.params.weights.array.subarray(0, 64)]);
  const w = a.params.get('layer0.weight').data;
  const bound = Math.sqrt(6 / 784);
  let sq = 0;
  for (const v of w) {
    if (Math.abs(v) > bound) t.fail(`weight ${v} outside +-${bound}`);
    sq += v * v;
  }
  // U(-b, b) has variance b^2 / 3 = 2 / fanIn.
  t.ok(Math.abs(sq / w.length / (2 / 784) - 1) < 0.05, 'variance 2 / fanIn');
  for (const m of [a, b, c]) m.dispose();
  t.end();
});

t.test('trains to >= 95% test accuracy on a separable problem', (t) => {
  // 4 classes in 10 dimensions, labelled by the argmax of a fixed random linear map: separable by
  // construction, but not by any single input coordinate.
  const dims = 10;
  const classes = 4;
  const next = rng(21);
  const teacher = fillNormal(new Float32Array(classes * dims), next);
  const make = (n: number): { x: Float32Array; y: number[] } => {
    const x = fillNormal(new Float32Array(n * dims), next);
    const y: number[] = [];
    for (let r = 0; r < n; r++) {
      let best = 0;
      let bestScore = -Infinity;
      for (let c = 0; c < classes; c++) {
        let s = 0;
        for (let d = 0; d < dims; d++) s += teacher[c * dims + d]! * x[r * dims + d]!;
        if (s > bestScore) [best, bestScore] = [c, s];
      }
      y.push(best);
    }
    return { x, y };
  };
  const train = make(2048);
  const test = make(512);
  const model = new MLP([dims, 32, classes], { seed: 4 });
  const before = model.accuracy(test.x, test.y);
  const batch = 64;
  const lr = 0.1;
  const w = model.params.weights.array;
  const g = model.params.grads.array;
  let firstLoss = 0;
  let lastLoss = 0;
  for (let epoch = 0; epoch < 40; epoch++)
    for (let start = 0; start < train.y.length; start += batch) {
      model.forward(train.x.subarray(start * dims, (start + batch) * dims), batch);
      const loss = model.loss(train.y.slice(start, start + batch));
      if (epoch === 0 && start === 0) firstLoss = loss;
      lastLoss = loss;
      model.backward();
      for (let i = 0; i < w.length; i++) w[i]! -= lr * g[i]!;
    }
  const after = model.accuracy(test.x, test.y);
  t.ok(after >= 0.95, `test accuracy ${after.toFixed(3)} (was ${before.toFixed(3)} before training)`);
  t.ok(lastLoss < firstLoss / 4, `loss fell from ${firstLoss.toFixed(3)} to ${lastLoss.toFixed(3)}`);
  model.dispose();
  t.end();
});

t.test('softmax cross-entropy: hand-computed values and stability', (t) => {
  const d = new Float32Array(4);
  const loss = softmaxCrossEntropy(new Float32Array([0, 0, 1000, 0]), [1, 0], 2, 2, d);
  // Row 0: log 2. Row 1: logits (1000, 0), label 0: log(1 + e^-1000) ~ 0.
  t.ok(Math.abs(loss - Math.log(2) / 2) < 1e-6);
  t.ok(Math.abs(d[0]! - 0.25) < 1e-7 && Math.abs(d[1]! + 0.25) < 1e-7 && Math.abs(d[2]!) < 1e-7 && Math.abs(d[3]!) < 1e-7);
  t.throws(() => softmaxCrossEntropy(new Float32Array(4), [0, 2], 2, 2), { code: 'ERR_INVALID_ARGUMENT' });
  t.throws(() => softmaxCrossEntropy(new Float32Array(4), [0], 2, 2), { code: 'ERR_SIZE_MISMATCH' });
  t.throws(() => softmaxCrossEntropy(new Float32Array(3), [0, 1], 2, 2), { code: 'ERR_SIZE_MISMATCH' });
  t.end();
});

t.test('argument checks', (t) => {
  t.throws(() => new MLP([5]), { code: 'ERR_INVALID_ARGUMENT' });
  t.throws(() => new MLP([5, 0, 2]), { code: 'ERR_INVALID_ARGUMENT' });
  t.throws(() => new MLP([5, 2], { seed: 0.5 }), { code: 'ERR_INVALID_ARGUMENT' });
  const model = new MLP([4, 3, 2]);
  const x = new Float32Array(8);
  t.throws(() => model.forward(x, 3), { code: 'ERR_SIZE_MISMATCH' }, 'x too short for the batch');
  t.throws(() => model.forward(x, 0), { code: 'ERR_INVALID_ARGUMENT' });
  t.throws(() => model.forward(x, 2, FlatBuffer.allocate(5)), { code: 'ERR_SIZE_MISMATCH' }, 'weights without the layout');
  t.throws(() => model.forward([1, 2] as unknown as Float32Array, 1), { code: 'ERR_INVALID_ARGUMENT' });
  t.throws(() => model.loss([0, 1]), { code: 'ERR_INVALID_ARGUMENT' }, 'loss before forward');
  model.forward(x, 2);
  t.throws(() => model.backward(), { code: 'ERR_INVALID_ARGUMENT' }, 'backward before loss');
  t.throws(() => model.loss([0, 2]), { code: 'ERR_INVALID_ARGUMENT' }, 'label out of range');
  t.throws(() => model.loss([0]), { code: 'ERR_SIZE_MISMATCH' });
  model.loss([0, 1]);
  t.throws(() => model.backward(FlatBuffer.allocate(3)), { code: 'ERR_SIZE_MISMATCH' });
  t.throws(() => model.accuracy(x, [0, 7]), { code: 'ERR_INVALID_ARGUMENT' });
  const disposedWeights = FlatBuffer.allocate(model.params.length);
  disposedWeights.dispose();
  t.throws(() => model.forward(x, 2, disposedWeights), { code: 'ERR_DISPOSED' });
  model.dispose();
  t.throws(() => model.forward(x, 2), { code: 'ERR_DISPOSED' });
  t.throws(() => model.backward(), { code: 'ERR_DISPOSED' });
  t.end();
});
