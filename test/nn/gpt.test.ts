/**
 * The GPT layers of Sequential (token and position embedding, pre-LN transformer block, layer norm
 * and linear map per position) and the per-token cross-entropy, on the CPU: the gradient of a tiny
 * GPT's loss (vocab 11, context 5, dim 8, 2 heads) at every parameter, and at the input of a part
 * that starts with a block, against central finite differences of a plain double-precision forward
 * (test/reference/gpt.ts); a 2-part cut against the whole; the split backward against the whole
 * backward; typed errors for bad specs; a few AdamW steps that lower the loss.
 *
 * Tolerance of the finite-difference check: |got - fd| <= 1e-5 (1 + |fd|), as for the CNN
 * (test/nn/sequential-cnn.test.ts): the model runs in fp32 (relative rounding ~1e-6 on O(1)
 * values), the differences are taken in double with h = 1e-5 on a smooth loss.
 */
import t, { type Test } from 'tap';

import { AdamW, FlatBuffer, InvalidArgumentError, Sequential, SizeMismatchError, checkLayers, gptLayers, layerParams, tokenCrossEntropy, type LayerSpec } from '../../dist/index.js';
import { gptForwardReference, type GptLayerRef } from '../reference/gpt.js';
import { finiteDifferences } from '../reference/nn-layers.js';
import { softmaxXentReference } from '../reference/nn-ops.js';

const [VOCAB, CONTEXT, DIM, HEADS] = [11, 5, 8, 2];
const BATCH = 2;
// Two blocks, the second with a hidden layer of its own size (12, not 4 * dim).
const LAYERS: LayerSpec[] = [
  { kind: 'embedding', vocab: VOCAB, dim: DIM, context: CONTEXT },
  { kind: 'transformerBlock', dim: DIM, heads: HEADS, context: CONTEXT },
  { kind: 'transformerBlock', dim: DIM, heads: HEADS, context: CONTEXT, hidden: 12 },
  { kind: 'layerNorm', features: DIM, rows: CONTEXT },
  { kind: 'linear', in: DIM, out: VOCAB, rows: CONTEXT },
];
const TOKENS = Array.from({ length: BATCH * CONTEXT }, (_, i) => (i * 7 + 3) % VOCAB);
const TARGETS = Array.from({ length: BATCH * CONTEXT }, (_, i) => (i * 5 + 1) % VOCAB);

const worst = (a: ArrayLike<number>, b: ArrayLike<number>): number => {
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i]! - b[i]!));
  return m;
};
const named = (model: Sequential): string[] => model.params.names.filter((n) => n !== 'unused');
const paramsOf = (model: Sequential): Map<string, Float64Array> => new Map(named(model).map((n) => [n, Float64Array.from(model.params.view(model.params.weights, n))]));

/**
 * The model with every parameter moved off its initial value by a deterministic pattern of scale
 * 0.3 (GPT-2's N(0, 0.02) makes near-uniform attention and near-zero gradients: not a searching
 * check), the same in every part of a cut.
 */
function build(range?: [number, number]): Sequential {
  const model = new Sequential(LAYERS, { seed: 3, ...(range ? { range } : {}) });
  for (const name of named(model)) {
    const v = model.params.view(model.params.weights, name);
    const h = [...name].reduce((s, c) => s + c.charCodeAt(0), 0);
    v.forEach((x, k) => (v[k] = x + 0.3 * Math.sin(0.7 * k + h)));
  }
  return model;
}

function gradientCheck(t: Test, what: string, got: ArrayLike<number>, fd: ArrayLike<number>): void {
  let bad = 0;
  let largest = 0;
  let size = 0;
  for (let k = 0; k < fd.length; k++) {
    const err = Math.abs(got[k]! - fd[k]!);
    largest = Math.max(largest, err);
    size = Math.max(size, Math.abs(fd[k]!));
    if (err > 1e-5 * (1 + Math.abs(fd[k]!))) bad++;
  }
  t.equal(bad, 0, `${what}: ${fd.length} gradients (largest ${size.toExponential(1)}) within 1e-5 (1 + |fd|) of central differences (largest error ${largest.toExponential(2)})`);
}

