// A byte-level GPT on the text of Debian's fortunes, the way docs/guide.md ("A GPT") builds it:
// first one worker (Sequential, AdamW, the per-token loss), then the same model cut into 2 pipeline
// stages with PipeOptim, checkpointed and resumed. Small by default so it runs in seconds; the
// guide's size is --dim 128 --layers 4 --context 128.
// Run: node examples/gpt-text.mjs [--dim 64] [--layers 2] [--heads 4] [--context 64] [--steps 60] [--windows 1024]
// (in a checkout, or after `npm install sapipe`; needs Debian's `fortunes` package for the text)
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import {
  AdamW,
  DataLoader,
  FlatBuffer,
  PipelineTrainer,
  Sequential,
  gptLayers,
  loadPipelineCheckpoint,
  loadTextCorpus,
  savePipelineCheckpoint,
  splitText,
  textWindows,
  tokenCrossEntropy,
  tokenSource,
} from '../dist/index.js';

const { values } = parseArgs({
  options: {
    dim: { type: 'string', default: '64' },
    layers: { type: 'string', default: '2' },
    heads: { type: 'string', default: '4' },
    context: { type: 'string', default: '64' },
    steps: { type: 'string', default: '60' },
    windows: { type: 'string', default: '1024' },
  },
});
const [dim, depth, heads, context, steps, windowCount] = ['dim', 'layers', 'heads', 'context', 'steps', 'windows'].map((k) => Number(values[k]));
const [vocab, batch] = [256, 16];
const size = { vocab, context, dim, heads, layers: depth };
const { train, validation } = splitText(loadTextCorpus().bytes, 0.1);
const held = textWindows(validation, context, 64);

// 1. One worker: the guide's loop.
const model = new Sequential(gptLayers(size), { seed: 1 });
const optimizer = new AdamW(model.params, { lr: 3e-3, weightDecay: 0.1, betas: [0.9, 0.95] });
const loader = new DataLoader(tokenSource(train, { context }), { batchSize: batch, seed: 1 });
const [x, targets, dlogits] = [FlatBuffer.allocate(batch * context), FlatBuffer.allocate(batch * context), FlatBuffer.allocate(batch * context * vocab)];
const heldLoss = () => {
  const n = held.inputs.length / context;
  let sum = 0;
  for (let i = 0; i + batch <= n; i += batch) {
    x.array.set(held.inputs.subarray(i * context, (i + batch) * context));
    targets.array.set(held.labels.subarray(i * context, (i + batch) * context));
    sum += tokenCrossEntropy(model.forward(0, x, batch, model.params.weights), targets, batch, context, vocab) * batch;
    model.release(0); // no backward follows: free the slot's saved activations
  }
  return sum / (Math.floor(n / batch) * batch);
};
const before = heldLoss();
let step = 0;
for (const b of loader.epoch(0)) {
  x.array.set(b.inputs);
  targets.array.set(b.targets);
  const logits = model.forward(0, x, batch, optimizer.forwardWeights);
  tokenCrossEntropy(logits, targets, batch, context, vocab, dlogits);
  model.backward(0, dlogits, { grads: model.params.grads, inputGrad: false });
  optimizer.stepSync();
  if (++step === steps) break;
}
const after = heldLoss();
console.log(`one worker: ${steps} AdamW steps, validation perplexity ${Math.exp(before).toFixed(2)} -> ${Math.exp(after).toFixed(2)}`);

// 2. The same model in a pipeline: 2 stages, PipeOptim, a checkpoint, a resume.
const windows = textWindows(train, context, windowCount);
const options = {
  schedule: 'pipeoptim',
  stages: 2,
  microBatches: 4,
  microBatchSize: 8,
  model: { layers: gptLayers(size), boundaries: 'params', seed: 1 },
  optimizer: { kind: 'adamw', lr: 3e-3 },
  data: { inputs: windows.inputs, labels: windows.labels, features: context },
};
const dir = mkdtempSync(join(tmpdir(), 'sapipe-gpt-'));
try {
  const trainer = await PipelineTrainer.create(options);
  let saved;
  try {
    const { rounds } = await trainer.trainEpoch();
    saved = await trainer.evaluateLoss(held.inputs, held.labels);
    await (await savePipelineCheckpoint(trainer, { dir })).written;
    console.log(`pipeline: 2 stages (pipeoptim), ${rounds} rounds, validation perplexity ${Math.exp(saved).toFixed(2)}, checkpoint in ${dir}`);
  } finally {
    await trainer.dispose();
  }
  const resumed = await PipelineTrainer.create(options);
  try {
    await loadPipelineCheckpoint(resumed, { dir });
    const loss = await resumed.evaluateLoss(held.inputs, held.labels);
    console.log(`resumed: validation loss ${loss.toFixed(6)} (saved ${saved.toFixed(6)})${loss === saved ? ', the same' : ''}`);
  } finally {
    await resumed.dispose();
  }
} finally {
  rmSync(dir, { recursive: true, force: true });
  for (const b of [x, targets, dlogits]) b.dispose();
  model.dispose();
}
