/**
 * What each schedule asks of a stage's weights beyond the current version: which schedules the
 * runtime executes, and the weight prediction (docs/ALGORITHMS.md section 3) and spike
 * compensation (section 4) each one's optimizer is built with. The schedule says *when* a pass reads predicted weights (a `predictWeights`
 * action before it) and *which* version it reads (`version`); this table says *how far ahead* the
 * prediction looks, which the action list does not carry.
 */
import { pipelinedBackpropDelay, type PredictionOptions } from '../../optim/options.js';

/**
 * The schedules the pipeline runtime executes (Wavelet in its model-parallel form; SAPipe's
 * data-parallel schedule and Wavelet's data-parallel form, which hold two replicas of the model
 * per worker, are planned). @category Pipeline runtime
 */
export const RUNTIME_SCHEDULES = ['gpipe', '1f1b', 'interleaved-1f1b', 'zb-h1', 'pipedream', 'pipedream-2bw', 'pipeoptim', 'spectrain', 'pipelined-backprop', 'avgpipe', 'wavelet'] as const;
/** @category Pipeline runtime */
export type RuntimeScheduleName = (typeof RUNTIME_SCHEDULES)[number];

/** @internal
 * The prediction the optimizer of part `part` of `parts` is built with, or undefined. PipeOptim's
 * forward reads `s = S-k-1` updates ahead; SpecTrain's forward `floor(k/2) + S-k-1` (the
 * optimizer's predicted buffer) and its backward `floor(k/2)` (see {@link backwardPredictionRatio}).
 */
export function predictionFor(schedule: string, part: number, parts: number): PredictionOptions | undefined {
  if (schedule === 'pipeoptim') return { kind: 'pipeoptim', stage: part, stages: parts };
  if (schedule === 'spectrain') return { kind: 'spectrain', stage: part, stages: parts, pass: 'forward' };
  if (schedule === 'pipelined-backprop') return { kind: 'linear', steps: pipelinedBackpropDelay(part, parts) };
  return undefined;
}

/**
 * @internal Pipelined Backpropagation's spike compensation: part k's gradients arrive
 * `D_k = 2(S-k)-1` updates late, and its SGD-momentum step compensates for exactly that delay
 * (ALGORITHMS.md section 4; with the linear prediction above, "SC+LWP").
 */
export function spikeDelayFor(schedule: string, part: number, parts: number): number | undefined {
  return schedule === 'pipelined-backprop' ? pipelinedBackpropDelay(part, parts) : undefined;
}

/** @internal
 * SpecTrain's backward prediction as a share of its forward one: both are `w - lr*s*D` with the
 * same `D`, so `w_b = w + (s_b/s_f) * (w_f - w)` is computed from the optimizer's fused forward
 * prediction with two native passes and no second prediction kernel. Exact for SGD-momentum and
 * Adam; AdamW's decay factor `(1-lr*wd)^s` is not linear in s, so SpecTrain with AdamW and weight
 * decay is refused before the run.
 */
export function backwardPredictionRatio(schedule: string, part: number, parts: number): number {
  if (schedule !== 'spectrain') return 0;
  const half = Math.floor(part / 2);
  const forward = half + parts - part - 1;
  return forward === 0 ? 0 : half / forward;
}
