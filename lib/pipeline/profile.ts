/**
 * Stage profiles: measured per-stage costs and sizes that the tuner feeds to the simulator.
 * The JSON format is documented in docs/pipeline.md; {@link parseProfile} checks it and
 * {@link profileStages} builds one by timing user stage functions.
 */
import { performance } from 'node:perf_hooks';

import { InvalidArgumentError } from '../errors.js';
import { fromJsonText } from '../json-input.js';
import { describeValue } from '../validate.js';

/** One pipeline stage as measured at `microBatchSize` samples per micro-batch. @category Pipeline schedules */
export interface StageProfile {
  /** Forward time of one micro-batch, milliseconds. */
  readonly forwardMs: number;
  /** Backward time (input and weight gradients) of one micro-batch, milliseconds. */
  readonly backwardMs: number;
  /** Bytes of the activation the stage sends to the next one, per micro-batch. Default 0. */
  readonly activationBytes?: number;
  /** Bytes the stage keeps per micro-batch until its backward. Default `activationBytes`. */
  readonly storedActivationBytes?: number;
  /** Bytes of one copy of the stage's weights. Default 0. */
  readonly weightBytes?: number;
  /** Bytes of the stage's optimizer state (momenta). Default 0. */
  readonly optimizerStateBytes?: number;
  /** Time of the stage's optimizer step, milliseconds (it does not depend on the micro-batch). Default 0. */
  readonly optimizerStepMs?: number;
  /**
   * Pass costs fitted from timings at two or more micro-batch sizes (see {@link fitPassCost}):
   * where given, the tuner takes a pass at `b` samples as `fixedMs + perSampleMs * b` instead of
   * scaling `forwardMs`/`backwardMs`.
   */
  readonly fit?: StageCostFit;
}

/** A pass's cost as fixed + per-sample milliseconds. @category Pipeline schedules */
export interface PassCost {
  readonly fixedMs: number;
  readonly perSampleMs: number;
}

/** A stage's fitted pass costs. @category Pipeline schedules */
export interface StageCostFit {
  readonly forward: PassCost;
  /** The full backward (input and weight gradients). */
  readonly backward: PassCost;
  /** The micro-batch sizes the fit was made from. */
  readonly microBatchSizes?: readonly number[];
}

/**
 * The machine a profile was measured on, for the tuner's model of stages sharing cores: with it,
 * the stage costs are each pass's time alone, and the tuner simulates the runtime's worker threads
 * (one per stage and pipeline) sharing `cores` (docs/pipeline.md, "Stages sharing cores").
 *
 * @category Pipeline schedules
 */
export interface MachineProfile {
  /** Cores the process may use (`os.availableParallelism()`). */
  readonly cores: number;
  /** Threads of the native kernels' pool (`nativeInfo().threads`), for the record. */
  readonly poolThreads?: number;
  /** Cores one pass uses when it runs alone (measured speed-up over one thread); default 1. */
  readonly passCores?: number;
  /**
   * The kernel threads each worker thread had when the passes were timed (PipelineTrainerOptions'
   * `kernelThreads`); absent: the process-wide pool. Run what the profile predicts with the same.
   */
  readonly kernelThreads?: number;
  /**
   * CPU time one point-to-point message between stage threads costs the cores, beside the passes:
   * `fixedMs + perByteMs * bytes` (measureLocalLink: the transport's copy and the wake-ups at both
   * ends). Absent: messages cost the cores nothing.
   */
  readonly messageCpu?: MessageCpu;
}

/** What a message costs the cores: {@link MachineProfile.messageCpu}. @category Pipeline schedules */
export interface MessageCpu {
  readonly fixedMs: number;
  readonly perByteMs: number;
}

/**
 * Least-squares fit of `ms = fixedMs + perSampleMs * microBatchSize` to timings at two or more
 * micro-batch sizes. Neither term is negative: a negative slope becomes a flat cost (the mean), a
 * negative intercept a line through the origin.
 *
 * @category Pipeline schedules
 */