t.test('a tiny GPT: forward and loss against the double reference; every parameter gradient against finite differences', async (t) => {
  t.same(checkLayers(LAYERS), [CONTEXT, CONTEXT * DIM, CONTEXT * DIM, CONTEXT * DIM, CONTEXT * DIM, CONTEXT * VOCAB], 'widths: context in, context * dim between, context * vocab out');
  t.same(layerParams(LAYERS), [VOCAB * DIM + CONTEXT * DIM, 4 * DIM + 4 * (DIM * DIM + DIM) + (4 * DIM * DIM + 4 * DIM) + (DIM * 4 * DIM + DIM), 4 * DIM + 4 * (DIM * DIM + DIM) + (12 * DIM + 12) + (DIM * 12 + DIM), 2 * DIM, DIM * VOCAB + VOCAB]);
  const model = build();
  const input = FlatBuffer.from(TOKENS);
  const targets = FlatBuffer.from(TARGETS);
  const logits = model.forward(0, input, BATCH);
  const params = paramsOf(model);
  const refs = LAYERS as GptLayerRef[];
  const refLogits = gptForwardReference(refs, params, TOKENS, BATCH);
  t.ok(worst(logits.array.subarray(0, refLogits.length), refLogits) < 1e-5, `logits against the reference (${worst(logits.array.subarray(0, refLogits.length), refLogits).toExponential(2)})`);
  const rows = BATCH * CONTEXT;
  const refLoss = (z: ArrayLike<number>): number => softmaxXentReference(z, TARGETS, rows, VOCAB, 1).losses.reduce((a, b) => a + b, 0) / rows;
  const dlogits = FlatBuffer.allocate(rows * VOCAB);
  const loss = tokenCrossEntropy(logits, targets, BATCH, CONTEXT, VOCAB, dlogits);
  t.ok(Math.abs(loss - refLoss(logits.array)) < 1e-5, `tokenCrossEntropy: the mean loss (${loss.toFixed(5)})`);
  const wantD = softmaxXentReference(logits.array, TARGETS, rows, VOCAB, 1 / rows).dlogits;
  t.ok(worst(dlogits.array, wantD) < 1e-7, 'tokenCrossEntropy: the gradient of the mean loss');
  t.equal(model.backward(0, dlogits, { grads: model.params.grads }), undefined, 'token ids have no gradient: backward returns none');
  t.equal(model.liveSlots, 0);
  for (const [name, values] of params) {
    const fd = finiteDifferences(values, [1], (v) => [refLoss(gptForwardReference(refs, new Map([...params, [name, v]]), TOKENS, BATCH))]);
    gradientCheck(t, name, model.params.view(model.params.grads, name), fd);
  }
  for (const b of [input, targets, dlogits]) b.dispose();
  model.dispose();
});

t.test('a part that starts with a block: the input gradient against finite differences', async (t) => {
  const part = build([1, 5]);
  const x = Float64Array.from({ length: BATCH * CONTEXT * DIM }, (_, i) => Math.sin(i * 0.37) + 0.3 * Math.cos(i * 1.1));
  const input = FlatBuffer.from(Array.from(x));
  const logits = part.forward(0, input, BATCH);
  const rows = BATCH * CONTEXT;
  const dlogits = FlatBuffer.allocate(rows * VOCAB);
  tokenCrossEntropy(logits, FlatBuffer.from(TARGETS), BATCH, CONTEXT, VOCAB, dlogits);
  const dx = part.backward(0, dlogits, { grads: part.params.grads })!;
  const params = paramsOf(part);
  const refs = LAYERS.slice(1) as GptLayerRef[];
  const refLoss = (v: Float64Array): number => softmaxXentReference(gptForwardReference(refs, params, v, BATCH, 1), TARGETS, rows, VOCAB, 1).losses.reduce((a, b) => a + b, 0) / rows;
  gradientCheck(t, 'input of the block', dx.array.subarray(0, x.length), finiteDifferences(x, [1], (v) => [refLoss(v)]));
  part.recycle(dx);
  part.dispose();
});

