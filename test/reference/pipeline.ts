/**
 * Plain TypeScript references for the pipeline runtime, independent of its code: a sequential
 * Linear/ReLU model in double precision (weights stored per layer), mini-batch training of the
 * unpartitioned model, and a single-process replay of a schedule that reads, for every
 * micro-batch's forward and backward on every part, the weight version its action list names.
 */
import type { Action, LayerSpec, Schedule } from '../../dist/index.js';
import { ReferenceOptimizer, type RefConfig } from './optimizer.js';

/** Weights of one linear layer, row-major [out, in], and its bias. */
export interface RefLinear {
  w: Float32Array;
  b: Float32Array;
}
/** A part's weights: one entry per layer of the part (null for ReLU). */
export type RefPartWeights = (RefLinear | null)[];

/** Flattens a part's linear layers (weight then bias, layer order) into one array, and back. */
export function flatten(part: RefPartWeights): Float32Array {
  const total = part.reduce((n, l) => n + (l ? l.w.length + l.b.length : 0), 0);
  const out = new Float32Array(total);
  let o = 0;
  for (const l of part) {
    if (!l) continue;
    out.set(l.w, o);
    o += l.w.length;
    out.set(l.b, o);
    o += l.b.length;
  }
  return out;
}
export function unflatten(flat: ArrayLike<number>, like: RefPartWeights): RefPartWeights {
  let o = 0;
  return like.map((l) => {
    if (!l) return null;
    const w = Float32Array.from({ length: l.w.length }, (_, i) => flat[o + i]!);
    o += l.w.length;
    const b = Float32Array.from({ length: l.b.length }, (_, i) => flat[o + i]!);
    o += l.b.length;
    return { w, b };
  });
}

/** What a forward keeps: the input and every layer's output, in double. */
interface RefForward {
  input: Float64Array;
  outputs: Float64Array[];
}

export function refForward(layers: readonly LayerSpec[], weights: RefPartWeights, input: Float64Array, batch: number): RefForward {
  const outputs: Float64Array[] = [];
  let x = input;
  layers.forEach((l, i) => {
    if (l.kind === 'relu') {
      const y = x.map((v) => (v > 0 ? v : 0));
      outputs.push(y);
      x = y;
      return;
    }
    if (l.kind !== 'linear') throw new Error(`refForward: the reference runs MLP layers (linear, relu), not ${l.kind}`);
    const { w, b } = weights[i]!;
    const y = new Float64Array(batch * l.out);
    for (let r = 0; r < batch; r++)
      for (let o = 0; o < l.out; o++) {
        let s = b[o]!;
        for (let k = 0; k < l.in; k++) s += x[r * l.in + k]! * w[o * l.in + k]!;
        y[r * l.out + o] = s;
      }
    outputs.push(y);
    x = y;
  });
  return { input, outputs };
}

/**
 * Backward of a part from dY: parameter gradients (per layer, double) from the forward's stored
 * activations, and the input gradient through `weights` (which may differ from the forward's).
 */
export function refBackward(
  layers: readonly LayerSpec[],
  weights: RefPartWeights,
  fwd: RefForward,
  dy: Float64Array,
  batch: number,
): { grads: ({ w: Float64Array; b: Float64Array } | null)[]; dx: Float64Array } {
  const grads: ({ w: Float64Array; b: Float64Array } | null)[] = layers.map(() => null);
  let g = dy;
  for (let i = layers.length - 1; i >= 0; i--) {
    const l = layers[i]!;
    const x = i === 0 ? fwd.input : fwd.outputs[i - 1]!;
    if (l.kind === 'relu') {
      const y = fwd.outputs[i]!;
      g = g.map((v, k) => (y[k]! > 0 ? v : 0));
      continue;
    }
    if (l.kind !== 'linear') throw new Error(`refBackward: the reference runs MLP layers (linear, relu), not ${l.kind}`);
    const { w } = weights[i]!;
    const gw = new Float64Array(l.out * l.in);
    const gb = new Float64Array(l.out);
    const dx = new Float64Array(batch * l.in);
    for (let r = 0; r < batch; r++)
      for (let o = 0; o < l.out; o++) {
        const d = g[r * l.out + o]!;
        gb[o]! += d;
        for (let k = 0; k < l.in; k++) {
          gw[o * l.in + k]! += d * x[r * l.in + k]!;
          dx[r * l.in + k]! += d * w[o * l.in + k]!;
        }
      }
    grads[i] = { w: gw, b: gb };
    g = dx;
  }
  return { grads, dx: g };
}

