/**
 * sapipe's layers against PyTorch's on the same weights and inputs: a CNN (conv2d, ReLU, max
 * pooling, layer norm, tanh GELU, average pooling, linear) and a one-block GPT (embedding, the
 * pre-LN block with causal attention, per-position layer norm and head), each a Sequential. The
 * fixture (test/fixtures/torch/models.json) holds PyTorch 1.13's logits, mean cross-entropy and
 * every gradient, recorded once by scripts/fixtures/torch-models.py; the weights and inputs are a
 * formula both sides compute (fill below), so nothing but PyTorch's results is stored.
 *
 * Tolerance: 1e-5 absolute + 1e-4 relative on every value (fp32 on both sides, summed in other
 * orders; measured worst well below it).
 */
import { readFileSync } from 'node:fs';

import t, { type Test } from 'tap';

import { FlatBuffer, Sequential, gptLayers, softmaxCrossEntropy, tokenCrossEntropy, type LayerSpec } from '../../dist/index.js';
import { worstError } from '../helpers/random.js';

interface ModelFixture {
  batch: number;
  logits: number[];
  loss: number;
  grads: Record<string, number[]>;
}
const fixture = JSON.parse(readFileSync(new URL('../fixtures/torch/models.json', import.meta.url), 'utf8')) as {
  torch: string;
  cnn: ModelFixture & { labels: number[]; inputGrad: number[] };
  gpt: ModelFixture & { config: { vocab: number; context: number; dim: number; heads: number; hidden: number }; tokens: number[]; targets: number[] };
};

/** n values of scale * sin(0.37 i + 0.7 t + 0.3) as float32: the generator's tensor number t. */
const fill = (n: number, tensor: number, scale = 0.1): Float32Array => Float32Array.from({ length: n }, (_, i) => scale * Math.sin(0.37 * i + 0.7 * tensor + 0.3));
const [ATOL, RTOL] = [1e-5, 1e-4];

/** Fills every parameter tensor by its place in the fixture's order, which must be the ParamSet's. */
function setWeights(t: Test, model: Sequential, names: string[]): void {
  t.same(model.params.names, names, "the ParamSet's tensors are the fixture's, in its order");
  names.forEach((name, k) => model.params.view(model.params.weights, name).set(fill(model.params.layout(name).size, k)));
}

function compare(t: Test, what: string, got: ArrayLike<number>, want: readonly number[]): void {
  t.equal(got.length, want.length, `${what}: ${want.length} values`);
  const e = worstError(Float32Array.from(got), Float32Array.from(want), ATOL, RTOL);
  t.ok(e.ratio <= 1, `${what}: worst ${e.ratio.toFixed(3)} of the tolerance`);
}

t.test(`a CNN's logits, loss and gradients equal PyTorch ${fixture.torch}'s`, async (t) => {
  const f = fixture.cnn;
  const layers: LayerSpec[] = [
    { kind: 'conv2d', inChannels: 1, height: 6, width: 5, outChannels: 3, kernel: 3, padding: 1 },
    { kind: 'relu' },
    { kind: 'maxPool', channels: 3, height: 6, width: 5, kernel: 2, stride: 2 },
    { kind: 'layerNorm', features: 18 },
    { kind: 'gelu' },
    { kind: 'avgPool', channels: 3, height: 3, width: 2, kernel: 2, stride: 1 },
    { kind: 'linear', in: 6, out: 4 },
  ];
  const model = new Sequential(layers);
  const x = FlatBuffer.from(Array.from(fill(f.batch * 30, 100, 1)));
  const dlogits = FlatBuffer.allocate(f.batch * 4);
  try {
    setWeights(t, model, Object.keys(f.grads));
    const logits = model.forward(0, x, f.batch);
    compare(t, 'logits', logits.array, f.logits);
    const loss = softmaxCrossEntropy(logits.array, f.labels, f.batch, 4, dlogits.array);
    t.ok(Math.abs(loss - f.loss) <= ATOL + RTOL * f.loss, `loss ${loss} = ${f.loss}`);
    const dx = model.backward(0, dlogits, { grads: model.params.grads })!;
    for (const name of model.params.names) compare(t, name, model.params.view(model.params.grads, name), f.grads[name]!);
    compare(t, 'input gradient', dx.array.subarray(0, f.batch * 30), f.inputGrad);
  } finally {
    for (const b of [x, dlogits]) b.dispose();
    model.dispose();
  }
});

t.test(`a GPT block's logits, loss and gradients equal PyTorch ${fixture.torch}'s`, async (t) => {
  const f = fixture.gpt;
  const { vocab, context, dim, heads, hidden } = f.config;
  const model = new Sequential(gptLayers({ vocab, context, dim, heads, hidden, layers: 1 }));
  const tokens = FlatBuffer.from(f.tokens);
  const targets = FlatBuffer.from(f.targets);
  const dlogits = FlatBuffer.allocate(f.batch * context * vocab);
  try {
    setWeights(t, model, Object.keys(f.grads));
    const logits = model.forward(0, tokens, f.batch);
    compare(t, 'logits', logits.array, f.logits);
    const loss = tokenCrossEntropy(logits, targets, f.batch, context, vocab, dlogits);
    t.ok(Math.abs(loss - f.loss) <= ATOL + RTOL * f.loss, `loss ${loss} = ${f.loss}`);
    model.backward(0, dlogits, { grads: model.params.grads, inputGrad: false });
    for (const name of model.params.names) compare(t, name, model.params.view(model.params.grads, name), f.grads[name]!);
  } finally {
    for (const b of [tokens, targets, dlogits]) b.dispose();
    model.dispose();
  }
});
