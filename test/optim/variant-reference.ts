/** Translates a native kernel configuration into the reference implementation's terms. */
import { CompensationKind, EstimateKind, OptimizerKind, PredictionKind, type NativeUpdateConfig } from '../../dist/native.js';
import type { RefConfig } from '../reference/optimizer.js';

export function referenceConfig(c: NativeUpdateConfig): RefConfig {
  const kind = c.optimizer === OptimizerKind.sgd ? 'sgd' : c.optimizer === OptimizerKind.adam ? 'adam' : 'adamw';
  const ref: RefConfig = {
    optimizer: kind,
    lr: c.lr,
    weightDecay: c.weightDecay ?? 0,
    momentum: c.momentum ?? 0,
    dampening: c.dampening ?? 0,
    nesterov: c.nesterov ?? false,
    beta1: c.beta1 ?? 0.9,
    beta2: c.beta2 ?? 0.999,
    eps: c.eps ?? 1e-8,
    gradScale: c.gradScale ?? 1,
  };
  if (c.spikeDelay !== undefined && c.spikeDelay >= 0) ref.spikeDelay = c.spikeDelay;
  if (c.compensation !== undefined && c.compensation !== CompensationKind.none)
    ref.compensation = {
      kind: c.compensation === CompensationKind.adaptive ? 'adaptive' : 'elementwise',
      lambda: c.compensationLambda ?? 0.2,
      eps: c.compensationEps ?? 1e-7,
    };
  if (c.prediction === PredictionKind.shadowStep) {
    const names = Object.keys(EstimateKind) as (keyof typeof EstimateKind)[];
    ref.prediction = {
      kind: 'shadow',
      estimate: names.find((n) => EstimateKind[n] === (c.estimate ?? 0))!,
      compensate: c.compensateEstimate ?? false,
      n: c.worldSize ?? 1,
      localScale: c.localGradScale ?? 1,
    };
  } else if (c.prediction === PredictionKind.linear) {
    ref.prediction = { kind: 'linear', steps: c.predictionSteps ?? 0 };
  }
  return ref;
}