/** Mean softmax cross-entropy over the batch and its gradient. */
export function refLoss(logits: Float64Array, labels: ArrayLike<number>, batch: number, classes: number): { loss: number; grad: Float64Array } {
  const grad = new Float64Array(batch * classes);
  let total = 0;
  for (let r = 0; r < batch; r++) {
    let max = -Infinity;
    for (let c = 0; c < classes; c++) max = Math.max(max, logits[r * classes + c]!);
    let sum = 0;
    for (let c = 0; c < classes; c++) sum += Math.exp(logits[r * classes + c]! - max);
    total += Math.log(sum) + max - logits[r * classes + labels[r]!]!;
    for (let c = 0; c < classes; c++) grad[r * classes + c] = (Math.exp(logits[r * classes + c]! - max) / sum - (c === labels[r] ? 1 : 0)) / batch;
  }
  return { loss: total / batch, grad };
}

function flatGrads(grads: ({ w: Float64Array; b: Float64Array } | null)[]): Float64Array {
  const parts: Float64Array[] = [];
  for (const g of grads) if (g) parts.push(g.w, g.b);
  const out = new Float64Array(parts.reduce((n, p) => n + p.length, 0));
  let o = 0;
  for (const p of parts) {
    out.set(p, o);
    o += p.length;
  }
  return out;
}

/** The data the references read: `samples(round, microBatch)` are the sample indices of a micro-batch. */
export interface RefData {
  inputs: Float32Array;
  /** `targetsPerSample` (default 1) per sample: class indices, or reals for `mse`. */
  labels: ArrayLike<number>;
  features: number;
  batch: number;
  /** Default `cross-entropy`: over every row of classes (targetsPerSample rows per sample). */
  loss?: 'cross-entropy' | 'mse';
  targetsPerSample?: number;
}

function gather(data: RefData, samples: readonly number[]): { x: Float64Array; labels: number[] } {
  const x = new Float64Array(samples.length * data.features);
  const per = data.targetsPerSample ?? 1;
  samples.forEach((s, r) => {
    for (let k = 0; k < data.features; k++) x[r * data.features + k] = data.inputs[s * data.features + k]!;
  });
  return { x, labels: samples.flatMap((s) => Array.from({ length: per }, (_, j) => data.labels[s * per + j]!)) };
}

/** Mean squared error (1/n) sum (y - t)^2 over the n outputs, and its gradient 2 (y - t) / n. */
export function refMse(outputs: Float64Array, targets: ArrayLike<number>): { loss: number; grad: Float64Array } {
  const n = outputs.length;
  const grad = new Float64Array(n);
  let total = 0;
  for (let i = 0; i < n; i++) {
    const d = outputs[i]! - targets[i]!;
    total += d * d;
    grad[i] = (2 * d) / n;
  }
  return { loss: total / n, grad };
}

/** The gradient of the mean loss over `samples` at `weights`, flattened, in one double pass. */
function meanGradient(layers: readonly LayerSpec[], weights: RefPartWeights, data: RefData, samples: readonly number[]): Float32Array {
  return meanGradientAndLoss(layers, weights, data, samples).grad;
}

/** The gradient of the mean loss over `samples` at `weights` (flattened, one double pass), and that loss. */
export function meanGradientAndLoss(layers: readonly LayerSpec[], weights: RefPartWeights, data: RefData, samples: readonly number[]): { grad: Float32Array; loss: number } {
  const outputs = (layers.filter((l) => l.kind === 'linear').at(-1) as { out: number }).out;
  const { x, labels } = gather(data, samples);
  const fwd = refForward(layers, weights, x, samples.length);
  const per = data.targetsPerSample ?? 1;
  // Cross-entropy over every row: `per` rows of outputs/per classes per sample.
  const { grad, loss } = data.loss === 'mse' ? refMse(fwd.outputs.at(-1)!, labels) : refLoss(fwd.outputs.at(-1)!, labels, samples.length * per, outputs / per);
  return { grad: Float32Array.from(flatGrads(refBackward(layers, weights, fwd, grad, samples.length).grads)), loss };
}

