/**
 * The named variants of the fused update kernel: every optimizer with and without delay
 * compensation, each weight-prediction form, and spike compensation. `sapipe bench kernels` times
 * each; the tests check each against the reference implementation. A catalogue of kernel
 * configurations for measuring and checking, not part of the library: training code configures
 * the kernels through its optimizers.
 */
import type { OptimizerKindName } from 'sapipe';
import {
  CompensationKind,
  EstimateKind,
  OptimizerKind,
  PredictionKind,
  type NativeBufferHandle,
  type NativeUpdateBuffers,
  type NativeUpdateConfig,
} from 'sapipe/kernels';

export interface KernelVariant {
  name: string;
  config: NativeUpdateConfig;
}

const sgd: NativeUpdateConfig = { optimizer: OptimizerKind.sgd, lr: 0.01, weightDecay: 1e-4 };
const sgdMomentum: NativeUpdateConfig = { ...sgd, momentum: 0.9 };
const adam: NativeUpdateConfig = { optimizer: OptimizerKind.adam, lr: 1e-3, weightDecay: 1e-4, beta1: 0.9, beta2: 0.999, eps: 1e-8 };
const adamw: NativeUpdateConfig = { ...adam, optimizer: OptimizerKind.adamw, weightDecay: 1e-2 };
const dc: Partial<NativeUpdateConfig> = { compensation: CompensationKind.elementwise, compensationLambda: 0.2 };
const dcAdaptive: Partial<NativeUpdateConfig> = { compensation: CompensationKind.adaptive, compensationLambda: 0.2, compensationEps: 1e-7 };
const wp = (estimate: keyof typeof EstimateKind, extra: Partial<NativeUpdateConfig> = {}): Partial<NativeUpdateConfig> => ({
  prediction: PredictionKind.shadowStep,
  estimate: EstimateKind[estimate],
  worldSize: 4,
  ...extra,
});
const linear = (steps: number): Partial<NativeUpdateConfig> => ({ prediction: PredictionKind.linear, predictionSteps: steps });

/**
 * Every variant, by name. native/tests/variants.cpp holds the same list for the C++ harnesses
 * (names, order and settings); test/native/lists.test.ts fails when the two drift.
 */
export const KERNEL_VARIANTS: readonly KernelVariant[] = [
  { name: 'sgd', config: sgd },
  { name: 'sgd-momentum', config: sgdMomentum },
  { name: 'sgd-nesterov', config: { ...sgdMomentum, nesterov: true } },
  { name: 'sgd-momentum-dampening', config: { ...sgdMomentum, dampening: 0.1 } },
  { name: 'adam', config: adam },
  { name: 'adamw', config: adamw },
  { name: 'adam-grad-scale', config: { ...adam, gradScale: 0.25 } },
  { name: 'sgd-momentum+dc', config: { ...sgdMomentum, ...dc } },
  { name: 'sgd-momentum+dc-adaptive', config: { ...sgdMomentum, ...dcAdaptive } },
  { name: 'adam+dc', config: { ...adam, ...dc } },
  { name: 'adamw+dc-adaptive', config: { ...adamw, ...dcAdaptive } },
  { name: 'sgd+wp-prev-sync', config: { ...sgd, ...wp('prev-sync') } },
  { name: 'sgd-momentum+wp-local', config: { ...sgdMomentum, ...wp('local') } },
  { name: 'sgd-momentum+wp-prev-sync', config: { ...sgdMomentum, ...wp('prev-sync') } },
  { name: 'sgd-momentum+wp-local-prev-sync', config: { ...sgdMomentum, ...wp('local-prev-sync') } },
  { name: 'sgd-nesterov+wp-local', config: { ...sgdMomentum, nesterov: true, ...wp('local') } },
  { name: 'adam+wp-local', config: { ...adam, ...wp('local') } },
  { name: 'adam+wp-prev-sync', config: { ...adam, ...wp('prev-sync') } },
  { name: 'adamw+wp-local-prev-sync', config: { ...adamw, ...wp('local-prev-sync') } },
  { name: 'sgd-momentum+dc+wp-local-prev-sync-dc', config: { ...sgdMomentum, ...dc, ...wp('local-prev-sync', { compensateEstimate: true }) } },
  { name: 'adam+dc+wp-local-dc', config: { ...adam, ...dc, ...wp('local', { compensateEstimate: true }) } },
  { name: 'adamw+dc-adaptive+wp-prev-sync-dc', config: { ...adamw, ...dcAdaptive, ...wp('prev-sync', { compensateEstimate: true }) } },
  { name: 'sgd+linear', config: { ...sgd, ...linear(2) } },
  { name: 'sgd-momentum+pipeoptim', config: { ...sgdMomentum, ...linear(3) } },
  { name: 'adam+pipeoptim', config: { ...adam, ...linear(3) } },
  { name: 'adamw+pipeoptim', config: { ...adamw, ...linear(3) } },
  { name: 'sgd-spike', config: { ...sgdMomentum, spikeDelay: 5 } },
  { name: 'sgd-spike+lwp', config: { ...sgdMomentum, spikeDelay: 5, ...linear(5) } },
  { name: 'sgd-spike+wp-local', config: { ...sgdMomentum, spikeDelay: 2, ...wp('local') } },
];

/**
 * The state buffers each optimizer's kernel reads, as native/core/update_plan.cpp's traits table
 * says (the compiler asks for a row per kind).
 */
const OPTIMIZER_STATE: Record<OptimizerKindName, (config: NativeUpdateConfig) => (keyof NativeUpdateBuffers)[]> = {
  sgd: (config) => ((config.momentum ?? 0) !== 0 ? ['momentum'] : []),
  adam: () => ['momentum', 'secondMoment'],
  adamw: () => ['momentum', 'secondMoment'],
};
const kindName = (config: NativeUpdateConfig): OptimizerKindName => {
  const name = (Object.keys(OptimizerKind) as OptimizerKindName[]).find((k) => OptimizerKind[k] === config.optimizer);
  if (name === undefined) throw new RangeError(`no optimizer has the native number ${config.optimizer}`);
  return name;
};

/** The buffers a configuration reads or writes, besides weights and grad. */
export function requiredBuffers(config: NativeUpdateConfig): (keyof NativeUpdateBuffers)[] {
  const names: (keyof NativeUpdateBuffers)[] = [...OPTIMIZER_STATE[kindName(config)](config)];
  if ((config.compensation ?? 0) !== CompensationKind.none) names.push('backup');
  if ((config.prediction ?? 0) !== PredictionKind.none) names.push('predicted');
  if (config.prediction === PredictionKind.shadowStep && config.estimate !== EstimateKind['prev-sync']) names.push('localGrad');
  if (config.prediction === PredictionKind.shadowStep && config.estimate === EstimateKind['local-prev-sync'])
    names.push('prevLocalGrad');
  return names;
}

/** Builds the buffer set of a configuration, allocating each buffer through `allocate`. */
export function allocateBuffers(config: NativeUpdateConfig, allocate: (name: string) => NativeBufferHandle): NativeUpdateBuffers {
  const buffers: NativeUpdateBuffers = { weights: allocate('weights'), grad: allocate('grad') };
  for (const name of requiredBuffers(config)) (buffers as unknown as Record<string, NativeBufferHandle>)[name] = allocate(name);
  return buffers;
}
