/**
 * The AvgPipe tuner: searches the number of parallel pipelines N, micro-batches M and advance A
 * for the best simulated throughput whose peak memory fits every stage.
 */
import { InvalidArgumentError } from '../errors.js';
import { type PassCost, type PipelineProfile, parseProfile } from './profile.js';
import { AVERAGING_LAYOUTS, type AveragingLayout, avgpipe } from './schedules/avgpipe.js';
import { warmupForwards } from './schedules/advance-forward.js';
import { limits } from './schedules/options.js';
import { type SimulationCosts, simulateSchedule } from './simulate.js';
import { checkInteger, checkOneOf, describeValue } from '../validate.js';
import { checkNumber as checkNumberArg } from '../validate.js';

/** @category Pipeline schedules */
export interface TuneOptions {
  /** Memory available on each stage's device, bytes. */
  readonly memoryBytes: number;
  /** Largest N tried. Default 4. */
  readonly maxPipelines?: number;
  /** Largest M tried (M always divides the batch). Default 64. */
  readonly maxMicroBatches?: number;
}

/** One simulated (N, M, A). @category Pipeline schedules */
export interface TuneCandidate {
  readonly pipelines: number;
  readonly microBatches: number;
  readonly advance: number;
  /** Samples per micro-batch: batchSize / M. */
  readonly microBatchSize: number;
  /** Milliseconds for N pipelines to finish one batch each (with the profile's `roundOverheadMs`). */
  readonly makespanMs: number;
  /** Samples per second over all pipelines. */
  readonly samplesPerSecond: number;
  readonly bubbleFraction: number;
  /** Peak bytes per stage. */
  readonly peakMemoryBytes: readonly number[];
  readonly fits: boolean;
}

/** @category Pipeline schedules */
export interface TuneResult {
  /** The fastest candidate that fits, or undefined if none does. */
  readonly best: TuneCandidate | undefined;
  /** Every candidate simulated, fastest first. */
  readonly candidates: readonly TuneCandidate[];
  /** Why the choice was made, in sentences. */
  readonly explanation: readonly string[];
}

const gib = (bytes: number): string => `${(bytes / 2 ** 30).toFixed(2)} GiB`;

/**
 * Simulation costs of a profile at micro-batch size `b`: a stage's fitted `fixedMs + perSampleMs * b`
 * where the profile has a fit, else linear in b beyond the fixed overhead. With `profile.machine`,
 * the stages are threads sharing its cores (`sharedCores`) as the runtime runs AvgPipe's `layout`:
 * `shared-stages` (default) one thread per stage running its row for every pipeline, the elastic
 * averaging of a stage's replicas costing its optimizer step (a pass over the weights on the
 * worker); `worker-per-replica` one thread per stage and pipeline, the averaging costing the step
 * plus an all-reduce of the weights over the link (`2 * p2pLatency + weightBytes / bandwidth`, two
 * replicas). With one pipeline the two are the same.
 *
 * @category Pipeline schedules
 */
export function costsAt(profileInput: PipelineProfile, microBatchSize: number, layout: AveragingLayout = AVERAGING_LAYOUTS[0]): SimulationCosts {
  const profile = parseProfile(profileInput);
  checkNumberArg(microBatchSize, 'costsAt: microBatchSize', 0, Number.MAX_VALUE, { loOpen: true });
  const ratio = microBatchSize / profile.microBatchSize;
  const overhead = profile.overheadMs ?? 0;
  const scaled = (ms: number): number => overhead + (ms - overhead) * ratio;
  const at = (fit: PassCost | undefined, ms: number): number => (fit === undefined ? scaled(ms) : fit.fixedMs + fit.perSampleMs * microBatchSize);
  checkOneOf(layout, 'costsAt: layout', AVERAGING_LAYOUTS);
  const separate = layout === 'worker-per-replica';
  const machine = profile.machine;
  const latency = profile.p2pLatencyMs ?? 0;
  // GB/s is 1e6 bytes per millisecond
  const bandwidth = profile.p2pBandwidthGBps === undefined ? Infinity : profile.p2pBandwidthGBps * 1e6;
  return {
    forward: profile.stages.map((s) => at(s.fit?.forward, s.forwardMs)),
    backward: profile.stages.map((s) => at(s.fit?.backward, s.backwardMs)),
    ...(profile.stages.some((s) => s.optimizerStepMs !== undefined) ? { optimizerStep: profile.stages.map((s) => s.optimizerStepMs ?? 0) } : {}),
    ...(machine === undefined
      ? {}
      : {
          sharedCores: {
            cores: machine.cores,
            passCores: machine.passCores ?? 1,
            threads: separate ? ('per-pipeline' as const) : ('per-stage' as const),
            // a message carries a stage's output activation (or its gradient): its bytes at this size
            ...(machine.messageCpu ? { messageCpu: profile.stages.map((s) => machine.messageCpu!.fixedMs + machine.messageCpu!.perByteMs * (s.activationBytes ?? 0) * ratio) } : {}),
          },
          // AvgPipe's elastic averaging of a stage: a pass over its weights as costly as its step,
          // and with a worker per replica an all-reduce of them over the link between two replicas
          elastic: profile.stages.map((s) => (s.optimizerStepMs ?? 0) + (separate ? 2 * latency + (s.weightBytes ?? 0) / bandwidth : 0)),
        }),
    activationBytes: profile.stages.map((s) => (s.activationBytes ?? 0) * ratio),
    storedActivationBytes: profile.stages.map((s) => (s.storedActivationBytes ?? s.activationBytes ?? 0) * ratio),
    weightBytes: profile.stages.map((s) => s.weightBytes ?? 0),
    optimizerStateBytes: profile.stages.map((s) => s.optimizerStateBytes ?? 0),
    p2pLatency: latency,
    p2pBandwidth: bandwidth,
  };
}