export function fitPassCost(samples: readonly { readonly microBatchSize: number; readonly ms: number }[]): PassCost {
  if (!Array.isArray(samples)) throw new InvalidArgumentError(`fitPassCost expects an array of { microBatchSize, ms }, got ${describeValue(samples)}`);
  samples.forEach((x, i) => {
    if (x === null || typeof x !== 'object') throw new InvalidArgumentError(`fitPassCost: samples[${i}] must be { microBatchSize, ms }`);
    if (typeof x.microBatchSize !== 'number' || !(x.microBatchSize > 0) || !Number.isFinite(x.microBatchSize)) throw new InvalidArgumentError(`fitPassCost: samples[${i}].microBatchSize must be a number > 0, got ${describeValue(x.microBatchSize)}`);
    nonNegative(`fitPassCost: samples[${i}].ms`, x.ms, false);
  });
  if (new Set(samples.map((x) => x.microBatchSize)).size < 2) throw new InvalidArgumentError('fitPassCost needs timings at two or more different micro-batch sizes');
  const n = samples.length;
  const mb = samples.reduce((a, x) => a + x.microBatchSize, 0) / n;
  const mt = samples.reduce((a, x) => a + x.ms, 0) / n;
  let cov = 0;
  let v = 0;
  for (const x of samples) {
    cov += (x.microBatchSize - mb) * (x.ms - mt);
    v += (x.microBatchSize - mb) ** 2;
  }
  const slope = cov / v;
  if (slope <= 0) return { fixedMs: mt, perSampleMs: 0 };
  const intercept = mt - slope * mb;
  if (intercept >= 0) return { fixedMs: intercept, perSampleMs: slope };
  const bt = samples.reduce((a, x) => a + x.microBatchSize * x.ms, 0);
  const bb = samples.reduce((a, x) => a + x.microBatchSize ** 2, 0);
  return { fixedMs: 0, perSampleMs: bt / bb };
}

/** A profile of a model split into stages. @category Pipeline schedules */
export interface PipelineProfile {
  /** One entry per stage, in order. */
  readonly stages: readonly StageProfile[];
  /** Samples per micro-batch at which the stage costs and sizes were measured. */
  readonly microBatchSize: number;
  /** Samples each pipeline processes per iteration (split into M micro-batches). */
  readonly batchSize: number;
  /** Part of `forwardMs`/`backwardMs` that does not shrink with the micro-batch (launch cost). Default 0. */
  readonly overheadMs?: number;
  /** Point-to-point latency, milliseconds. Default 0. */
  readonly p2pLatencyMs?: number;
  /** Point-to-point bandwidth, GB/s (1e9 bytes per second). Default: unlimited. */
  readonly p2pBandwidthGBps?: number;
  /** Where given, the stages are threads sharing this machine's cores (see {@link MachineProfile}). */
  readonly machine?: MachineProfile;
  /**
   * Wall time a round of the runtime costs beyond its timeline (starting it on every worker,
   * collecting its report), milliseconds; the tuner adds it to every simulated round. Default 0.
   */
  readonly roundOverheadMs?: number;
}

function checkPassCost(where: string, value: unknown): void {
  if (value === null || typeof value !== 'object') throw new InvalidArgumentError(`${where} must be { fixedMs, perSampleMs }, got ${describeValue(value)}`);
  const v = value as Record<string, unknown>;
  nonNegative(`${where}.fixedMs`, v.fixedMs, false);
  nonNegative(`${where}.perSampleMs`, v.perSampleMs, false);
}

const nonNegative = (where: string, value: unknown, optional: boolean): void => {
  if (value === undefined && optional) return;
  if (typeof value !== 'number' || !Number.isFinite(value) || value < 0) {
    throw new InvalidArgumentError(`${where} must be a finite number >= 0, got ${describeValue(value)}`);
  }
};

