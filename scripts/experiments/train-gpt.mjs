// Trains a byte-level GPT on real English text on one worker (this thread, the CPU by default):
// sapipe's Sequential of gptLayers (token and position embedding, pre-LN transformer blocks, a
// layer norm per position, the output head), windows of the Debian `fortunes` collection
// (loadTextCorpus, 90% training / 10% validation by splitText), AdamW with a linear warm-up and a
// cosine decay over --steps, the per-token cross-entropy (tokenCrossEntropy). Prints every
// --eval-every steps the mean training loss since the last print, the validation loss and
// perplexity (exp of the mean per-byte loss in nats) on --eval-windows windows spread evenly over
// the validation text, and the throughput in tokens/s (the steps only). Stops after --steps steps
// or --minutes minutes of training, whichever comes first, then evaluates once more.
//
//   node scripts/experiments/train-gpt.mjs [--layers 4] [--dim 128] [--heads 4] [--context 128]
//     [--batch 16] [--lr 1e-3] [--weight-decay 0.1] [--warmup 50] [--steps 2000] [--minutes 5]
//     [--eval-every 50] [--eval-windows 64] [--seed 1] [--device cpu] [--dir /usr/share/games/fortunes] [--json]
import { parseArgs } from 'node:util';

import { AdamW, DataLoader, DeviceParamSet, Sequential, gptLayers, layerParams, loadTextCorpus, modelDevice, splitText, tokenCrossEntropy, tokenSource } from '../../dist/index.js';

const { values: a } = parseArgs({
  options: {
    layers: { type: 'string', default: '4' },
    dim: { type: 'string', default: '128' },
    heads: { type: 'string', default: '4' },
    context: { type: 'string', default: '128' },
    batch: { type: 'string', default: '16' },
    lr: { type: 'string', default: '1e-3' },
    'weight-decay': { type: 'string', default: '0.1' },
    warmup: { type: 'string', default: '50' },
    steps: { type: 'string', default: '2000' },
    minutes: { type: 'string', default: '5' },
    'eval-every': { type: 'string', default: '50' },
    'eval-windows': { type: 'string', default: '64' },
    seed: { type: 'string', default: '1' },
    device: { type: 'string', default: 'cpu' },
    dir: { type: 'string' },
    json: { type: 'boolean', default: false },
  },
});
const [context, batch, steps, warmup, baseLr] = [Number(a.context), Number(a.batch), Number(a.steps), Number(a.warmup), Number(a.lr)];
const vocab = 256;
const layers = gptLayers({ vocab, context, dim: Number(a.dim), heads: Number(a.heads), layers: Number(a.layers) });
const memory = modelDevice(a.device);
const onDevice = memory.device !== 'cpu';
const model = new Sequential(layers, { seed: Number(a.seed), device: memory.device });
const optimizer = new AdamW(model.params, { lr: baseLr, weightDecay: Number(a['weight-decay']), betas: [0.9, 0.95] });
// On a device the weights, gradients and AdamW's state live in a DeviceParamSet.
const state = onDevice ? DeviceParamSet.create(model.params, { device: memory.device, optimizer }) : undefined;
const weights = () => (state ? state.forwardWeights : optimizer.forwardWeights);
const grads = state ? state.grads : model.params.grads;
const step = () => (state ? state.step() : optimizer.stepSync());

const corpus = loadTextCorpus(a.dir === undefined ? {} : { dir: a.dir });
const { train, validation } = splitText(corpus.bytes, 0.1);
const loader = new DataLoader(tokenSource(train, { context }), { batchSize: batch, seed: Number(a.seed) });
const valSource = tokenSource(validation, { context });
const evalWindows = Math.min(Number(a['eval-windows']), valSource.count);

const input = memory.allocate(batch * context);
const targets = memory.allocate(batch * context);
const dlogits = memory.allocate(batch * context * vocab);
const hostIn = new Float32Array(batch * context);
const hostTargets = new Float32Array(batch * context);

