/**
 * Measured runs in the simulator's terms: a round's measured timeline as a {@link SimulationResult}
 * (so the same renderer draws it beside the simulated one), the per-part costs the runtime
 * measured as {@link SimulationCosts} (to ask the simulator what it predicts for them), and the
 * per-layer costs that balance a cut.
 */
import { InvalidArgumentError } from '../../errors.js';
import { FlatBuffer } from '../../tensor.js';
import { Sequential, checkLayers, type LayerSpec } from '../../nn/sequential.js';
import { checkInteger, checkOptions, describeValue } from '../../validate.js';
import { type PipelineProfile, profileStages } from '../profile.js';
import type { Schedule } from '../schedule.js';
import { type SimulationCosts, type SimulationResult } from '../simulate.js';
import type { TimedAction } from '../timeline.js';
import type { ScheduleAnalysis } from '../validate.js';

/** @internal Kinds that occupy a stage's thread with work (receives and all-reduces wait, sends are posted and return). */
export const WORK_KINDS: ReadonlySet<string> = new Set(['forward', 'backward', 'weightGrad', 'optimizerStep', 'predictWeights', 'stashWeights', 'restoreWeights', 'elasticAverage']);

/**
 * A measured timeline as a simulation result: makespan, busy time (work actions only; waiting in
 * a receive is idle), bubble fraction and throughput computed as the simulator computes them.
 * Memory, when given (a {@link RoundReport}'s per-stage figures): `peakActivationBytes` as
 * measured, and `peakMemoryBytes` as their sum with the stage's model bytes and stashed copies (a
 * bound: the two peaks need not coincide). Empty otherwise.
 *
 * @category Pipeline runtime
 */
