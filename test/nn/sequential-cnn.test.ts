/**
 * Sequential with the image and normalisation layers (conv2d, max and average pooling, GELU, layer
 * norm): the gradient of a tiny CNN's loss at every parameter and at the input against central
 * finite differences of a plain double-precision forward built from test/reference/nn-layers.ts;
 * cuts into 2 and 3 parts against the whole (split backward included); typed errors for bad
 * specs; a CNN trained by the pipeline runtime (1F1B, 2 stages) whose loss falls, and the same
 * weights from ZB-H1 (split backward) as from 1F1B.
 *
 * Tolerance of the finite-difference check: |got - fd| <= 1e-5 (1 + |fd|). The model runs in
 * fp32 (relative rounding ~1e-6 on O(1) values); the differences are taken in double with
 * h = 1e-5 on a smooth loss (no input lies near a ReLU kink or a max-pool tie at this seed, where
 * the difference would straddle a non-smooth point), so their own error is ~1e-10.
 */
import t from 'tap';

import { FlatBuffer, InvalidArgumentError, PipelineTrainer, Sequential, SizeMismatchError, checkLayers, cnnLayers, layerParams, type LayerSpec } from '../../dist/index.js';
import { conv2dReference, finiteDifferences, geluReference, layerNormReference, pool2dReference } from '../reference/nn-layers.js';
import { reluReference, softmaxXentReference } from '../reference/nn-ops.js';

const worst = (a: ArrayLike<number>, b: ArrayLike<number>): number => {
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i]! - b[i]!));
  return m;
};

/** The forward of `layers` in double, from the parameters by name (`layer{i}.weight` ...). */
function referenceForward(layers: readonly LayerSpec[], params: Map<string, Float64Array>, x: Float64Array, batch: number): Float64Array {
  let h: Float64Array = x;
  layers.forEach((l, i) => {
    const p = (name: string): Float64Array => params.get(`layer${i}.${name}`)!;
    switch (l.kind) {
      case 'linear': {
        const y = new Float64Array(batch * l.out);
        for (let n = 0; n < batch; n++)
          for (let o = 0; o < l.out; o++) {
            let s = p('bias')[o]!;
            for (let k = 0; k < l.in; k++) s += p('weight')[o * l.in + k]! * h[n * l.in + k]!;
            y[n * l.out + o] = s;
          }
        h = y;
        break;
      }
      case 'relu':
        h = reluReference(h);
        break;
      case 'gelu':
        h = geluReference(h);
        break;
      case 'conv2d': {
        const [stride, pad] = [l.stride ?? 1, l.padding ?? 0];
        const shape = { batch, inChannels: l.inChannels, height: l.height, width: l.width, outChannels: l.outChannels, kernelH: l.kernel, kernelW: l.kernel, strideH: stride, strideW: stride, padH: pad, padW: pad };
        h = conv2dReference(h, p('weight'), p('bias'), shape);
        break;
      }
      case 'maxPool':
      case 'avgPool': {
        const stride = l.stride ?? l.kernel;
        const shape = { batch, channels: l.channels, height: l.height, width: l.width, kernelH: l.kernel, kernelW: l.kernel, strideH: stride, strideW: stride, padH: 0, padW: 0 };
        h = pool2dReference(h, shape, l.kind === 'maxPool' ? 'max' : 'avg');
        break;
      }
      case 'layerNorm':
        h = layerNormReference(h, p('gamma'), p('beta'), batch, l.features, 1e-5).y;
        break;
    }
  });
  return h;
}

const paramsOf = (model: Sequential, buffer: FlatBuffer = model.params.weights): Map<string, Float64Array> =>
  new Map(model.params.names.filter((n) => n !== 'unused').map((n) => [n, Float64Array.from(model.params.view(buffer, n))]));