/** Checks a profile (an object, or JSON text) and returns it. @category Pipeline schedules */
export function parseProfile(input: unknown): PipelineProfile {
  const value = fromJsonText(input, 'the profile');
  if (value === null || typeof value !== 'object') throw new InvalidArgumentError('a profile must be an object with stages, microBatchSize and batchSize');
  const p = value as Record<string, unknown>;
  if (!Array.isArray(p.stages) || p.stages.length === 0) throw new InvalidArgumentError('profile.stages must be a non-empty array, one entry per stage');
  p.stages.forEach((stage: unknown, k) => {
    if (stage === null || typeof stage !== 'object') throw new InvalidArgumentError(`profile.stages[${k}] must be an object with forwardMs and backwardMs`);
    const st = stage as Record<string, unknown>;
    nonNegative(`profile.stages[${k}].forwardMs`, st.forwardMs, false);
    nonNegative(`profile.stages[${k}].backwardMs`, st.backwardMs, false);
    for (const key of ['activationBytes', 'storedActivationBytes', 'weightBytes', 'optimizerStateBytes', 'optimizerStepMs']) {
      nonNegative(`profile.stages[${k}].${key}`, st[key], true);
    }
    if (st.fit !== undefined) {
      if (st.fit === null || typeof st.fit !== 'object') throw new InvalidArgumentError(`profile.stages[${k}].fit must be { forward, backward }, got ${describeValue(st.fit)}`);
      const fit = st.fit as Record<string, unknown>;
      checkPassCost(`profile.stages[${k}].fit.forward`, fit.forward);
      checkPassCost(`profile.stages[${k}].fit.backward`, fit.backward);
    }
  });
  if (p.machine !== undefined) {
    if (p.machine === null || typeof p.machine !== 'object') throw new InvalidArgumentError(`profile.machine must be { cores, poolThreads?, passCores?, kernelThreads?, messageCpu? }, got ${describeValue(p.machine)}`);
    const m = p.machine as Record<string, unknown>;
    if (typeof m.cores !== 'number' || !(m.cores > 0) || !Number.isFinite(m.cores)) throw new InvalidArgumentError(`profile.machine.cores must be a number > 0, got ${describeValue(m.cores)}`);
    nonNegative('profile.machine.poolThreads', m.poolThreads, true);
    if (m.passCores !== undefined && (typeof m.passCores !== 'number' || !(m.passCores > 0) || !Number.isFinite(m.passCores)))
      throw new InvalidArgumentError(`profile.machine.passCores must be a number > 0, got ${describeValue(m.passCores)}`);
    if (m.messageCpu !== undefined) {
      if (m.messageCpu === null || typeof m.messageCpu !== 'object') throw new InvalidArgumentError(`profile.machine.messageCpu must be { fixedMs, perByteMs }, got ${describeValue(m.messageCpu)}`);
      const c = m.messageCpu as Record<string, unknown>;
      nonNegative('profile.machine.messageCpu.fixedMs', c.fixedMs, false);
      nonNegative('profile.machine.messageCpu.perByteMs', c.perByteMs, false);
    }
    if (m.kernelThreads !== undefined && (typeof m.kernelThreads !== 'number' || !Number.isInteger(m.kernelThreads) || m.kernelThreads < 1))
      throw new InvalidArgumentError(`profile.machine.kernelThreads must be an integer >= 1 (leave it out for the process-wide pool), got ${describeValue(m.kernelThreads)}`);
  }
  for (const key of ['microBatchSize', 'batchSize']) {
    if (typeof p[key] !== 'number' || !Number.isInteger(p[key]) || (p[key] as number) < 1) {
      throw new InvalidArgumentError(`profile.${key} must be an integer >= 1, got ${describeValue(p[key])}`);
    }
  }
  nonNegative('profile.overheadMs', p.overheadMs, true);
  nonNegative('profile.p2pLatencyMs', p.p2pLatencyMs, true);
  nonNegative('profile.roundOverheadMs', p.roundOverheadMs, true);
  if (p.p2pBandwidthGBps !== undefined && (typeof p.p2pBandwidthGBps !== 'number' || !(p.p2pBandwidthGBps > 0))) {
    throw new InvalidArgumentError('profile.p2pBandwidthGBps must be a number > 0');
  }
  const overhead = (p.overheadMs as number | undefined) ?? 0;
  (p.stages as Record<string, number>[]).forEach((st, k) => {
    if (overhead > st.forwardMs! || overhead > st.backwardMs!) {
      throw new InvalidArgumentError(`profile.overheadMs (${overhead}) exceeds stage ${k}'s forwardMs or backwardMs; it is a part of them`);
    }
  });
  return value as PipelineProfile;
}