/**
 * Mini-batch training of the whole model: each step takes one batch's gradient (the mean loss
 * over all its samples, in one pass) and one optimizer step. Returns the final weights.
 */
export function referenceMiniBatch(layers: readonly LayerSpec[], initial: RefPartWeights, config: RefConfig, data: RefData, batches: readonly (readonly number[])[]): RefPartWeights {
  const opt = new ReferenceOptimizer(config, flatten(initial));
  for (const samples of batches) opt.step(meanGradient(layers, unflatten(opt.w, initial), data, samples));
  return unflatten(opt.w, initial);
}

/**
 * N parallel pipelines coupled by data parallelism, as one model: in each round pipeline p takes
 * the p-th share of the round's samples and computes the mean-loss gradient at the weights its
 * forward reads (the predicted ones from the second round on with `readsPredicted`, as
 * DataParallelTrainer's forwardWeights); the N gradients are averaged in fp32 as the all-reduce
 * does, and applied at once (staleness 0) or one round late (staleness 1, the last round's left
 * in flight). Returns the final real weights.
 */
export function referenceParallelPipelines(
  layers: readonly LayerSpec[],
  initial: RefPartWeights,
  config: RefConfig,
  data: RefData,
  rounds: readonly (readonly number[])[],
  pipelines: number,
  staleness: 0 | 1,
  readsPredicted: boolean,
): RefPartWeights {
  const gradient = (w: Float32Array, samples: readonly number[]): { grad: Float32Array; loss: number } => ({ grad: meanGradient(layers, unflatten(w, initial), data, samples), loss: NaN });
  return unflatten(referenceParallelPipelinesOf(flatten(initial), config, rounds, pipelines, staleness, readsPredicted, gradient).weights, initial);
}

/**
 * {@link referenceParallelPipelines} over flat weights, for any model: `gradient(weights, samples)`
 * is the model's mean-loss gradient over `samples` at `weights` (flat, in any fixed layout: the
 * optimizer's compensation and prediction are per element) and that loss. Returns the final real
 * weights and, per round, the mean of the pipelines' losses at the weights their forwards read.
 */
export function referenceParallelPipelinesOf(
  initial: Float32Array,
  config: RefConfig,
  rounds: readonly (readonly number[])[],
  pipelines: number,
  staleness: 0 | 1,
  readsPredicted: boolean,
  gradient: (weights: Float32Array, samples: readonly number[]) => { grad: Float32Array; loss: number },
): { weights: Float32Array; losses: number[] } {
  const opt = new ReferenceOptimizer(config, initial);
  const losses: number[] = [];
  let pending: Float32Array | undefined;
  rounds.forEach((samples, r) => {
    const weights = Float32Array.from(readsPredicted && r > 0 ? opt.predicted : opt.w);
    const share = samples.length / pipelines;
    const results = Array.from({ length: pipelines }, (_, p) => gradient(weights, samples.slice(p * share, (p + 1) * share)));
    losses.push(results.reduce((sum, g) => sum + g.loss, 0) / pipelines);
    const avg = new Float32Array(results[0]!.grad.length);
    for (let i = 0; i < avg.length; i++) {
      let sum = 0;
      for (const { grad } of results) sum = Math.fround(sum + grad[i]!);
      avg[i] = Math.fround(sum * Math.fround(1 / pipelines));
    }
    if (staleness === 0) opt.step(avg);
    else {
      if (pending) opt.step(pending);
      pending = avg;
    }
  });
  return { weights: Float32Array.from(opt.w), losses };
}