t.test('a tiny CNN (conv-relu-maxPool-layerNorm-gelu-linear): every parameter and input gradient against finite differences in double', async (t) => {
  const layers: LayerSpec[] = [
    { kind: 'conv2d', inChannels: 2, height: 5, width: 5, outChannels: 3, kernel: 3, padding: 1 },
    { kind: 'relu' },
    { kind: 'maxPool', channels: 3, height: 5, width: 5, kernel: 2 },
    { kind: 'layerNorm', features: 12 },
    { kind: 'gelu' },
    { kind: 'linear', in: 12, out: 4 },
  ];
  const batch = 3;
  t.same(checkLayers(layers), [50, 75, 75, 12, 12, 12, 4]);
  const model = new Sequential(layers, { seed: 11 });
  // gamma and beta start at 1 and 0: move them, so that their gradients are not the trivial case.
  const gamma = model.params.view(model.params.weights, 'layer3.gamma');
  const beta = model.params.view(model.params.weights, 'layer3.beta');
  gamma.forEach((_, k) => ((gamma[k] = 1 + 0.3 * Math.sin(k)), (beta[k] = 0.2 * Math.cos(k))));
  const x = Float64Array.from({ length: batch * 50 }, (_, i) => Math.sin(i * 0.37) + 0.3 * Math.cos(i * 1.1));
  const labels = [1, 3, 0];
  const input = FlatBuffer.from(Array.from(x));
  const logits = model.forward(0, input, batch).array.slice(0, batch * 4);
  const params = paramsOf(model);
  const refLogits = referenceForward(layers, params, x, batch);
  t.ok(worst(logits, refLogits) < 1e-5, `forward against the reference (${worst(logits, refLogits).toExponential(2)})`);
  const { dlogits } = softmaxXentReference(logits, labels, batch, 4, 1 / batch);
  const grad = FlatBuffer.from(Array.from(dlogits));
  const dx = model.backward(0, grad, { grads: model.params.grads })!.array.slice(0, batch * 50);
  const loss = (logitsOf: () => Float64Array): number => softmaxXentReference(logitsOf(), labels, batch, 4, 1).losses.reduce((a, b) => a + b, 0) / batch;
  const check = (what: string, got: ArrayLike<number>, fd: ArrayLike<number>): void => {
    let bad = 0;
    let largest = 0;
    for (let k = 0; k < fd.length; k++) {
      const err = Math.abs(got[k]! - fd[k]!);
      largest = Math.max(largest, err);
      if (err > 1e-5 * (1 + Math.abs(fd[k]!))) bad++;
    }
    t.equal(bad, 0, `${what}: ${fd.length} gradients within 1e-5 (1 + |fd|) of central differences (largest error ${largest.toExponential(2)})`);
  };
  for (const [name, values] of params) {
    const fd = finiteDifferences(values, [1], (v) => [loss(() => referenceForward(layers, new Map([...params, [name, v]]), x, batch))]);
    check(name, model.params.view(model.params.grads, name), fd);
  }
  check('input', dx, finiteDifferences(x, [1], (v) => [loss(() => referenceForward(layers, params, v, batch))]));
  input.dispose();
  grad.dispose();
  model.dispose();
});

// conv (stride 1, pad 1) - relu - maxPool - conv (stride 2, no pad) - gelu - avgPool (stride 1) - layerNorm - linear
const CNN: LayerSpec[] = [
  { kind: 'conv2d', inChannels: 1, height: 8, width: 8, outChannels: 3, kernel: 3, padding: 1 },
  { kind: 'relu' },
  { kind: 'maxPool', channels: 3, height: 8, width: 8, kernel: 2 },
  { kind: 'conv2d', inChannels: 3, height: 4, width: 4, outChannels: 4, kernel: 2, stride: 2 },
  { kind: 'gelu' },
  { kind: 'avgPool', channels: 4, height: 2, width: 2, kernel: 2, stride: 1 },
  { kind: 'layerNorm', features: 4 },
  { kind: 'linear', in: 4, out: 3 },
];