/** One setting of AvgPipe for {@link simulateSetting}. @category Pipeline schedules */
export interface TuneSetting {
  readonly pipelines: number;
  readonly microBatches: number;
  /** 0: 1F1B; M + S or more: all forwards first (GPipe's order). */
  readonly advance: number;
  readonly microBatchSize: number;
  /** Where the runtime runs the pipelines, which a machine-aware profile's simulation follows (see {@link costsAt}); default `shared-stages`. */
  readonly layout?: AveragingLayout;
}

/**
 * The tuner's prediction for one setting (any micro-batch size, not only the profile's batch split):
 * AvgPipe's schedule simulated with the profile's costs at that size ({@link costsAt}) plus the
 * profile's `roundOverheadMs`, its peak
 * memory per stage (with the center copy for N > 1) against `memoryBytes` (default: no cap).
 *
 * @category Pipeline schedules
 */
export function simulateSetting(profileInput: PipelineProfile, setting: TuneSetting, costs?: SimulationCosts, memoryBytes: number = Infinity): TuneCandidate {
  const profile = parseProfile(profileInput);
  if (setting === null || typeof setting !== 'object') throw new InvalidArgumentError(`simulateSetting expects { pipelines, microBatches, advance, microBatchSize }, got ${describeValue(setting)}`);
  const S = checkInteger(profile.stages.length, 'simulateSetting: profile.stages.length (stages)', 1, limits.stages);
  const N = checkInteger(setting.pipelines, 'simulateSetting: pipelines', 1, limits.pipelines);
  const M = checkInteger(setting.microBatches, 'simulateSetting: microBatches', 1, limits.microBatches);
  const A = checkInteger(setting.advance, 'simulateSetting: advance', 0, limits.microBatches + S);
  const b = setting.microBatchSize;
  checkNumberArg(b, 'simulateSetting: microBatchSize', 0, Number.MAX_VALUE, { loOpen: true });
  if (setting.layout !== undefined) checkOneOf(setting.layout, 'simulateSetting: layout', AVERAGING_LAYOUTS);
  const atB = costs ?? costsAt(profile, b, setting.layout);
  // one pipeline has nothing to average with (its schedule still holds the exchange)
  const result = simulateSchedule(avgpipe({ stages: S, microBatches: M, pipelines: N, advance: A }), N === 1 ? { ...atB, elastic: 0 } : atB);
  const round = profile.roundOverheadMs ?? 0;
  // elastic averaging keeps a center copy of each stage's weights
  const center = N > 1 ? profile.stages.map((s) => s.weightBytes ?? 0) : profile.stages.map(() => 0);
  const peak = result.peakMemoryBytes.map((bytes, k) => bytes + center[k]!);
  return {
    pipelines: N,
    microBatches: M,
    advance: A,
    microBatchSize: b,
    makespanMs: result.makespan + round,
    samplesPerSecond: result.makespan + round > 0 ? (N * M * b * 1000) / (result.makespan + round) : Infinity,
    bubbleFraction: result.bubbleFraction,
    peakMemoryBytes: peak,
    fits: peak.every((bytes) => bytes <= memoryBytes),
  };
}

/**
 * Simulates AvgPipe for every N up to `maxPipelines`, every M dividing the batch up to
 * `maxMicroBatches`, and every A from 0 (1F1B) to S-1 plus all-forward-first, and picks the
 * highest throughput that fits in `memoryBytes` on every stage (ties: less memory).
 *
 * @category Pipeline schedules
 */