/** Mean per-byte loss on `evalWindows` validation windows spread evenly over the validation text. */
function validate() {
  let sum = 0;
  let count = 0;
  for (let start = 0; start < evalWindows; start += batch) {
    const n = Math.min(batch, evalWindows - start);
    for (let r = 0; r < n; r++) valSource.read(Math.floor(((start + r) * valSource.count) / evalWindows), hostIn, r * context, hostTargets, r * context);
    memory.write(input, hostIn.subarray(0, n * context));
    memory.write(targets, hostTargets.subarray(0, n * context));
    const logits = model.forward(0, input, n, weights());
    sum += n * tokenCrossEntropy(logits, targets, n, context, vocab);
    count += n;
    model.release(0);
  }
  return sum / count;
}

const lrAt = (t) => (t < warmup ? (baseLr * (t + 1)) / warmup : baseLr * (0.1 + 0.9 * 0.5 * (1 + Math.cos((Math.PI * Math.min(t - warmup, steps - warmup)) / Math.max(1, steps - warmup)))));
const params = layerParams(layers).reduce((x, y) => x + y, 0);
const log = (line) => a.json || console.log(line);
log(`GPT: ${a.layers} blocks, dim ${a.dim}, ${a.heads} heads, context ${context}, vocab ${vocab} (bytes); ${params} parameters; ${memory.device}`);
log(`text: ${corpus.files.length} files of ${corpus.bytes.length} bytes (training ${train.length}, validation ${validation.length}); batch ${batch} x ${context} tokens; AdamW lr ${baseLr} (warm-up ${warmup}, cosine to ${steps} steps), weight decay ${a['weight-decay']}`);
const v0 = validate();
log(`step 0: validation loss ${v0.toFixed(4)} (perplexity ${Math.exp(v0).toFixed(2)})`);
const results = [{ step: 0, validationLoss: v0, perplexity: Math.exp(v0), seconds: 0 }];
const deadline = performance.now() + Number(a.minutes) * 60_000;
let trained = 0;
let trainSeconds = 0;
let lossSum = 0;
let lossCount = 0;
outer: for (let epoch = 0; ; epoch++) {
  for (const b of loader.epoch(epoch)) {
    if (trained === steps || performance.now() > deadline) break outer;
    const start = performance.now();
    memory.write(input, b.inputs);
    memory.write(targets, b.targets);
    optimizer.lr = lrAt(trained);
    const logits = model.forward(0, input, batch, weights());
    lossSum += tokenCrossEntropy(logits, targets, batch, context, vocab, dlogits);
    lossCount++;
    model.backward(0, dlogits, { grads, inputGrad: false });
    step();
    trained++;
    trainSeconds += (performance.now() - start) / 1000;
    if (trained % Number(a['eval-every']) === 0) {
      const v = validate();
      results.push({ step: trained, trainLoss: lossSum / lossCount, validationLoss: v, perplexity: Math.exp(v), seconds: trainSeconds });
      log(`step ${trained}: training loss ${(lossSum / lossCount).toFixed(4)}, validation loss ${v.toFixed(4)} (perplexity ${Math.exp(v).toFixed(2)}); ${((trained * batch * context) / trainSeconds).toFixed(0)} tokens/s, ${trainSeconds.toFixed(0)} s`);
      [lossSum, lossCount] = [0, 0];
    }
  }
}
if (results.at(-1).step !== trained) {
  const v = validate();
  results.push({ step: trained, trainLoss: lossCount > 0 ? lossSum / lossCount : undefined, validationLoss: v, perplexity: Math.exp(v), seconds: trainSeconds });
  log(`step ${trained} (end): validation loss ${v.toFixed(4)} (perplexity ${Math.exp(v).toFixed(2)}); ${((trained * batch * context) / trainSeconds).toFixed(0)} tokens/s, ${trainSeconds.toFixed(0)} s`);
}
if (a.json) console.log(JSON.stringify({ layers: Number(a.layers), dim: Number(a.dim), heads: Number(a.heads), context, batch, params, device: memory.device, results }));
for (const t of [input, targets, dlogits]) t.dispose();
state?.dispose();
optimizer.dispose();
model.dispose();