/**
 * AvgPipe's N pipelines as N models coupled by elastic averaging (ALGORITHMS.md section 5): in each
 * round pipeline p takes the p-th share of the samples, computes the mean-loss gradient at its own
 * weights x_p and steps its own optimizer; after every `every`-th round, with the center c as it
 * was, d_p = alpha*(x_p - c), x_p -= d_p for every p, and c += sum_p d_p. Returns the center.
 */
export function referenceAvgPipe(
  layers: readonly LayerSpec[],
  initial: RefPartWeights,
  config: RefConfig,
  data: RefData,
  rounds: readonly (readonly number[])[],
  pipelines: number,
  alpha: number,
  every: number,
): RefPartWeights {
  const opts = Array.from({ length: pipelines }, () => new ReferenceOptimizer(config, flatten(initial)));
  const center = Float64Array.from(flatten(initial));
  rounds.forEach((samples, r) => {
    const share = samples.length / pipelines;
    opts.forEach((opt, p) => opt.step(meanGradient(layers, unflatten(opt.w, initial), data, samples.slice(p * share, (p + 1) * share))));
    if ((r + 1) % every !== 0) return;
    const moved = new Float64Array(center.length);
    for (const opt of opts)
      for (let i = 0; i < center.length; i++) {
        const d = alpha * (opt.w[i]! - center[i]!);
        opt.w[i] = opt.w[i]! - d;
        moved[i] = moved[i]! + d;
      }
    for (let i = 0; i < center.length; i++) center[i] = center[i]! + moved[i]!;
  });
  return unflatten(Float32Array.from(center), initial);
}

/** One part of the model in the replay. */
export interface RefPart {
  layers: readonly LayerSpec[];
  initial: RefPartWeights;
  config: RefConfig;
  /** SpecTrain: the backward prediction's share of the forward one (0: none). */
  backwardRatio: number;
}

/** A compute action's read, as the replay derived it from the action list. */
export interface RefRead {
  round: number;
  kind: 'forward' | 'backward';
  part: number;
  microBatch: number;
  version: number;
  predicted: boolean;
}

/**
 * Replays `rounds` passes of an asynchronous (or synchronous) schedule single-process. Every
 * forward and backward reads the version its action names (`version`, or the part's step count
 * where it stands in its stage's list, counted from the start of training), or the prediction
 * made at that version when a `predictWeights` precedes it; every optimizer step applies the mean
 * of the gradients accumulated since the previous one. Computations are done on demand in
 * dependency order (a step needs its gradients, a gradient its forward and the next part's
 * backward), which a valid schedule makes acyclic.
 */