export function tuneAvgPipe(profileInput: PipelineProfile, options: TuneOptions): TuneResult {
  const profile = parseProfile(profileInput);
  if (options === null || typeof options !== 'object') throw new InvalidArgumentError('tuneAvgPipe expects options { memoryBytes }');
  const memory = options.memoryBytes;
  if (typeof memory !== 'number' || !(memory > 0)) throw new InvalidArgumentError(`memoryBytes must be a number > 0, got ${describeValue(memory)}`);
  const maxN = checkInteger(options.maxPipelines ?? 4, 'maxPipelines', 1, limits.pipelines);
  const maxM = checkInteger(options.maxMicroBatches ?? 64, 'maxMicroBatches', 1, limits.microBatches);
  // The generator's bound on S, checked here once: the warm-ups below take checked values.
  const S = checkInteger(profile.stages.length, 'tuneAvgPipe: profile.stages.length (stages)', 1, limits.stages);
  const candidates: TuneCandidate[] = [];
  let skipped = 0;
  for (let M = 1; M <= Math.min(maxM, profile.batchSize); M++) {
    if (profile.batchSize % M !== 0) continue;
    const b = profile.batchSize / M;
    const costs = costsAt(profile, b);
    // A values that give the same per-stage warm-up give the same schedule; simulate each once
    const seen = new Set<string>();
    const advances = [...Array.from({ length: S }, (_, a) => a), M + S];
    for (const A of advances) {
      const key = Array.from({ length: S }, (_, k) => warmupForwards(S, M, A, k)).join(',');
      if (seen.has(key)) continue;
      seen.add(key);
      for (let N = 1; N <= maxN; N++) {
        // past the generators' size limit there is no schedule to simulate
        if (N * S * M > limits.listScheduledUnits) {
          skipped++;
          continue;
        }
        candidates.push(simulateSetting(profile, { pipelines: N, microBatches: M, advance: A, microBatchSize: b }, costs, memory));
      }
    }
  }
  const maxOf = (c: TuneCandidate): number => Math.max(...c.peakMemoryBytes);
  candidates.sort((x, y) => y.samplesPerSecond - x.samplesPerSecond || maxOf(x) - maxOf(y));
  const best = candidates.find((c) => c.fits);
  const describe = (c: TuneCandidate): string =>
    `N=${c.pipelines}, M=${c.microBatches} (micro-batch ${c.microBatchSize}), A=${c.advance >= c.microBatches + S ? 'all-forward-first' : c.advance}: ` +
    `${c.samplesPerSecond.toFixed(1)} samples/s, bubble ${(c.bubbleFraction * 100).toFixed(1)}%, peak ${gib(maxOf(c))}`;
  const explanation: string[] = [];
  const fitting = candidates.filter((c) => c.fits).length;
  explanation.push(`simulated ${candidates.length} settings of (N, M, A) on ${S} stages; ${fitting} fit in ${gib(memory)} per stage`);
  if (skipped > 0) {
    explanation.push(`skipped ${skipped} settings with N x S x M over ${limits.listScheduledUnits}, the most units an AvgPipe schedule holds; lower maxPipelines or maxMicroBatches to keep them all`);
  }
  if (best === undefined) {
    const smallest = [...candidates].sort((x, y) => maxOf(x) - maxOf(y))[0]!;
    explanation.push(`none fits: the smallest needs ${gib(maxOf(smallest))} (${describe(smallest)}); add memory, more stages or a smaller batch`);
  } else {
    explanation.push(`chosen: ${describe(best)}`);
    const faster = candidates[0]!;
    if (faster !== best) explanation.push(`faster but over the cap: ${describe(faster)}`);
    const baseline = candidates.filter((c) => c.fits && c.pipelines === 1 && c.advance === 0).sort((x, y) => y.samplesPerSecond - x.samplesPerSecond)[0];
    if (baseline && baseline !== best) {
      explanation.push(
        `best plain 1F1B (N=1, A=0) that fits: ${describe(baseline)}; the choice is ${(best.samplesPerSecond / baseline.samplesPerSecond).toFixed(2)}x its throughput`,
      );
    }
    const reasons: string[] = [];
    if (best.pipelines > 1) reasons.push(`${best.pipelines} pipelines fill each other's bubbles`);
    if (best.advance > 0) reasons.push('advance forward propagation hides point-to-point latency behind extra forwards');
    if (best.pipelines === 1 && best.advance === 0) reasons.push('more pipelines or advance did not pay for their memory or time');
    explanation.push(`why: ${reasons.join('; ')}`);
    explanation.push(`peak memory per stage: ${best.peakMemoryBytes.map(gib).join(', ')} of ${gib(memory)}`);
  }
  return { best, candidates, explanation };
}
