/**
 * Shared set-up of the pipeline runtime tests: a small classification data set, the model, its
 * initial weights per part as the reference stores them, and the reference optimizer's config.
 */
import { Sequential, mlpLayers, type LayerSpec, type PipelineOptimizerSpec } from '../../dist/index.js';
import type { RefConfig } from '../reference/optimizer.js';
import type { RefPartWeights } from '../reference/pipeline.js';

export const FEATURES = 12;
export const CLASSES = 5;
export const LAYERS: LayerSpec[] = mlpLayers([FEATURES, 16, 16, 16, 16, CLASSES]); // 9 layers
export const SEED = 3;

/** `n` samples whose class shows in some features, so training has something to learn. */
export function dataset(n: number, seed = 7): { inputs: Float32Array; labels: Int32Array } {
  let s = seed >>> 0;
  const next = (): number => (s = (Math.imul(s, 1664525) + 1013904223) >>> 0) / 2 ** 32;
  const inputs = new Float32Array(n * FEATURES);
  const labels = new Int32Array(n);
  for (let i = 0; i < n; i++) {
    labels[i] = Math.floor(next() * CLASSES);
    for (let k = 0; k < FEATURES; k++) inputs[i * FEATURES + k] = next() * 2 - 1 + (k % CLASSES === labels[i] ? 1 : 0);
  }
  return { inputs, labels };
}

/** Evenly spread boundaries cutting `layers` layers into `parts` parts. */
export function evenBoundaries(layers: number, parts: number): number[] {
  return Array.from({ length: parts - 1 }, (_, i) => Math.round(((i + 1) * layers) / parts));
}

/** The layer ranges of a cut. */
export function ranges(layers: number, boundaries: readonly number[]): [number, number][] {
  const edges = [0, ...boundaries, layers];
  return edges.slice(1).map((e, i) => [edges[i]!, e]);
}

/**
 * A part's weights stored per layer: the initial ones as the library draws them, or those of `flat`
 * (a part's weights as the trainer returns them, in its ParamSet layout).
 */
export function partWeights(start: number, end: number, flat?: Float32Array): RefPartWeights {
  const model = new Sequential(LAYERS, { seed: SEED, range: [start, end] });
  try {
    if (flat) model.params.weights.array.set(flat);
    return LAYERS.slice(start, end).map((l, k) => {
      if (l.kind !== 'linear') return null;
      const i = start + k;
      return { w: model.params.view(model.params.weights, `layer${i}.weight`).slice(), b: model.params.view(model.params.weights, `layer${i}.bias`).slice() };
    });
  } finally {
    model.dispose();
  }
}
export const initialPart = (start: number, end: number): RefPartWeights => partWeights(start, end);
export const partFromTrainer = (start: number, end: number, flat: Float32Array): RefPartWeights => partWeights(start, end, flat);

/** The reference optimizer config of a spec, with a linear prediction of `steps` (or none). */
export function refConfig(spec: PipelineOptimizerSpec, steps?: number): RefConfig {
  const s = spec as { kind: 'sgd' | 'adam' | 'adamw'; lr: number; momentum?: number; weightDecay?: number; betas?: readonly [number, number]; eps?: number };
  return {
    optimizer: s.kind,
    lr: s.lr,
    weightDecay: s.weightDecay ?? 0,
    momentum: s.momentum ?? 0,
    dampening: 0,
    nesterov: false,
    beta1: s.betas?.[0] ?? 0.9,
    beta2: s.betas?.[1] ?? 0.999,
    eps: s.eps ?? 1e-8,
    gradScale: 1,
    ...(steps === undefined ? {} : { prediction: { kind: 'linear', steps } }),
  };
}

/** Largest absolute difference between two part weight lists, over every tensor. */
export function maxDiff(a: RefPartWeights, b: RefPartWeights): number {
  let worst = 0;
  a.forEach((l, i) => {
    if (!l) return;
    const m = b[i]!;
    for (let k = 0; k < l.w.length; k++) worst = Math.max(worst, Math.abs(l.w[k]! - m.w[k]!));
    for (let k = 0; k < l.b.length; k++) worst = Math.max(worst, Math.abs(l.b[k]! - m.b[k]!));
  });
  return worst;
}

/** Largest difference between the trainer's part weights (cut at `boundaries`) and a whole model's weights per layer. */
export function maxDiffToWhole(trainerParts: readonly Float32Array[], boundaries: readonly number[], whole: RefPartWeights): number {
  let worst = 0;
  ranges(LAYERS.length, boundaries).forEach(([s, e], j) => {
    worst = Math.max(worst, maxDiff(partFromTrainer(s, e, trainerParts[j]!), whole.slice(s, e)));
  });
  return worst;
}

/**
 * Largest difference between the trainer's part weights of any Sequential model (cut at
 * `boundaries`) and the whole model's flat weights `whole` (its ParamSet layout), tensor by
 * tensor by name: for models whose layers the per-layer reference above does not hold (a GPT).
 */
export function maxDiffByName(layers: readonly LayerSpec[], seed: number, boundaries: readonly number[], trainerParts: readonly Float32Array[], whole: Float32Array): number {
  const model = new Sequential(layers, { seed });
  let worst = 0;
  try {
    model.params.weights.array.set(whole);
    ranges(layers.length, boundaries).forEach(([s, e], j) => {
      const part = new Sequential(layers, { seed, range: [s, e] });
      try {
        part.params.weights.array.set(trainerParts[j]!);
        for (const name of part.params.names) {
          const theirs = model.params.view(model.params.weights, name);
          part.params.view(part.params.weights, name).forEach((v, k) => (worst = Math.max(worst, Math.abs(v - theirs[k]!))));
        }
      } finally {
        part.dispose();
      }
    });
  } finally {
    model.dispose();
  }
  return worst;
}