export function replaySchedule(
  schedule: Schedule,
  parts: readonly RefPart[],
  data: RefData,
  samplesOf: (round: number, microBatch: number) => readonly number[],
  rounds: number,
): { weights: RefPartWeights[]; reads: RefRead[]; losses: number[][] } {
  const P = schedule.parts;
  const opts = parts.map((p) => new ReferenceOptimizer({ ...p.config }, flatten(p.initial)));
  // history[j][v]: weights, and the prediction made at version v (before any step: the weights)
  const history = parts.map((p) => [{ w: flatten(p.initial), predicted: flatten(p.initial) }]);
  const classes = (parts[P - 1]!.layers.filter((l) => l.kind === 'linear').at(-1) as { out: number }).out;
  const reads: RefRead[] = [];
  const losses: number[][] = [];
  let base = parts.map(() => 0);

  for (let round = 0; round < rounds; round++) {
    // Derive, from the action lists, each read and each step's gradients.
    const readF = new Map<string, { version: number; predicted: boolean }>();
    const readB = new Map<string, { version: number; predicted: boolean }>();
    const stepGrads: number[][][] = parts.map(() => []); // [part][step in round] -> micro-batches
    for (const row of schedule.actions) {
      const count = new Map<number, number>();
      const pending = new Map<number, number[]>();
      const predicted = new Set<string>();
      for (const a of row as readonly Action[]) {
        const c = count.get(a.part) ?? 0;
        const key = `${a.part}:${a.microBatch}`;
        if (a.kind === 'predictWeights') predicted.add(key);
        else if (a.kind === 'forward' || a.kind === 'backward') {
          const read = { version: base[a.part]! + (a.version >= 0 ? a.version : c), predicted: predicted.delete(key) };
          (a.kind === 'forward' ? readF : readB).set(key, read);
          if (a.kind === 'backward') pending.set(a.part, [...(pending.get(a.part) ?? []), a.microBatch]);
        } else if (a.kind === 'optimizerStep') {
          stepGrads[a.part]!.push(pending.get(a.part) ?? []);
          pending.set(a.part, []);
          count.set(a.part, c + 1);
        }
      }
    }
    const weightsAt = (j: number, v: number, pass: 'forward' | 'backward', predicted: boolean): RefPartWeights => {
      while (history[j]!.length <= v) applyStep(j, history[j]!.length - 1);
      const h = history[j]![v]!;
      // An optimizer without prediction forwards its current weights, whatever the schedule asks.
      if (!predicted || parts[j]!.config.prediction === undefined) return unflatten(h.w, parts[j]!.initial);
      if (pass === 'forward') return unflatten(h.predicted, parts[j]!.initial);
      const r = parts[j]!.backwardRatio;
      return unflatten(
        h.w.map((w, i) => Math.fround(Math.fround(h.predicted[i]! * r) + Math.fround(w * (1 - r)))),
        parts[j]!.initial,
      );
    };
    const fwdMemo = new Map<string, RefForward>();
    const bwdMemo = new Map<string, { grads: Float64Array; dx: Float64Array }>();
    const roundLosses: number[] = [];
    const forward = (j: number, m: number): RefForward => {
      const key = `${j}:${m}`;
      let f = fwdMemo.get(key);
      if (f) return f;
      const read = readF.get(key)!;
      const input = j === 0 ? gather(data, samplesOf(round, m)).x : forward(j - 1, m).outputs.at(-1)!;
      f = refForward(parts[j]!.layers, weightsAt(j, read.version, 'forward', read.predicted), input, data.batch);
      reads.push({ round, kind: 'forward', part: j, microBatch: m, ...read });
      fwdMemo.set(key, f);
      return f;
    };
    const backward = (j: number, m: number): { grads: Float64Array; dx: Float64Array } => {
      const key = `${j}:${m}`;
      let b = bwdMemo.get(key);
      if (b) return b;
      const f = forward(j, m);
      let dy: Float64Array;
      if (j === P - 1) {
        const { loss, grad } = refLoss(f.outputs.at(-1)!, gather(data, samplesOf(round, m)).labels, data.batch, classes);
        roundLosses[m] = loss;
        dy = grad;
      } else dy = backward(j + 1, m).dx;
      const read = readB.get(key)!;
      const r = refBackward(parts[j]!.layers, weightsAt(j, read.version, 'backward', read.predicted), f, dy, data.batch);
      reads.push({ round, kind: 'backward', part: j, microBatch: m, ...read });
      b = { grads: flatGrads(r.grads), dx: r.dx };
      bwdMemo.set(key, b);
      return b;
    };
    const applyStep = (j: number, v: number): void => {
      const u = v - base[j]!;
      const list = stepGrads[j]![u];
      if (list === undefined) throw new Error(`replay: part ${j} has no step ${u} in round ${round}`);
      const sum = new Float64Array(history[j]![0]!.w.length);
      for (const m of list) backward(j, m).grads.forEach((g, i) => (sum[i]! += g));
      const opt = opts[j]!;
      opt.cfg.gradScale = list.length > 0 ? 1 / list.length : 1;
      if (list.length > 0) opt.step(Float32Array.from(sum));
      history[j]!.push({ w: opt.w.slice(), predicted: opt.predicted.slice() });
    };
    // Every step of the round, then every micro-batch's backward (gradients never applied in this round still run).
    for (let j = 0; j < P; j++) for (let u = 0; u < stepGrads[j]!.length; u++) weightsAt(j, base[j]! + u + 1, 'forward', false);
    for (let m = 0; m < schedule.microBatches; m++) backward(0, m);
    losses.push(roundLosses);
    base = base.map((b, j) => b + stepGrads[j]!.length);
  }
  return { weights: history.map((h, j) => unflatten(h[h.length - 1]!.w, parts[j]!.initial)), reads, losses };
}
