/**
 * Sequential: a model of Linear and ReLU layers, whole or cut into parts. Its forward and backward
 * (whole and split into input and weight gradients, accumulating or not) against the plain
 * double-precision reference of test/reference/pipeline.ts; cuts and balanced cuts.
 */
import t from 'tap';

import { FlatBuffer, InvalidArgumentError, MLP, Sequential, SizeMismatchError, balancedBoundaries, mlpLayers, partRanges } from '../../dist/index.js';
import { refBackward, refForward, type RefPartWeights } from '../reference/pipeline.js';

const layers = mlpLayers([7, 9, 6, 4]);
const batch = 5;

function weightsOf(model: Sequential): RefPartWeights {
  return layers.slice(model.start, model.end).map((l, k) => {
    const i = model.start + k;
    if (l.kind !== 'linear') return null;
    return { w: model.params.view(model.params.weights, `layer${i}.weight`).slice(), b: model.params.view(model.params.weights, `layer${i}.bias`).slice() };
  });
}

const worst = (a: ArrayLike<number>, b: ArrayLike<number>): number => {
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i]! - b[i]!));
  return m;
};

t.test('the whole model has the MLP of the same sizes and seed: same weights, same logits', async (t) => {
  const seq = new Sequential(layers, { seed: 4 });
  const mlp = new MLP([7, 9, 6, 4], { seed: 4 });
  // Sequential names tensors by layer index (ReLUs count), the MLP by linear layer: pair them in order.
  t.equal(seq.params.names.length, mlp.params.names.length);
  seq.params.names.forEach((name, k) => t.same(seq.params.view(seq.params.weights, name), mlp.params.view(mlp.params.weights, mlp.params.names[k]!), `${name} = ${mlp.params.names[k]}`));
  const x = FlatBuffer.from(Array.from({ length: batch * 7 }, (_, i) => Math.sin(i)));
  t.ok(worst(seq.forward(0, x, batch).array.subarray(0, batch * 4), mlp.forward(x, batch)) < 1e-6);
  seq.dispose();
  mlp.dispose();
});

t.test('forward and backward of every part against the reference, split or not, accumulating or not', async (t) => {
  for (const [start, end] of [[0, 5], [0, 2], [1, 4], [3, 5], [1, 2]] as const) {
    const part = new Sequential(layers, { seed: 2, range: [start, end] });
    const sub = layers.slice(start, end);
    const x = Array.from({ length: batch * part.inputSize }, (_, i) => Math.cos(i * 0.7));
    const dy = Array.from({ length: batch * part.outputSize }, (_, i) => Math.sin(i * 1.3) * 0.1);
    const ref = refForward(sub, weightsOf(part), Float64Array.from(x), batch);
    const { grads, dx } = refBackward(sub, weightsOf(part), ref, Float64Array.from(dy), batch);
    const input = FlatBuffer.from(x);
    const gradOut = FlatBuffer.from(dy);
    for (const split of [false, true]) {
      const out = part.forward(1, input, batch, part.params.weights);
      t.ok(worst(out.array.subarray(0, batch * part.outputSize), ref.outputs.at(-1)!) < 1e-5, `[${start}, ${end}) forward`);
      part.params.grads.fill(0.5);
      const got = part.backward(1, gradOut, { grads: part.params.grads, accumulate: true, weightGrad: !split });
      if (split) {
        t.equal(part.liveSlots, 1, 'a split backward keeps the slot for its weight gradient');
        part.weightGrad(1, { grads: part.params.grads, accumulate: true });
      }
      t.equal(part.liveSlots, 0, 'the slot is released');
      t.ok(worst(got!.array.subarray(0, batch * part.inputSize), dx) < 1e-5, `[${start}, ${end}) input gradient (split ${split})`);
      sub.forEach((l, k) => {
        if (l.kind !== 'linear') return;
        const i = start + k;
        const gw = part.params.view(part.params.grads, `layer${i}.weight`);
        t.ok(worst(Array.from(gw, (v) => v - 0.5), grads[k]!.w) < 1e-5, `layer ${i} weight gradient accumulated onto 0.5 (split ${split})`);
      });
      part.recycle(got!);
    }
    part.forward(2, input, batch, part.params.weights);
    t.equal(part.backward(2, gradOut, { grads: part.params.grads, inputGrad: false }), undefined, 'no input gradient when not asked');
    t.throws(() => part.backward(9, gradOut, { grads: part.params.grads }), InvalidArgumentError, 'a slot without a forward');
    t.throws(() => part.forward(3, input, batch, FlatBuffer.allocate(3)), SizeMismatchError, 'weights of another layout');
    input.dispose();
    gradOut.dispose();
    part.dispose();
  }
});

t.test('cuts: part ranges, typed errors, balanced boundaries', async (t) => {
  t.same(partRanges(5, [2, 4]), [[0, 2], [2, 4], [4, 5]]);
  t.throws(() => partRanges(5, [2, 2]), InvalidArgumentError, 'an empty part');
  t.throws(() => partRanges(5, [5]), InvalidArgumentError, 'a boundary past the last layer');
  t.same(balancedBoundaries([1, 1, 1, 1], 2), [2]);
  t.same(balancedBoundaries([5, 1, 1, 1, 1, 1], 3), [1, 3], 'the heavy layer alone, the rest even');
  t.same(balancedBoundaries([3, 0.1, 1, 0.1, 1, 0.1, 1, 0.1, 0.05], 4), [1, 3, 6], 'the parts off the critical path balanced too');
  t.throws(() => balancedBoundaries([1, 2], 3), InvalidArgumentError, 'more parts than layers');
  const p = Sequential.part(layers, [2, 3], 1, { seed: 2 });
  t.equal(p.start, 2);
  t.equal(p.end, 3);
  t.same(p.params.names, ['layer2.weight', 'layer2.bias']);
  p.dispose();
  const relu = new Sequential(layers, { range: [1, 2] });
  t.equal(relu.params.length > 0, true, 'a part of only ReLU still has a (one-element) ParamSet');
  relu.dispose();
  t.throws(() => new Sequential([{ kind: 'relu' }]), InvalidArgumentError);
  t.throws(() => new Sequential([{ kind: 'linear', in: 3, out: 4 }, { kind: 'linear', in: 5, out: 2 }]), SizeMismatchError);
  t.throws(() => new Sequential(layers, { range: [3, 3] }), InvalidArgumentError);
});