export function measuredResult(
  schedule: Schedule,
  analysis: ScheduleAnalysis,
  timeline: readonly (readonly TimedAction[])[],
  memory?: { peakActivationBytes: readonly number[]; peakStashedBytes: readonly number[]; modelBytes: readonly number[] },
): SimulationResult {
  checkSchedule(schedule, 'measuredResult(schedule, analysis, timeline)');
  if (analysis === null || typeof analysis !== 'object') throw new InvalidArgumentError('measuredResult: pass the analysis validateSchedule() returns');
  checkTimeline(timeline, schedule.stages, 'measuredResult');
  const perStage = (key: 'peakActivationBytes' | 'peakStashedBytes' | 'modelBytes'): readonly number[] => {
    const v = memory?.[key];
    if (memory === undefined) return [];
    if (!Array.isArray(v) || v.length !== schedule.stages || !v.every((x) => Number.isFinite(x) && x >= 0))
      throw new InvalidArgumentError(`measuredResult: memory.${key} must hold one byte count per stage (${schedule.stages}), as RoundReport gives them`);
    return v;
  };
  if (memory !== undefined && (memory === null || typeof memory !== 'object')) throw new InvalidArgumentError('measuredResult: memory must be a RoundReport\'s { peakActivationBytes, peakStashedBytes, modelBytes }, or left out');
  const activations = perStage('peakActivationBytes');
  const stashed = perStage('peakStashedBytes');
  const model = perStage('modelBytes');
  let origin = Infinity;
  for (const row of timeline) for (const t of row) origin = Math.min(origin, t.start);
  if (!Number.isFinite(origin)) origin = 0;
  const shifted = timeline.map((row) => row.map((t) => ({ ...t, start: t.start - origin, end: t.end - origin })));
  let makespan = 0;
  const busy = shifted.map((row) => {
    let sum = 0;
    for (const t of row) {
      makespan = Math.max(makespan, t.end);
      if (WORK_KINDS.has(t.action.kind)) sum += t.end - t.start;
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
    peakActivationBytes: activations.slice(),
    peakMemoryBytes: activations.map((a, k) => a + stashed[k]! + model[k]!),
  };
}

function checkSchedule(schedule: unknown, what: string): asserts schedule is Schedule {
  const s = schedule as Partial<Schedule> | null;
  if (s === null || typeof s !== 'object' || !Number.isInteger(s.stages) || !Number.isInteger(s.parts) || !Array.isArray(s.actions))
    throw new InvalidArgumentError(`${what}: pass a Schedule (from generateSchedule or createSchedule), got ${describeValue(schedule)}`);
}

function checkTimeline(timeline: unknown, stages: number, what: string): asserts timeline is readonly (readonly TimedAction[])[] {
  if (!Array.isArray(timeline) || timeline.length !== stages || !timeline.every(Array.isArray))
    throw new InvalidArgumentError(`${what}: pass one list of timed actions per stage (${stages}), as RoundReport.timeline holds, got ${describeValue(timeline)}`);
  for (const row of timeline as unknown[][])
    for (const t of row) {
      const x = t as Partial<TimedAction> | null;
      if (x === null || typeof x !== 'object' || typeof x.start !== 'number' || typeof x.end !== 'number' || x.action === null || typeof x.action !== 'object')
        throw new InvalidArgumentError(`${what}: every entry must be { action, start, end, index }, got ${describeValue(t)}`);
    }
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
  checkSchedule(schedule, 'measuredCosts(schedule, timelines)');
  if (!Array.isArray(timelines)) throw new InvalidArgumentError('measuredCosts: timelines must be an array of round timelines');
  for (const t of timelines) checkTimeline(t, schedule.stages, 'measuredCosts');
  if (extra === null || typeof extra !== 'object') throw new InvalidArgumentError('measuredCosts: extra must be simulator costs');
  const parts = schedule.parts;
  const by = (): number[][] => Array.from({ length: parts }, () => [] as number[]);
  const samples: Record<string, number[][]> = {
    forward: by(),
    backward: by(),
    weightGrad: by(),
    optimizerStep: by(),
    predictWeights: by(),
    elasticAverage: by(),
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
    elastic: per('elasticAverage'),
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
  checkLayers(layers, 'profileLayers(layers)');
  checkInteger(microBatchSize, 'profileLayers: microBatchSize', 1, 1 << 16);
  checkOptions(options, ['seed', 'repeats'], 'profileLayers(layers, microBatchSize, options)');
  if (options.seed !== undefined) checkInteger(options.seed, 'profileLayers: options.seed', 0, 2 ** 32 - 1);
  if (options.repeats !== undefined) checkInteger(options.repeats, 'profileLayers: options.repeats', 1, 1000);
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

/** Wavelet's data-parallel worker against plain data parallelism, from measured peaks: see {@link waveletMemory}. @category Pipeline runtime */
export interface WaveletMemory {
  /** Each wave's own peak stored activation bytes on the worker (tick, tock). */
  readonly waves: readonly [number, number];
  /** The worker's peak of both together (what it must hold). */
  readonly worker: number;
  /** `worker / (tick + tock)`: 1 where both waves' peaks coincide, 0.5 where each fills the other's trough. */
  readonly overlap: number;
  /** `worker / plain`: the worker's activation memory over plain data parallelism's at the same micro-batch. */
  readonly ratio: number;
  /**
   * The micro-batch per wave whose worker peak fits in plain data parallelism's measured peak
   * (stored activations scale linearly with the micro-batch): `floor(b x plain / worker)`. A wave
   * of it trains `2 x` that many samples per worker iteration, against plain's `b`.
   */
  readonly sameMemoryMicroBatch: number;
}

/**
 * Wavelet's data-parallel memory against plain data parallelism at the same micro-batch `b`, from
 * a {@link RoundReport}'s measured peaks: `waves` the worker's tick and tock peaks
 * (`replicaPeaks[x][i].peakActivationBytes`), `worker` its `peakActivationBytes[x]`, `plain` the
 * `peakActivationBytes` of one replica training on `b` samples per step (GPipe on 1 stage, 1
 * micro-batch). Stored activations are linear in the micro-batch for sapipe's layers, so the
 * larger batch that fits is derived from the bytes alone.
 *
 * @category Pipeline runtime
 */
export function waveletMemory(measured: { waves: readonly [number, number]; worker: number; plain: number; microBatchSize: number }): WaveletMemory {
  checkOptions(measured, ['waves', 'worker', 'plain', 'microBatchSize'], 'waveletMemory(measured)');
  const { waves, worker, plain } = measured;
  if (!Array.isArray(waves) || waves.length !== 2) throw new InvalidArgumentError(`waveletMemory: waves must be the tick and tock peaks [tick, tock], got ${describeValue(waves)}`);
  const [tick, tock] = waves.map((w, i) => checkInteger(w, `waveletMemory: waves[${i}]`, 1, Number.MAX_SAFE_INTEGER)) as [number, number];
  checkInteger(worker, 'waveletMemory: worker', Math.max(tick, tock), tick + tock);
  checkInteger(plain, 'waveletMemory: plain', 1, Number.MAX_SAFE_INTEGER);
  const b = checkInteger(measured.microBatchSize, 'waveletMemory: microBatchSize', 1, Number.MAX_SAFE_INTEGER);
  return { waves: [tick, tock], worker, overlap: worker / (tick + tock), ratio: worker / plain, sameMemoryMicroBatch: Math.floor((b * plain) / worker) };
}
