/** Small reference models on the native kernels (CPU or CUDA), for examples, tests and benchmarks. */
export { sgemm, type GemmOptions } from './gemm.js';
export {
  add,
  attention,
  attentionGrad,
  biasAdd,
  biasGrad,
  conv2d,
  conv2dGrad,
  conv2dOutputSize,
  dropout,
  embedding,
  embeddingGrad,
  gelu,
  geluGrad,
  layerNorm,
  layerNormGrad,
  modelDevice,
  pool2d,
  pool2dGrad,
  relu,
  reluGrad,
  softmaxXent,
  MAX_HEAD_DIM,
  type AttentionGrads,
  type AttentionOutputs,
  type AttentionShape,
  type Conv2dGrads,
  type Conv2dShape,
  type Device,
  type DropoutOptions,
  type EmbeddingGrads,
  type EmbeddingShape,
  type LayerNormGrads,
  type LayerNormOutputs,
  type ModelDevice,
  type Pool2dShape,
  type PoolMode,
  type SoftmaxXentOutputs,
  type Tensor,
  type TensorView,
} from './ops.js';
export { Linear, type MatrixRef } from './linear.js';
export { reluForward, reluBackward } from './relu.js';
export { softmaxCrossEntropy } from './softmax-cross-entropy.js';
export { MLP, type MLPOptions } from './mlp.js';
export { kaimingUniform, biasUniform } from './init.js';
export { Sequential, balancedBoundaries, checkLayers, cnnLayers, layerParams, mlpLayers, partRanges, type CnnLayersOptions, type LayerSpec, type PoolLayerSpec, type SequentialOptions, type TransformerBlockSpec } from './sequential.js';
export { gptLayers, tokenCrossEntropy, type GptOptions } from './gpt.js';
export type { StageBackwardOptions, StageModel } from './stage-model.js';
export { rocAuc } from './metrics.js';
export type { GradientListener, ReportsGradients } from './gradient-listener.js';