/** A stage given as functions to time: each runs one micro-batch of `microBatchSize` samples. @category Pipeline schedules */
export interface StageFunctions {
  forward(): unknown;
  backward(): unknown;
  activationBytes?: number;
  storedActivationBytes?: number;
  weightBytes?: number;
  optimizerStateBytes?: number;
}

/** @category Pipeline schedules */
export interface ProfileOptions {
  readonly microBatchSize: number;
  readonly batchSize: number;
  /** Untimed calls first (JIT, caches). Default 2. */
  readonly warmup?: number;
  /** Timed calls; the median is kept. Default 7. */
  readonly repeats?: number;
  readonly overheadMs?: number;
  readonly p2pLatencyMs?: number;
  readonly p2pBandwidthGBps?: number;
}

async function medianMs(fn: () => unknown, warmup: number, repeats: number): Promise<number> {
  for (let i = 0; i < warmup; i++) await fn();
  const times: number[] = [];
  for (let i = 0; i < repeats; i++) {
    const start = performance.now();
    await fn();
    times.push(performance.now() - start);
  }
  times.sort((a, b) => a - b);
  return times[Math.floor(times.length / 2)]!;
}

/**
 * Builds a profile by timing user stage functions (which may return promises): the median of
 * `repeats` calls after `warmup` untimed ones, per stage and pass.
 *
 * @category Pipeline schedules
 */
export async function profileStages(stages: readonly StageFunctions[], options: ProfileOptions): Promise<PipelineProfile> {
  if (!Array.isArray(stages) || stages.length === 0) throw new InvalidArgumentError('profileStages expects a non-empty array of { forward, backward } stages');
  if (options === null || typeof options !== 'object') throw new InvalidArgumentError('profileStages expects options { microBatchSize, batchSize }');
  const warmup = options.warmup ?? 2;
  const repeats = options.repeats ?? 7;
  if (!Number.isInteger(warmup) || warmup < 0) throw new InvalidArgumentError('warmup must be an integer >= 0');
  if (!Number.isInteger(repeats) || repeats < 1) throw new InvalidArgumentError('repeats must be an integer >= 1');
  const measured: StageProfile[] = [];
  for (const [k, stage] of stages.entries()) {
    if (stage === null || typeof stage !== 'object' || typeof stage.forward !== 'function' || typeof stage.backward !== 'function') {
      throw new InvalidArgumentError(`stage ${k} must have forward() and backward() functions`);
    }
    const entry: Record<string, number> = {
      forwardMs: await medianMs(() => stage.forward(), warmup, repeats),
      backwardMs: await medianMs(() => stage.backward(), warmup, repeats),
    };
    for (const key of ['activationBytes', 'storedActivationBytes', 'weightBytes', 'optimizerStateBytes'] as const) {
      if (stage[key] !== undefined) entry[key] = stage[key];
    }
    measured.push(entry as unknown as StageProfile);
  }
  const profile: Record<string, unknown> = { stages: measured, microBatchSize: options.microBatchSize, batchSize: options.batchSize };
  for (const key of ['overheadMs', 'p2pLatencyMs', 'p2pBandwidthGBps'] as const) if (options[key] !== undefined) profile[key] = options[key];
  return parseProfile(profile);
}
