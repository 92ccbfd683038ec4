/**
 * The network of `sapipe demo --tfjs`: a small convolutional network written in TensorFlow.js
 * layers (conv 3x3 x8, relu, 2x2 max-pool, dense 64, relu, dense 10) for the MNIST digits, built
 * whole for data-parallel training and for evaluation, or as the part of it one pipeline stage
 * holds. Seeded initializers make every rank, every part and tfjs's own training start from the
 * same weights. This module is also the pipeline's stage module (`createStage`), loaded by each
 * stage thread.
 *
 * TensorFlow.js is loaded when first needed (`@tensorflow/tfjs-node` when installed, for its
 * native kernels, else `@tensorflow/tfjs`), so the CLI runs without it until `--tfjs` is asked for.
 *
 * @internal
 */
import type * as TF from '@tensorflow/tfjs';

import { BackendUnavailableError, InvalidArgumentError } from 'sapipe';
import { describeValue } from 'sapipe/validate';

/** @internal */
export type Tf = typeof TF;

/** @internal The packages tried, in order: the native backend first. */
export const TFJS_PACKAGES = ['@tensorflow/tfjs-node', '@tensorflow/tfjs'] as const;

let loaded: Promise<Tf> | undefined;

/** @internal The TensorFlow.js namespace, or a BackendUnavailableError saying what to install. */
export function loadTfjs(): Promise<Tf> {
  loaded ??= (async () => {
    for (const name of TFJS_PACKAGES) {
      try {
        const tf = (await import(name)) as Tf;
        // Production mode: no per-thread "install the node backend" banner (the demo's table says which backend ran).
        tf.env().set('PROD', true);
        return tf;
      } catch (error) {
        if ((error as { code?: string }).code !== 'ERR_MODULE_NOT_FOUND') throw error;
      }
    }
    throw new BackendUnavailableError(`sapipe demo --tfjs needs TensorFlow.js, which is not installed: npm install @tensorflow/tfjs (or @tensorflow/tfjs-node)`);
  })();
  return loaded;
}

/** Input images: 28 x 28, one channel. */
export const CNN_INPUT_SHAPE = [28, 28, 1] as const;

/**
 * The layers, in order, and the first layer of each part for 2 and 3 stages: the cut keeps every
 * part's trainable weights non-empty (a stage must train something).
 */
const CNN_LAYERS = ['conv', 'pool', 'flatten', 'dense64', 'dense10'] as const;
/** @internal */
export const CNN_CUTS: Readonly<Record<number, readonly number[]>> = { 1: [0], 2: [0, 2], 3: [0, 2, 4] };
/** @internal */
export const CNN_MAX_STAGES = 3;

function layer(tf: Tf, name: (typeof CNN_LAYERS)[number], seed: number, first: boolean): TF.layers.Layer {
  const input = first ? { inputShape: inputShapeOf(name) } : {};
  switch (name) {
    case 'conv':
      return tf.layers.conv2d({ ...input, filters: 8, kernelSize: 3, activation: 'relu', kernelInitializer: tf.initializers.heNormal({ seed }) });
    case 'pool':
      return tf.layers.maxPooling2d({ ...input, poolSize: 2 });
    case 'flatten':
      return tf.layers.flatten(input);
    case 'dense64':
      return tf.layers.dense({ ...input, units: 64, activation: 'relu', kernelInitializer: tf.initializers.heNormal({ seed: seed + 1 }) });
    case 'dense10':
      return tf.layers.dense({ ...input, units: 10, kernelInitializer: tf.initializers.glorotUniform({ seed: seed + 2 }) });
  }
}

/** The shape of one sample entering layer `name` (what a part starting there takes). */
function inputShapeOf(name: (typeof CNN_LAYERS)[number]): number[] {
  switch (name) {
    case 'conv':
      return [...CNN_INPUT_SHAPE];
    case 'pool':
      return [26, 26, 8];
    case 'flatten':
      return [13, 13, 8];
    case 'dense64':
      return [13 * 13 * 8];
    case 'dense10':
      return [64];
  }
}

/** @internal The CNN, or part `part` of it cut into `parts` (a whole model's layers `[start, end)`). */
export function mnistCnn(tf: Tf, seed: number, part = 0, parts = 1): TF.Sequential {
  const cuts = CNN_CUTS[parts];
  if (cuts === undefined || !Number.isInteger(part) || part < 0 || part >= parts)
    throw new InvalidArgumentError(`the demo's CNN cuts into 1 to ${CNN_MAX_STAGES} parts, got part ${describeValue(part)} of ${describeValue(parts)}`);
  const start = cuts[part]!;
  const end = cuts[part + 1] ?? CNN_LAYERS.length;
  return tf.sequential({ layers: CNN_LAYERS.slice(start, end).map((name, i) => layer(tf, name, seed, i === 0)) });
}

/**
 * The stage module's entry (PipelineTrainer's `model: { module, options: { seed } }`): part
 * `part` of the CNN as a TfjsStage.
 */
export async function createStage(part: number, parts: number, options: { seed: number }): Promise<import('sapipe').StageModel> {
  const tf = await loadTfjs();
  const { TfjsStage } = await import('sapipe/tfjs');
  return new TfjsStage(tf, mnistCnn(tf, options.seed, part, parts));
}

/** @internal Test accuracy of `models` applied one after another (a whole CNN, or its parts in order). */
export function cnnAccuracy(tf: Tf, models: readonly TF.LayersModel[], inputs: Float32Array, labels: Uint8Array): number {
  const CHUNK = 500;
  let correct = 0;
  for (let at = 0; at < labels.length; at += CHUNK) {
    const n = Math.min(CHUNK, labels.length - at);
    const predicted = tf.tidy(() => {
      let y: TF.Tensor = tf.tensor4d(inputs.subarray(at * 784, (at + n) * 784), [n, ...CNN_INPUT_SHAPE]);
      for (const m of models) y = m.apply(y) as TF.Tensor;
      return tf.argMax(y, -1);
    });
    const p = predicted.dataSync();
    predicted.dispose();
    for (let i = 0; i < n; i++) if (p[i] === labels[at + i]) correct++;
  }
  return correct / labels.length;
}

/** @internal Disposes a model's weights (tfjs keeps them until told). */
export function disposeModel(tf: Tf, model: TF.LayersModel): void {
  tf.dispose(model.weights.map((w) => w.read()));
}
