/**
 * Measured runs in the simulator's terms: a round's measured timeline as a {@link SimulationResult}
 * (so the same renderer draws it beside the simulated one), the per-part costs the runtime
 * measured as {@link SimulationCosts} (to ask the simulator what it predicts for them), and the
 * per-layer costs that balance a cut.
 */
import { FlatBuffer } from '../../tensor.js';
import { Sequential, type LayerSpec } from '../../nn/sequential.js';
import { type PipelineProfile, profileStages } from '../profile.js';
import type { Schedule } from '../schedule.js';
import { type SimulationCosts, type SimulationResult } from '../simulate.js';
import type { TimedAction } from '../timeline.js';
import type { ScheduleAnalysis } from '../validate.js';

/** Kinds that occupy a stage's thread with work (receives wait, sends are posted and return). */
const WORK: ReadonlySet<string> = new Set(['forward', 'backward', 'weightGrad', 'optimizerStep', 'predictWeights', 'stashWeights', 'restoreWeights']);

/**
 * A measured timeline as a simulation result: makespan, busy time (work actions only; waiting in
 * a receive is idle), bubble fraction and throughput computed as the simulator computes them.
 * Peak memory is left at the activations count times `activationBytes` when given.
 *
 * @category Pipeline runtime
 */
export function measuredResult(
  schedule: Schedule,
  analysis: ScheduleAnalysis,
  timeline: readonly (readonly TimedAction[])[],
  peakActivations: readonly number[] = [],
): SimulationResult {
  let origin = Infinity;
  for (const row of timeline) for (const t of row) origin = Math.min(origin, t.start);
  if (!Number.isFinite(origin)) origin = 0;
  const shifted = timeline.map((row) => row.map((t) => ({ ...t, start: t.start - origin, end: t.end - origin })));
  let makespan = 0;
  const busy = shifted.map((row) => {
    let sum = 0;
    for (const t of row) {
      makespan = Math.max(makespan, t.end);
      if (WORK.has(t.action.kind)) sum += t.end - t.start;
    }
    return sum;
  });
  const totalBusy = busy.reduce((a, b) => a + b, 0);
  return {
    schedule,
    analysis,
    timeline: shifted,
    makespan,
    busy,
    bubbleFraction: makespan > 0 ? 1 - totalBusy / (schedule.stages * makespan) : 0,
    throughput: makespan > 0 ? (schedule.pipelines * schedule.microBatches) / makespan : Infinity,
    peakActivationBytes: peakActivations.slice(),
    peakMemoryBytes: peakActivations.slice(),
  };
}

const median = (values: number[]): number => {
  if (values.length === 0) return 0;
  const sorted = [...values].sort((a, b) => a - b);
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2;
};

/**
 * The per-part costs measured in one or more rounds (median duration of each kind of action per
 * part), as simulator costs in milliseconds. Transfers are taken as free (threads of one process
 * share memory); pass `p2pLatency`/`p2pBandwidth` in `extra` for a network.
 *
 * @category Pipeline runtime
 */
export function measuredCosts(schedule: Schedule, timelines: readonly (readonly (readonly TimedAction[])[])[], extra: SimulationCosts = {}): SimulationCosts {
  const parts = schedule.parts;
  const by = (): number[][] => Array.from({ length: parts }, () => [] as number[]);
  const samples: Record<string, number[][]> = {
    forward: by(),
    backward: by(),
    weightGrad: by(),
    optimizerStep: by(),
    predictWeights: by(),
  };
  for (const timeline of timelines)
    for (const row of timeline) for (const t of row) samples[t.action.kind]?.[t.action.part]?.push(t.end - t.start);
  const per = (kind: string): number[] => samples[kind]!.map(median);
  const forward = per('forward');
  const weightGrad = per('weightGrad');
  // A schedule that splits the backward (zero-bubble) measured B and W apart; the simulator's
  // `backward` is their sum and `weightGrad` the W share.
  const backward = per('backward').map((b, j) => b + weightGrad[j]!);
  return {
    forward,
    backward,
    weightGrad,
    optimizerStep: per('optimizerStep'),
    predict: per('predictWeights'),
    ...extra,
  };
}

/**
 * Per-layer forward + backward time of a sequential model at `microBatchSize` samples, measured
 * with {@link profileStages} (median of repeats after warm-up): the costs a balanced cut uses.
 *
 * @category Pipeline runtime
 */
export async function profileLayers(layers: readonly LayerSpec[], microBatchSize: number, options: { seed?: number; repeats?: number } = {}): Promise<{ costs: number[]; profile: PipelineProfile }> {
  const models = layers.map((_, i) => new Sequential(layers, { seed: options.seed ?? 0, range: [i, i + 1] }));
  const buffers: FlatBuffer[] = [];
  try {
    const stages = models.map((model, i) => {
      const input = FlatBuffer.allocate(microBatchSize * model.inputSize);
      const gradOutput = FlatBuffer.allocate(microBatchSize * model.outputSize);
      buffers.push(input, gradOutput);
      input.array.fill(0.5);
      gradOutput.array.fill(0.01);
      // profileStages times every forward first, then every backward: each forward keeps its own
      // slot and each backward consumes the oldest, so neither timing includes the other pass.
      let nextForward = 0;
      let nextBackward = 0;
      return {
        forward: (): void => {
          model.forward(nextForward++, input, microBatchSize, model.params.weights);
        },
        backward: (): void => {
          if (nextBackward === nextForward) model.forward(nextForward++, input, microBatchSize, model.params.weights);
          const dx = model.backward(nextBackward++, gradOutput, { grads: model.params.grads, inputGrad: i > 0 });
          if (dx) model.recycle(dx);
        },
        activationBytes: microBatchSize * model.outputSize * 4,
        weightBytes: model.params.numParams * 4,
      };
    });
    const profile = await profileStages(stages, { microBatchSize, batchSize: microBatchSize, warmup: 2, repeats: options.repeats ?? 5 });
    return { costs: profile.stages.map((s) => s.forwardMs + s.backwardMs), profile };
  } finally {
    for (const b of buffers) b.dispose();
    for (const m of models) m.dispose();
  }
}