t.test('a GPT cut in 2 parts: the same weights, logits and gradients as the whole; the split backward as the whole one', async (t) => {
  const input = FlatBuffer.from(TOKENS);
  const dy = FlatBuffer.from(Array.from({ length: BATCH * CONTEXT * VOCAB }, (_, i) => Math.sin(i * 0.9) * 0.1));
  const whole = new Sequential(LAYERS, { seed: 9 });
  const out = whole.forward(0, input, BATCH).array.slice();
  whole.params.grads.fill(0.5);
  t.equal(whole.backward(0, dy, { grads: whole.params.grads, accumulate: true }), undefined);
  for (const boundaries of [[2], [1, 3]])
    for (const split of [false, true]) {
      const parts = [0, ...boundaries].map((_, k) => Sequential.part(LAYERS, boundaries, k, { seed: 9 }));
      for (const part of parts) for (const name of named(part)) t.same(part.params.view(part.params.weights, name), whole.params.view(whole.params.weights, name), `cut ${boundaries}: ${name} starts as the whole's`);
      let h = input;
      for (const part of parts) h = part.forward(4, h, BATCH);
      t.ok(worst(h.array.subarray(0, out.length), out) < 1e-6, `cut ${boundaries}: the same logits`);
      let g: FlatBuffer | undefined = dy;
      for (const part of [...parts].reverse()) {
        part.params.grads.fill(0.5);
        g = part.backward(4, g!, { grads: part.params.grads, accumulate: true, weightGrad: !split });
        if (split) {
          t.equal(part.liveSlots, 1, `cut ${boundaries}: a split backward keeps the slot for its weight gradient`);
          part.weightGrad(4, { grads: part.params.grads, accumulate: true });
        }
        t.equal(part.liveSlots, 0);
      }
      for (const part of parts)
        for (const name of named(part)) {
          const d = worst(part.params.view(part.params.grads, name), whole.params.view(whole.params.grads, name));
          t.ok(d < 1e-6, `cut ${boundaries} (split ${split}): ${name} gradient accumulated onto 0.5 as the whole's (${d.toExponential(1)})`);
        }
      // Without accumulation a split backward overwrites every gradient, as a whole one does.
      const first = parts[0]!;
      first.forward(5, input, BATCH);
      first.params.grads.fill(9);
      const dFirst = FlatBuffer.from(Array.from({ length: BATCH * first.outputSize }, (_, i) => Math.cos(i)));
      first.backward(5, dFirst, { grads: first.params.grads, inputGrad: false, weightGrad: !split });
      if (split) first.weightGrad(5, { grads: first.params.grads });
      t.notOk(named(first).some((n) => first.params.view(first.params.grads, n).includes(9)), `cut ${boundaries} (split ${split}): accumulate false overwrites every gradient`);
      dFirst.dispose();
      for (const part of parts) part.dispose();
    }
  // input, 5 outputs, the blocks' saved values (context * (7 dim + 2 hidden + 4) + heads * context), the layer norm's mean and rstd per position
  const saved = (hidden: number): number => CONTEXT * (7 * DIM + 2 * hidden + 4) + HEADS * CONTEXT;
  t.equal(whole.activationFloats(2), 2 * (CONTEXT + 4 * CONTEXT * DIM + CONTEXT * VOCAB + saved(32) + saved(12) + 2 * CONTEXT));
  whole.dispose();
  input.dispose();
  dy.dispose();
});

t.test('gptLayers builds the stack; AdamW on a repeated sequence lowers the loss', async (t) => {
  const layers = gptLayers({ vocab: VOCAB, context: CONTEXT, dim: DIM, heads: HEADS, layers: 2 });
  t.same(layers, [
    { kind: 'embedding', vocab: VOCAB, dim: DIM, context: CONTEXT },
    { kind: 'transformerBlock', dim: DIM, heads: HEADS, context: CONTEXT },
    { kind: 'transformerBlock', dim: DIM, heads: HEADS, context: CONTEXT },
    { kind: 'layerNorm', features: DIM, rows: CONTEXT },
    { kind: 'linear', in: DIM, out: VOCAB, rows: CONTEXT },
  ]);
  t.same(gptLayers({ vocab: 3, context: 2, dim: 4, heads: 1, layers: 1, hidden: 6 })[1], { kind: 'transformerBlock', dim: 4, heads: 1, context: 2, hidden: 6 }, 'hidden passes through');
  const model = new Sequential(layers, { seed: 1 });
  const optimizer = new AdamW(model.params, { lr: 0.01, weightDecay: 0.01 });
  const input = FlatBuffer.from(TOKENS);
  const targets = FlatBuffer.from(TARGETS);
  const dlogits = FlatBuffer.allocate(BATCH * CONTEXT * VOCAB);
  const losses: number[] = [];
  for (let step = 0; step < 40; step++) {
    const logits = model.forward(0, input, BATCH, optimizer.forwardWeights);
    losses.push(tokenCrossEntropy(logits, targets, BATCH, CONTEXT, VOCAB, dlogits));
    model.backward(0, dlogits, { grads: model.params.grads, inputGrad: false });
    optimizer.stepSync();
  }
  t.ok(Math.abs(losses[0]! - Math.log(VOCAB)) < 1.5, `the first loss near ln(vocab) = ${Math.log(VOCAB).toFixed(2)}: ${losses[0]!.toFixed(3)}`);
  t.ok(losses.at(-1)! < 0.3 * losses[0]!, `the loss falls: ${losses[0]!.toFixed(3)} -> ${losses.at(-1)!.toFixed(3)}`);
  for (const b of [input, targets, dlogits]) b.dispose();
  optimizer.dispose();
  model.dispose();
});

