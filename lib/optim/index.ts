export { NON_FINITE_WARNING_STEPS, Optimizer, type OptimizerKindName, type StepInputs, type StepResult, type OptimizerState, type StateBufferName } from './optimizer.js';
export { SGD, type SGDOptions } from './sgd.js';
export { Adam, AdamW, type AdamOptions } from './adam.js';
export { OPTIMIZERS, OPTIMIZER_KINDS, createOptimizer, type OptimizerDescriptor, type OptimizerSpec, type OptimizerSpecWithout } from './registry.js';
export {
  DC_LAMBDA_MAX,
  DEFAULT_DC_EPS,
  DEFAULT_DC_LAMBDA,
  GRADIENT_ESTIMATES,
  pipelinedBackpropDelay,
  pipelinedBackpropScaling,
  type SmallBatchHyperparameters,
  type CommonOptimizerOptions,
  type CompensationOptions,
  type GradientEstimate,
  type PredictionOptions,
  type SapipePrediction,
  type PipeOptimPrediction,
  type SpecTrainPrediction,
  type LinearPrediction,
} from './options.js';
export {
  LrScheduler,
  linearWarmup,
  cosineDecay,
  stepDecay,
  sequential,
  product,
  type LrSchedule,
  type LrTarget,
  type LrSchedulerOptions,
  type LrSchedulerState,
} from './lr-schedule.js';
