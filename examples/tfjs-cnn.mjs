// The small convolutional network of examples/tfjs-mnist.mjs, in TensorFlow.js layers, whole or
// cut into pipeline stages. Seeded initializers: every worker, and the parts of a cut network,
// start from the same weights. `createStage` makes this file a stage module for sapipe's
// PipelineTrainer (`model: { module: <this file> }`): part k of the network as a TfjsStage.
import * as tf from '@tensorflow/tfjs';

import { TfjsStage } from '../dist/tfjs/index.js';

tf.env().set('PROD', true); // no "install the node backend" banner from every thread

// Each layer from the shape of one sample entering it (given to the first layer of a part).
const LAYERS = [
  [[28, 28, 1], (input) => tf.layers.conv2d({ ...input, filters: 8, kernelSize: 3, activation: 'relu', kernelInitializer: tf.initializers.heNormal({ seed: 1 }) })],
  [[26, 26, 8], (input) => tf.layers.maxPooling2d({ ...input, poolSize: 2 })],
  [[13, 13, 8], (input) => tf.layers.flatten(input)],
  [[1352], (input) => tf.layers.dense({ ...input, units: 64, activation: 'relu', kernelInitializer: tf.initializers.heNormal({ seed: 2 }) })],
  [[64], (input) => tf.layers.dense({ ...input, units: 10, kernelInitializer: tf.initializers.glorotUniform({ seed: 3 }) })],
];
// The first layer of each stage, for 1, 2 or 3 stages: every stage holds a trainable layer.
const CUTS = { 1: [0], 2: [0, 2], 3: [0, 2, 4] };

/** The network (parts = 1), or stage `part` of it cut into `parts` stages. */
export function cnn(part = 0, parts = 1) {
  const start = CUTS[parts][part];
  const end = CUTS[parts][part + 1] ?? LAYERS.length;
  return tf.sequential({ layers: LAYERS.slice(start, end).map(([inputShape, make], i) => make(i === 0 ? { inputShape } : {})) });
}

export function createStage(part, parts) {
  return new TfjsStage(tf, cnn(part, parts));
}