t.test('bad GPT specs and targets are typed errors that say what to do', async (t) => {
  const block = { kind: 'transformerBlock', dim: 8, heads: 2, context: 5 } as const;
  const emb = { kind: 'embedding', vocab: 11, dim: 8, context: 5 } as const;
  const bad: Array<[string, unknown[], typeof InvalidArgumentError | typeof SizeMismatchError, RegExp]> = [
    ['dim not a multiple of heads', [emb, { ...block, heads: 3 }], InvalidArgumentError, /dim 8 must be a multiple of heads 3/],
    ['a head above 256', [{ ...emb, dim: 514 }, { ...block, dim: 514, heads: 2 }], InvalidArgumentError, /largest head the attention takes; use more heads/],
    ['hidden 0', [emb, { ...block, hidden: 0 }], InvalidArgumentError, /hidden/],
    ['context 0', [{ ...emb, context: 0 }], InvalidArgumentError, /context/],
    ['a misspelt key', [emb, { ...block, head: 2 }], InvalidArgumentError, /head/],
    ['an embedding after a layer', [{ kind: 'linear', in: 5, out: 5 }, emb], InvalidArgumentError, /make it the first layer/],
    ['a vocabulary above 2^24', [{ ...emb, vocab: 2 ** 24 + 1 }], InvalidArgumentError, /vocab/],
    ['a block of another context', [emb, { ...block, context: 4 }], SizeMismatchError, /transformerBlock with 32 input features, but the layer before outputs 40/],
    ['a per-position layer norm of another width', [emb, { kind: 'layerNorm', features: 8, rows: 4 }], SizeMismatchError, /layerNorm with 32 input features/],
    ['rows 0', [emb, { kind: 'linear', in: 8, out: 3, rows: 0 }], InvalidArgumentError, /rows/],
  ];
  for (const [what, layers, type, message] of bad) {
    t.throws(() => checkLayers(layers as LayerSpec[]), type, what);
    t.throws(() => new Sequential(layers as LayerSpec[]), { message }, `${what} (Sequential): ${String(message)}`);
  }
  t.throws(() => gptLayers({ vocab: 11, context: 5, dim: 8, heads: 3, layers: 1 }), InvalidArgumentError, 'gptLayers checks the stack');
  t.throws(() => gptLayers({ vocab: 11, context: 5, dim: 8, heads: 2, layers: 0 }), InvalidArgumentError, 'no blocks');
  t.throws(() => gptLayers({ vocab: 11, context: 5, dim: 8, heads: 2, layers: 1, depth: 2 } as never), InvalidArgumentError, 'an unknown option');
  const [logits, targets] = [FlatBuffer.allocate(2 * 3 * 4), FlatBuffer.from([0, 1, 2, 3, 1, 4])];
  t.throws(() => tokenCrossEntropy(logits, targets, 2, 3, 4), { message: /targets\[5\] = 4 is not a token id \(an integer in \[0, 4\)\)/ }, 'a target past the vocabulary');
  t.throws(() => tokenCrossEntropy(logits, targets, 2, 4, 4), SizeMismatchError, 'logits too short for batch x context x vocab');
  t.throws(() => tokenCrossEntropy(logits, new Float32Array(6) as never, 2, 3, 4), InvalidArgumentError, 'targets not a tensor');
  logits.dispose();
  targets.dispose();
});