t.test('a CNN cut into 2 and 3 parts: the same initial weights, outputs and gradients as the whole (split backward too)', async (t) => {
  const batch = 4;
  const x = FlatBuffer.from(Array.from({ length: batch * 64 }, (_, i) => Math.cos(i * 0.21)));
  const dy = FlatBuffer.from(Array.from({ length: batch * 3 }, (_, i) => Math.sin(i * 0.9) * 0.3));
  const whole = new Sequential(CNN, { seed: 5 });
  const out = whole.forward(0, x, batch).array.slice(0, batch * 3);
  whole.params.grads.fill(0.5);
  const dxWhole = whole.backward(0, dy, { grads: whole.params.grads, accumulate: true })!.array.slice(0, batch * 64);
  t.equal(whole.liveSlots, 0);
  for (const boundaries of [[3], [2, 6]]) {
    for (const split of [false, true]) {
      const parts = [0, ...boundaries].map((_, k) => Sequential.part(CNN, boundaries, k, { seed: 5 }));
      for (const part of parts)
        for (const name of part.params.names.filter((n) => n !== 'unused'))
          t.same(part.params.view(part.params.weights, name), whole.params.view(whole.params.weights, name), `cut ${boundaries}: ${name} starts as the whole's`);
      let h = x;
      for (const part of parts) h = part.forward(7, h, batch);
      t.ok(worst(h.array.subarray(0, batch * 3), out) < 1e-6, `cut ${boundaries}: the same output`);
      let g = dy;
      for (const part of [...parts].reverse()) {
        part.params.grads.fill(0.5);
        g = part.backward(7, g, { grads: part.params.grads, accumulate: true, weightGrad: !split })!;
        if (split) {
          t.equal(part.liveSlots, 1, 'a split backward keeps the slot for its weight gradient');
          part.weightGrad(7, { grads: part.params.grads, accumulate: true });
        }
        t.equal(part.liveSlots, 0);
      }
      t.ok(worst(g.array.subarray(0, batch * 64), dxWhole) < 1e-6, `cut ${boundaries} (split ${split}): the same input gradient`);
      for (const part of parts)
        for (const name of part.params.names.filter((n) => n !== 'unused')) {
          const d = worst(part.params.view(part.params.grads, name), whole.params.view(whole.params.grads, name));
          t.ok(d < 1e-6, `cut ${boundaries} (split ${split}): ${name} gradient accumulated onto 0.5 as the whole's (${d.toExponential(1)})`);
        }
      // Without accumulation a split backward overwrites, as a whole one does.
      const last = parts.at(-1)!;
      const lastInput = FlatBuffer.from(Array.from({ length: batch * last.inputSize }, (_, i) => Math.sin(i)));
      last.forward(8, lastInput, batch);
      last.params.grads.fill(9);
      last.backward(8, dy, { grads: last.params.grads, inputGrad: false, weightGrad: !split });
      if (split) last.weightGrad(8, { grads: last.params.grads });
      t.notOk(
        last.params.names.filter((n) => n !== 'unused').some((n) => last.params.view(last.params.grads, n).includes(9)),
        `cut ${boundaries} (split ${split}): accumulate false overwrites every gradient`,
      );
      lastInput.dispose();
      for (const part of parts) part.dispose();
    }
  }
  t.same(layerParams(CNN), [30, 0, 0, 52, 0, 0, 8, 15]);
  const model = new Sequential(CNN);
  // input, the 8 outputs, and layer norm's mean and rstd
  t.equal(model.activationFloats(2), 2 * (64 + 192 + 192 + 48 + 16 + 16 + 4 + 4 + 3 + 2));
  model.dispose();
  whole.dispose();
  x.dispose();
  dy.dispose();
});

t.test('bad layer specs are typed errors', async (t) => {
  const conv = { kind: 'conv2d', inChannels: 1, height: 8, width: 8, outChannels: 2, kernel: 3 } as const;
  const bad: Array<[string, unknown[], typeof InvalidArgumentError | typeof SizeMismatchError]> = [
    ['an unknown kind', [{ kind: 'conv3d' }], InvalidArgumentError],
    ['a conv2d without outChannels', [{ ...conv, outChannels: undefined }], InvalidArgumentError],
    ['a kernel of 0', [{ ...conv, kernel: 0 }], InvalidArgumentError],
    ['a stride of 0', [{ ...conv, stride: 0 }], InvalidArgumentError],
    ['negative padding', [{ ...conv, padding: -1 }], InvalidArgumentError],
    ['a kernel larger than the padded image', [{ ...conv, kernel: 9 }], InvalidArgumentError],
    ['a misspelt key', [{ ...conv, pad: 1 }], InvalidArgumentError],
    ['a pooling window larger than the image', [{ kind: 'maxPool', channels: 1, height: 2, width: 2, kernel: 3 }], InvalidArgumentError],
    ['layer norm of 0 features', [{ kind: 'layerNorm', features: 0 }], InvalidArgumentError],
    ['ReLU first', [{ kind: 'relu' }, { kind: 'linear', in: 3, out: 2 }], InvalidArgumentError],
    ['GELU first', [{ kind: 'gelu' }, { kind: 'linear', in: 3, out: 2 }], InvalidArgumentError],
    ['a linear layer after a conv of another size', [conv, { kind: 'linear', in: 100, out: 2 }], SizeMismatchError],
    ['a pooling of another size than the conv', [conv, { kind: 'avgPool', channels: 2, height: 8, width: 8, kernel: 2 }], SizeMismatchError],
    ['a layer norm of another size', [{ kind: 'linear', in: 3, out: 4 }, { kind: 'layerNorm', features: 5 }], SizeMismatchError],
  ];
  for (const [what, layers, type] of bad) {
    t.throws(() => checkLayers(layers as LayerSpec[]), type, what);
    t.throws(() => new Sequential(layers as LayerSpec[]), type, `${what} (Sequential)`);
  }
  try {
    checkLayers([{ kind: 'conv3d' } as unknown as LayerSpec]);
  } catch (e) {
    t.match((e as Error).message, /'conv2d'.*'layerNorm'/, 'the message lists the kinds');
  }
  t.same(checkLayers([conv]), [64, 72], 'a conv2d may be first: it fixes the input size (no padding: 6 x 6 out)');
  t.same(cnnLayers({ channels: 1, height: 28, width: 28 }, [8, 16], 10), [
    { kind: 'conv2d', inChannels: 1, height: 28, width: 28, outChannels: 8, kernel: 3, padding: 1 },
    { kind: 'relu' },
    { kind: 'maxPool', channels: 8, height: 28, width: 28, kernel: 2 },
    { kind: 'conv2d', inChannels: 8, height: 14, width: 14, outChannels: 16, kernel: 3, padding: 1 },
    { kind: 'relu' },
    { kind: 'maxPool', channels: 16, height: 14, width: 14, kernel: 2 },
    { kind: 'linear', in: 16 * 7 * 7, out: 10 },
  ]);
  t.throws(() => cnnLayers({ channels: 1, height: 4, width: 4 }, [2, 2, 2], 3), InvalidArgumentError, 'pooled below the window');
  t.throws(() => cnnLayers({ channels: 1, height: 8, width: 8 }, [2], 3, { kernal: 3 } as never), InvalidArgumentError, 'an unknown option');
});

/** Two classes of 8x8 images: a bright 3x3 square in the top-left or the bottom-right quarter, on noise. */
function squares(n: number): { inputs: Float32Array; labels: Int32Array } {
  const inputs = new Float32Array(n * 64);
  const labels = new Int32Array(n);
  let seed = 7;
  const rand = (): number => (seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) / 2 ** 32;
  for (let s = 0; s < n; s++) {
    const label = s % 2;
    labels[s] = label;
    const [oy, ox] = label === 0 ? [Math.floor(rand() * 2), Math.floor(rand() * 2)] : [4 + Math.floor(rand() * 2), 3 + Math.floor(rand() * 2)];
    for (let i = 0; i < 64; i++) inputs[s * 64 + i] = 0.3 * (rand() - 0.5);
    for (let y = 0; y < 3; y++) for (let x = 0; x < 3; x++) inputs[s * 64 + (oy + y) * 8 + ox + x]! += 1;
  }
  return { inputs, labels };
}

t.test('a CNN trains in PipelineTrainer (1F1B, 2 stages) on synthetic 8x8 images: its loss falls', async (t) => {
  const { inputs, labels } = squares(256);
  const layers = cnnLayers({ channels: 1, height: 8, width: 8 }, [4], 2);
  const trainer = await PipelineTrainer.create({
    schedule: '1f1b',
    stages: 2,
    microBatches: 4,
    microBatchSize: 8,
    model: { layers, seed: 1 },
    optimizer: { kind: 'sgd', lr: 0.05, momentum: 0.9 },
    data: { inputs, labels, features: 64 },
  });
  try {
    const losses: number[] = [];
    for (let r = 0; r < 16; r++) losses.push((await trainer.trainRound()).loss);
    const first = (losses[0]! + losses[1]!) / 2;
    const last = (losses.at(-1)! + losses.at(-2)!) / 2;
    t.ok(losses.every(Number.isFinite), 'finite losses');
    t.ok(last < 0.5 * first, `the loss falls: ${first.toFixed(3)} -> ${last.toFixed(3)}`);
    const accuracy = await trainer.evaluate(inputs, labels);
    t.ok(accuracy > 0.9, `training accuracy ${accuracy}`);
  } finally {
    await trainer.dispose();
  }
});

t.test('a split backward in the runtime (ZB-H1) ends with the weights of 1F1B on a CNN with conv2d and layer norm in both parts', async (t) => {
  const { inputs, labels } = squares(64);
  const layers: LayerSpec[] = [
    { kind: 'conv2d', inChannels: 1, height: 8, width: 8, outChannels: 2, kernel: 3, padding: 1 },
    { kind: 'layerNorm', features: 128 },
    { kind: 'gelu' },
    { kind: 'conv2d', inChannels: 2, height: 8, width: 8, outChannels: 2, kernel: 3, stride: 2 },
    { kind: 'layerNorm', features: 18 },
    { kind: 'linear', in: 18, out: 2 },
  ];
  const weights: Float32Array[][] = [];
  for (const schedule of ['1f1b', 'zb-h1'] as const) {
    const trainer = await PipelineTrainer.create({
      schedule,
      stages: 2,
      microBatches: 4,
      microBatchSize: 4,
      model: { layers, seed: 3, boundaries: [3] },
      optimizer: { kind: 'sgd', lr: 0.05, momentum: 0.9 },
      data: { inputs, labels, features: 64 },
      shuffle: false,
    });
    try {
      for (let r = 0; r < 4; r++) await trainer.trainRound();
      weights.push(await trainer.weights());
    } finally {
      await trainer.dispose();
    }
  }
  const start = new Sequential(layers, { seed: 3, range: [0, 3] });
  t.ok(worst(weights[0]![0]!, start.params.weights.array) > 1e-3, 'the weights moved');
  start.dispose();
  weights[0]!.forEach((part, k) => t.ok(worst(part, weights[1]![k]!) < 1e-6, `part ${k}: ZB-H1's weights are 1F1B's (${worst(part, weights[1]![k]!).toExponential(1)})`));
});
