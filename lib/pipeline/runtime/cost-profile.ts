/**
 * A profile that knows the machine: each model part timed alone at two or more micro-batch sizes
 * and fitted as fixed + per-sample cost per pass, its optimizer step, how many cores a pass uses
 * (measured by running one pass per core at once), and the in-process `local` link's latency and
 * cost per byte. The tuner and the simulator then model the runtime's worker threads sharing the
 * cores (docs/pipeline.md, "Stages sharing cores").
 */
import { availableParallelism } from 'node:os';
import { performance } from 'node:perf_hooks';
import { Worker } from 'node:worker_threads';

import { InternalError, InvalidArgumentError } from '../../errors.js';
import { nativeInfo } from '../../info.js';
import { checkKernelThreads, withKernelThreads } from '../../kernel-threads.js';
import { Sequential, checkLayers, layerParams, partRanges, type LayerSpec } from '../../nn/sequential.js';
import { SGD } from '../../optim/sgd.js';
import { FlatBuffer } from '../../tensor.js';
import { checkInteger, checkOptions, describeValue } from '../../validate.js';
import { type MessageCpu, type PassCost, type PipelineProfile, type StageProfile, fitPassCost, parseProfile } from '../profile.js';
import type { Schedule } from '../schedule.js';
import type { PerPart, SimulationCosts } from '../simulate.js';
import type { TimedAction } from '../timeline.js';
import { WORK_KINDS, measuredCosts } from './measure.js';

/** One part's costs measured alone. @category Pipeline runtime */
export interface PartCostProfile {
  /** Median forward and full backward of a micro-batch at each size. */
  readonly samples: readonly { readonly microBatchSize: number; readonly forwardMs: number; readonly backwardMs: number }[];
  readonly forward: PassCost;
  readonly backward: PassCost;
  /** Median SGD-momentum step of the part's weights. */
  readonly optimizerStepMs: number;
}

/** @category Pipeline runtime */
export interface PartCostOptions {
  /** Micro-batch sizes to time at, two or more distinct. */
  readonly microBatchSizes: readonly number[];
  /** Timed calls per pass and size (the median is kept). Default 7. */
  readonly repeats?: number;
  readonly seed?: number;
  /** The kernel threads each pass runs on (a stage worker's `kernelThreads`), or `shared` (the process-wide pool, the default). */
  readonly kernelThreads?: number | 'shared';
}

/** `kernelThreads` of a profiling option, checked (`shared` by default). */
const checkProfileThreads = (given: unknown, what: string): number | 'shared' => (given === undefined ? 'shared' : checkKernelThreads(given, `${what}: options.kernelThreads`));

/** The largest micro-batch a profile times (its buffers are allocated at once). */
const MAX_PROFILED_BATCH = 8192;

const median = (values: number[]): number => {
  const sorted = [...values].sort((a, b) => a - b);
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2;
};

function timeMs(fn: () => void, warmup: number, repeats: number): number {
  for (let i = 0; i < warmup; i++) fn();
  const times: number[] = [];
  for (let i = 0; i < repeats; i++) {
    const start = performance.now();
    fn();
    times.push(performance.now() - start);
  }
  return median(times);
}

/**
 * Times each part of a sequential model cut at `boundaries` alone, on the calling thread, at every
 * size of `microBatchSizes` (forward, and full backward with the input gradient where the part has
 * a predecessor), fits fixed + per-sample cost per pass, and times its optimizer step.
 *
 * @category Pipeline runtime
 */
export function profilePartCosts(layers: readonly LayerSpec[], boundaries: readonly number[], options: PartCostOptions): PartCostProfile[] {
  checkLayers(layers, 'profilePartCosts(layers)');
  checkOptions(options, ['microBatchSizes', 'repeats', 'seed', 'kernelThreads'], 'profilePartCosts(layers, boundaries, options)');
  const threads = checkProfileThreads(options.kernelThreads, 'profilePartCosts');
  const sizes = options.microBatchSizes;
  if (!Array.isArray(sizes) || new Set(sizes).size < 2) throw new InvalidArgumentError(`profilePartCosts: options.microBatchSizes must hold two or more different sizes, got ${describeValue(sizes)}`);
  for (const b of sizes) checkInteger(b, 'profilePartCosts: options.microBatchSizes[i]', 1, MAX_PROFILED_BATCH);
  const repeats = checkInteger(options.repeats ?? 7, 'profilePartCosts: options.repeats', 1, 1000);
  const ranges = partRanges(layers.length, boundaries);
  return withKernelThreads(threads, () => ranges.map((range, j) => {
    const model = new Sequential(layers, { seed: options.seed ?? 0, range });
    const optimizer = new SGD(model.params, { lr: 1e-6, momentum: 0.9 });
    try {
      const samples = sizes.map((b) => {
        const input = FlatBuffer.allocate(b * model.inputSize);
        const gradOutput = FlatBuffer.allocate(b * model.outputSize);
        try {
          input.fill(0.5);
          gradOutput.fill(0.01);
          let slot = 0;
          const forwardMs = timeMs(() => void model.forward(slot++, input, b, model.params.weights), 2, repeats);
          // each timed backward consumes a slot a forward filled beforehand
          let next = 0;
          const backwardMs = timeMs(
            () => {
              if (next === slot) model.forward(slot++, input, b, model.params.weights);
              const dx = model.backward(next++, gradOutput, { grads: model.params.grads, inputGrad: j > 0 });
              if (dx) model.recycle(dx);
            },
            0,
            repeats,
          );
          while (next < slot) {
            const dx = model.backward(next++, gradOutput, { grads: model.params.grads, inputGrad: j > 0 });
            if (dx) model.recycle(dx);
          }
          return { microBatchSize: b, forwardMs, backwardMs };
        } finally {
          input.dispose();
          gradOutput.dispose();
        }
      });
      model.params.grads.fill(0);
      const optimizerStepMs = timeMs(() => void optimizer.stepSync(), 2, repeats);
      return {
        samples,
        forward: fitPassCost(samples.map((s) => ({ microBatchSize: s.microBatchSize, ms: s.forwardMs }))),
        backward: fitPassCost(samples.map((s) => ({ microBatchSize: s.microBatchSize, ms: s.backwardMs }))),
        optimizerStepMs,
      };
    } finally {
      optimizer.dispose();
      model.dispose();
    }
  }));
}

/**
 * The cores this process may use (`os.availableParallelism()`) and the native kernels' thread
 * pool (one pool per process: every stage thread's large products queue for it, one at a time).
 *
 * @category Pipeline runtime
 */
export function machineCores(): { cores: number; poolThreads: number } {
  return { cores: availableParallelism(), poolThreads: nativeInfo().threads };
}

/**
 * How many cores a pass uses, measured: the forward + backward of one part (layers `range`) at
 * `microBatchSize` samples runs `passes` times on one worker thread alone, then on k worker threads
 * at once (three turns of each, the medians kept). Each thread runs its kernels on
 * `kernelThreads` threads of its own (or, `shared`, the process-wide pool), and k fills the
 * machine: `cores / kernelThreads` threads (with the shared pool, `cores`). Under processor
 * sharing, k passes at once that each use d cores take `max(1, k*d/cores)` times as long, so
 * `d = cores * (time at once / time alone) / k`, at least 1 and at most `cores`.
 *
 * @category Pipeline runtime
 */
export async function measurePassCores(
  layers: readonly LayerSpec[],
  range: readonly [number, number],
  microBatchSize: number,
  options: { passes?: number; cores?: number; kernelThreads?: number | 'shared' } = {},
): Promise<{ passCores: number; aloneMs: number; sharedMs: number; threads: number }> {
  checkLayers(layers, 'measurePassCores(layers)');
  if (!Array.isArray(range) || range.length !== 2 || !Number.isInteger(range[0]) || !Number.isInteger(range[1]) || !(range[0] >= 0 && range[0] < range[1] && range[1] <= layers.length))
    throw new InvalidArgumentError(`measurePassCores: range must be [first layer, end] with 0 <= first < end <= ${layers.length}, got ${describeValue(range)}`);
  checkInteger(microBatchSize, 'measurePassCores: microBatchSize', 1, MAX_PROFILED_BATCH);
  checkOptions(options, ['passes', 'cores', 'kernelThreads'], 'measurePassCores(layers, range, microBatchSize, options)');
  const passes = checkInteger(options.passes ?? 20, 'measurePassCores: options.passes', 1, 1 << 16);
  const cores = checkInteger(options.cores ?? availableParallelism(), 'measurePassCores: options.cores', 1, 1024);
  const kernelThreads = checkProfileThreads(options.kernelThreads, 'measurePassCores');
  const atOnce = kernelThreads === 'shared' ? cores : Math.max(1, Math.floor(cores / kernelThreads));
  const run = async (k: number): Promise<number> => {
    const workers = Array.from({ length: k }, () => new Worker(new URL('./contention-thread.js', import.meta.url), { workerData: { layers, range: [...range], microBatchSize, passes, kernelThreads } }));
    try {
      const message = (w: Worker, type: string): Promise<{ ms: number }> =>
        new Promise((resolve, reject) => {
          const on = (m: { type: string; ms: number }): void => {
            if (m.type === type) {
              w.off('message', on);
              resolve(m);
            }
          };
          w.on('message', on);
          w.once('error', reject);
        });
      await Promise.all(workers.map((w) => message(w, 'ready')));
      const done = workers.map((w) => message(w, 'done'));
      for (const w of workers) w.postMessage('go');
      const times = await Promise.all(done);
      return times.reduce((a, t) => a + t.ms, 0) / k;
    } finally {
      await Promise.all(workers.map((w) => w.terminate()));
    }
  };
  // Three turns of alone then at once, the median of each: a busy moment of the machine lands on
  // one turn, not on the figure.
  const alone: number[] = [];
  const shared: number[] = [];
  for (let turn = 0; turn < 3; turn++) {
    alone.push(await run(1));
    shared.push(atOnce > 1 ? await run(atOnce) : alone[turn]!);
  }
  const aloneMs = median(alone);
  const sharedMs = median(shared);
  const passCores = Math.min(cores, Math.max(1, (cores * (sharedMs / aloneMs)) / atOnce));
  return { passCores, aloneMs: aloneMs / passes, sharedMs: sharedMs / passes, threads: atOnce };
}

/**
 * The in-process `local` link measured as the runtime's stages use it: two ranks of one group, each
 * in a worker thread of its own, send messages of `sizes` floats back and forth (`repeats` round
 * trips each, the median kept), and a line is fitted through the one-way times (half a round
 * trip): latency (ms) + bytes / bytesPerMs. The latency is mostly waking the threads on each side
 * (the sender's queue, the receiver's queue, the receiver's JavaScript thread), which a stage waits
 * for on every transfer. `messageCpu` is what a message costs the cores besides: the process's CPU
 * time per message over the same trips (both threads, the transport's threads and their wake-ups),
 * fitted as fixed + per byte. Stages sharing a few cores pay it from the time they compute in.
 *
 * @category Pipeline runtime
 */
export async function measureLocalLink(options: { sizes?: readonly number[]; repeats?: number } = {}): Promise<{ latencyMs: number; bytesPerMs: number; messageCpu: MessageCpu }> {
  checkOptions(options, ['sizes', 'repeats'], 'measureLocalLink(options)');
  const sizes = options.sizes ?? [256, 65_536, 1 << 20];
  for (const n of sizes) checkInteger(n, 'measureLocalLink: options.sizes[i]', 1, 1 << 28);
  const repeats = checkInteger(options.repeats ?? 9, 'measureLocalLink: options.repeats', 1, 1000);
  const group = `sapipe-link-${process.pid}-${Math.random().toString(36).slice(2)}`;
  const workers = ([0, 1] as const).map((rank) => new Worker(new URL('./link-thread.js', import.meta.url), { workerData: { group, rank, sizes: [...sizes], repeats } }));
  try {
    const replies = workers.map(
      (w) =>
        new Promise<{ type: string; roundTripMs?: number[]; cpuPerMessageMs?: number[]; message?: string }>((resolve, reject) => {
          w.once('message', resolve);
          w.once('error', reject);
          w.once('exit', (code) => reject(new InternalError(`measureLocalLink: a link thread exited (code ${code}) before it answered`)));
        }),
    );
    const [first, second] = await Promise.all(replies);
    for (const r of [first!, second!]) if (r.type === 'error') throw new InternalError(`measureLocalLink: ${r.message}`);
    const samples = sizes.map((n, k) => ({ microBatchSize: n * 4, ms: first!.roundTripMs![k]! / 2 }));
    const fit = fitPassCost(samples);
    const cpu = fitPassCost(sizes.map((n, k) => ({ microBatchSize: n * 4, ms: first!.cpuPerMessageMs![k]! })));
    return { latencyMs: fit.fixedMs, bytesPerMs: fit.perSampleMs > 0 ? 1 / fit.perSampleMs : Infinity, messageCpu: { fixedMs: cpu.fixedMs, perByteMs: cpu.perSampleMs } };
  } finally {
    await Promise.all(workers.map((w) => w.terminate()));
  }
}

/** @category Pipeline runtime */
export interface MachineProfileOptions {
  /** The run's micro-batch size: the profile's `microBatchSize`, and the size `passCores` is measured at. */
  readonly microBatchSize: number;
  /** Samples per pipeline per iteration (the tuner splits it into M micro-batches). */
  readonly batchSize: number;
  /**
   * Sizes to time each part at. Default: a quarter, half, one and two times `microBatchSize`, and
   * `batchSize` (distinct, at least 1): the tuner splits a pipeline's batch into M micro-batches,
   * so the fit must hold from its smallest micro-batch up to the whole batch (M = 1), not only
   * near the run's size.
   */
  readonly microBatchSizes?: readonly number[];
  /** Copies of the weights the optimizer keeps (SGD-momentum 1, Adam 2). Default 1. */
  readonly optimizerStateCopies?: number;
  readonly repeats?: number;
  readonly seed?: number;
  /** The kernel threads of each stage worker the profile is for (their `kernelThreads`, resolved), or `shared` (the default): passes are timed with as many. */
  readonly kernelThreads?: number | 'shared';
}

/**
 * The tuner's profile of a sequential model cut at `boundaries`, measured on this machine with the
 * functions above: per stage the fitted forward and backward, the optimizer step, the sizes; the
 * machine's cores and the cores a pass of the heaviest stage uses; the `local` link as
 * `p2pLatencyMs` and `p2pBandwidthGBps`. `forwardMs`/`backwardMs` are the fit at `microBatchSize`.
 *
 * @category Pipeline runtime
 */
export async function profileOnMachine(layers: readonly LayerSpec[], boundaries: readonly number[], options: MachineProfileOptions): Promise<PipelineProfile> {
  const widths = checkLayers(layers, 'profileOnMachine(layers)');
  checkOptions(options, ['microBatchSize', 'batchSize', 'microBatchSizes', 'optimizerStateCopies', 'repeats', 'seed', 'kernelThreads'], 'profileOnMachine(layers, boundaries, options)');
  const kernelThreads = checkProfileThreads(options.kernelThreads, 'profileOnMachine');
  const b = checkInteger(options.microBatchSize, 'profileOnMachine: options.microBatchSize', 1, MAX_PROFILED_BATCH / 2);
  const batchSize = checkInteger(options.batchSize, 'profileOnMachine: options.batchSize', 1, 1 << 24);
  const copies = checkInteger(options.optimizerStateCopies ?? 1, 'profileOnMachine: options.optimizerStateCopies', 0, 8);
  const sizes = options.microBatchSizes ?? [...new Set([Math.max(1, Math.round(b / 4)), Math.max(1, Math.round(b / 2)), b, 2 * b, Math.min(batchSize, MAX_PROFILED_BATCH)])];
  const parts = profilePartCosts(layers, boundaries, { microBatchSizes: sizes, kernelThreads, ...(options.repeats !== undefined ? { repeats: options.repeats } : {}), ...(options.seed !== undefined ? { seed: options.seed } : {}) });
  const ranges = partRanges(layers.length, boundaries);
  const params = layerParams(layers);
  const at = (c: PassCost): number => c.fixedMs + c.perSampleMs * b;
  const heaviest = parts.reduce((best, p, j) => (at(p.forward) + at(p.backward) > at(parts[best]!.forward) + at(parts[best]!.backward) ? j : best), 0);
  const { cores, poolThreads } = machineCores();
  const { passCores } = await measurePassCores(layers, ranges[heaviest]!, b, { cores, kernelThreads });
  const link = await measureLocalLink();
  const stages: StageProfile[] = parts.map((p, j) => {
    const [lo, hi] = ranges[j]!;
    const weightBytes = 4 * params.slice(lo, hi).reduce((x, y) => x + y, 0);
    return {
      forwardMs: at(p.forward),
      backwardMs: at(p.backward),
      activationBytes: 4 * b * widths[hi]!,
      storedActivationBytes: 4 * b * widths.slice(lo, hi + 1).reduce((x, y) => x + y, 0),
      weightBytes,
      optimizerStateBytes: copies * weightBytes,
      optimizerStepMs: p.optimizerStepMs,
      fit: { forward: p.forward, backward: p.backward, microBatchSizes: sizes },
    };
  });
  return parseProfile({
    stages,
    microBatchSize: b,
    batchSize,
    p2pLatencyMs: link.latencyMs,
    ...(Number.isFinite(link.bytesPerMs) ? { p2pBandwidthGBps: link.bytesPerMs / 1e6 } : {}),
    machine: { cores, poolThreads, passCores, messageCpu: link.messageCpu, ...(kernelThreads !== 'shared' ? { kernelThreads } : {}) },
  });
}


/**
 * A measured timeline with every work action's duration replaced by its work alone under processor
 * sharing: over each stretch of time in which n work actions ran at once, each was given
 * `min(1, cores / (n * passCores + m))` of its speed alone, so its work is the sum of those shares
 * times the stretch. `m` counts the messages whose CPU work (`messageCpu`, per part: the message
 * carrying part j's output) ran in that stretch, each taken to run from the end of the pass that
 * produced it for its cost (as the simulator runs it): their CPU is not the passes' work. Actions
 * that are not work keep their times.
 */
function decontend(timeline: readonly (readonly TimedAction[])[], cores: number, passCores: number, copies = 1, messageCpu: readonly number[] = []): TimedAction[][] {
  const points: { t: number; delta: number; id: number; message: boolean }[] = [];
  const items = timeline.flat();
  items.forEach((x, id) => {
    if (!WORK_KINDS.has(x.action.kind) || !(x.end > x.start)) return;
    points.push({ t: x.start, delta: 1, id, message: false }, { t: x.end, delta: -1, id, message: false });
  });
  if (messageCpu.some((c) => c > 0)) {
    for (const row of timeline) {
      // a send's message leaves when the pass that produced it ends (sends go out at once)
      const ends = new Map<string, number>();
      for (const x of row) if (x.action.kind === 'forward' || x.action.kind === 'backward') ends.set(`${x.action.kind}:${x.action.pipeline}:${x.action.microBatch}:${x.action.part}`, x.end);
      for (const x of row) {
        const a = x.action;
        if (a.kind !== 'sendActivation' && a.kind !== 'sendGradient') continue;
        const activation = a.kind === 'sendActivation';
        const from = ends.get(`${activation ? 'forward' : 'backward'}:${a.pipeline}:${a.microBatch}:${a.part}`) ?? x.start;
        const cpu = messageCpu[activation ? a.part : a.part - 1] ?? 0;
        if (cpu > 0) points.push({ t: from, delta: 1, id: -1, message: true }, { t: from + cpu, delta: -1, id: -1, message: true });
      }
    }
  }
  points.sort((a, b) => a.t - b.t || a.delta - b.delta);
  const work = new Float64Array(items.length);
  const active = new Set<number>();
  let messages = 0;
  let last = 0;
  for (const p of points) {
    if (active.size > 0 && p.t > last) {
      const rate = Math.min(1, cores / (copies * (active.size * passCores + messages)));
      for (const id of active) work[id]! += rate * (p.t - last);
    }
    last = p.t;
    if (p.message) messages += p.delta;
    else if (p.delta > 0) active.add(p.id);
    else active.delete(p.id);
  }
  let id = 0;
  return timeline.map((row) => row.map((x) => {
    const w = work[id++]!;
    return WORK_KINDS.has(x.action.kind) && x.end > x.start ? { ...x, end: x.start + w } : x;
  }));
}

/**
 * The point-to-point latency as the runtime sees it, from measured rounds: for every receive that
 * was waiting before its message was produced, the time from the end of the pass that produced the
 * message (on the other stage) to the receive's return (the copy, the hand-over between threads and
 * the receiver's wake-up); the median, or 0 when no receive waited.
 *
 * @category Pipeline runtime
 */
export function measuredP2pLatency(timelines: readonly (readonly (readonly TimedAction[])[])[]): number {
  const ok = (t: unknown): boolean => {
    const x = t as Partial<TimedAction> | null;
    return x !== null && typeof x === 'object' && typeof x.start === 'number' && typeof x.end === 'number' && x.action !== null && typeof x.action === 'object';
  };
  if (!Array.isArray(timelines) || !timelines.every((tl) => Array.isArray(tl) && tl.every((row: unknown) => Array.isArray(row) && row.every(ok))))
    throw new InvalidArgumentError(`measuredP2pLatency: pass round timelines (RoundReport.timeline: one list of timed actions per stage), got ${describeValue(timelines)}`);
  const samples: number[] = [];
  for (const timeline of timelines) {
    const produced = new Map<string, number>();
    for (const row of timeline)
      for (const t of row) {
        const a = t.action;
        if (a.kind === 'forward') produced.set(`a${a.pipeline}:${a.microBatch}:${a.part + 1}`, t.end);
        else if (a.kind === 'backward') produced.set(`g${a.pipeline}:${a.microBatch}:${a.part - 1}`, t.end);
      }
    for (const row of timeline)
      for (const t of row) {
        const a = t.action;
        if (a.kind !== 'recvActivation' && a.kind !== 'recvGradient') continue;
        const end = produced.get(`${a.kind === 'recvActivation' ? 'a' : 'g'}${a.pipeline}:${a.microBatch}:${a.part}`);
        if (end !== undefined && t.start <= end && t.end >= end) samples.push(t.end - end);
      }
  }
  return samples.length === 0 ? 0 : median(samples);
}

/**
 * The costs of measured rounds for the simulator's stages-sharing-cores model: each kind of
 * action's mean work alone per part (the measured durations with the sharing they ran under
 * taken out, see above), the runtime's point-to-point latency ({@link measuredP2pLatency}), and
 * `sharedCores` set to the machine. The counterpart of {@link measuredCosts}, which gives every
 * stage its own device and free transfers. `machine.copies` (default 1): how many alike sets of
 * threads ran beside the ones the timelines show (AvgPipe's worker-per-replica layout reports
 * pipeline 0's of N: pass N).
 *
 * @category Pipeline runtime
 */
export function sharedCoresCosts(
  schedule: Schedule,
  timelines: readonly (readonly (readonly TimedAction[])[])[],
  machine: { cores: number; passCores?: number; copies?: number; messageCpu?: PerPart },
  extra: SimulationCosts = {},
): SimulationCosts {
  if (machine === null || typeof machine !== 'object') throw new InvalidArgumentError(`sharedCoresCosts: machine must be { cores, passCores?, copies? }, got ${describeValue(machine)}`);
  checkOptions(machine, ['cores', 'passCores', 'copies', 'messageCpu'], 'sharedCoresCosts(schedule, timelines, machine)');
  const cores = machine.cores;
  const passCores = machine.passCores ?? 1;
  // The worker-per-replica layout reports pipeline 0's threads; the other pipelines' threads ran
  // alike beside them, so every stretch had `copies` times the passes the timeline shows.
  const copies = checkInteger(machine.copies ?? 1, 'sharedCoresCosts: machine.copies', 1, 1 << 16);
  if (typeof cores !== 'number' || !(cores > 0)) throw new InvalidArgumentError(`sharedCoresCosts: machine.cores must be a number > 0, got ${describeValue(cores)}`);
  if (typeof passCores !== 'number' || !(passCores > 0) || !Number.isFinite(passCores)) throw new InvalidArgumentError(`sharedCoresCosts: machine.passCores must be a number > 0, got ${describeValue(passCores)}`);
  if (!Array.isArray(timelines)) throw new InvalidArgumentError('sharedCoresCosts: timelines must be an array of round timelines');
  // measuredCosts checks the schedule and each timeline's shape
  measuredCosts(schedule, timelines);
  // Means, not medians: under sharing the round is bounded by the total work, which the mean keeps
  // (a pass the machine's other load delayed took that long for the round too).
  const parts = schedule.parts;
  const sums: Record<string, { total: number[]; count: number[] }> = {};
  for (const kind of ['forward', 'backward', 'weightGrad', 'optimizerStep', 'predictWeights', 'elasticAverage']) sums[kind] = { total: new Array<number>(parts).fill(0), count: new Array<number>(parts).fill(0) };
  const messageCpu = machine.messageCpu === undefined ? [] : typeof machine.messageCpu === 'number' ? new Array<number>(schedule.parts).fill(machine.messageCpu) : [...machine.messageCpu];
  if (messageCpu.length > 0 && messageCpu.length !== schedule.parts) throw new InvalidArgumentError(`sharedCoresCosts: machine.messageCpu has ${messageCpu.length} entries; give one per part (${schedule.parts}) or a single number`);
  messageCpu.forEach((c, j) => {
    if (typeof c !== 'number' || !Number.isFinite(c) || c < 0) throw new InvalidArgumentError(`sharedCoresCosts: machine.messageCpu[${j}] must be a finite number >= 0, got ${describeValue(c)}`);
  });
  for (const timeline of timelines)
    for (const row of decontend(timeline, cores, passCores, copies, messageCpu))
      for (const t of row) {
        const entry = sums[t.action.kind];
        if (entry === undefined || !(t.action.part >= 0 && t.action.part < parts)) continue;
        entry.total[t.action.part]! += t.end - t.start;
        entry.count[t.action.part]!++;
      }
  const mean = (kind: string): number[] => sums[kind]!.total.map((x, j) => (sums[kind]!.count[j]! > 0 ? x / sums[kind]!.count[j]! : 0));
  const weightGrad = mean('weightGrad');
  return {
    forward: mean('forward'),
    backward: mean('backward').map((b, j) => b + weightGrad[j]!),
    weightGrad,
    optimizerStep: mean('optimizerStep'),
    predict: mean('predictWeights'),
    elastic: mean('elasticAverage'),
    sharedCores: { cores, passCores, ...(machine.messageCpu !== undefined ? { messageCpu: machine.messageCpu } : {}) },
    p2pLatency: measuredP2pLatency(timelines),
    ...extra,
  };
}

/**
 * A machine profile ({@link profileOnMachine}) brought to what the runtime measured in rounds of a
 * run at the profile's micro-batch size, one pipeline of one part per stage: each stage's fitted
 * forward and backward are moved so that at that size they equal the run's mean work alone
 * ({@link sharedCoresCosts}). A pass inside the runtime costs more than alone on a quiet thread by
 * an amount that does not grow with the micro-batch (waking the kernels' pool, shared by every
 * stage thread, and the runtime's bookkeeping), so the difference is added to the fixed cost and
 * recorded as `runtimeFixedMs`; a run faster than the fit scales the fit down instead. The
 * optimizer step and the point-to-point latency ({@link measuredP2pLatency}) become the run's.
 *
 * @category Pipeline runtime
 */
export function calibrateProfile(profileInput: PipelineProfile, schedule: Schedule, timelines: readonly (readonly (readonly TimedAction[])[])[]): PipelineProfile {
  const profile = parseProfile(profileInput);
  if (profile.machine === undefined) throw new InvalidArgumentError('calibrateProfile: the profile has no machine; make it with profileOnMachine()');
  if (schedule === null || typeof schedule !== 'object' || schedule.parts !== profile.stages.length || schedule.stages !== profile.stages.length || schedule.pipelines !== 1)
    throw new InvalidArgumentError(`calibrateProfile: the schedule must be one pipeline of ${profile.stages.length} stages holding one part each, as the profile's`);
  // the messages' CPU (the profile's, at each stage's output activation) is not the passes' work
  const mc = profile.machine.messageCpu;
  const messageCpu = mc === undefined ? undefined : profile.stages.map((s) => mc.fixedMs + mc.perByteMs * (s.activationBytes ?? 0));
  const run = sharedCoresCosts(schedule, timelines, { cores: profile.machine.cores, passCores: profile.machine.passCores ?? 1, ...(messageCpu ? { messageCpu } : {}) });
  const b = profile.microBatchSize;
  const scale = (c: PassCost, to: number): PassCost & { runtimeFixedMs: number } => {
    const at = c.fixedMs + c.perSampleMs * b;
    if (to >= at) return { fixedMs: c.fixedMs + (to - at), perSampleMs: c.perSampleMs, runtimeFixedMs: to - at };
    const k = at > 0 ? to / at : 1;
    return { fixedMs: c.fixedMs * k, perSampleMs: c.perSampleMs * k, runtimeFixedMs: 0 };
  };
  const arr = (x: unknown, j: number): number => (Array.isArray(x) ? (x[j] as number) : (x as number));
  const stages = profile.stages.map((s, j) => {
    const forwardMs = arr(run.forward, j);
    const backwardMs = arr(run.backward, j);
    return {
      ...s,
      forwardMs,
      backwardMs,
      optimizerStepMs: arr(run.optimizerStep, j),
      ...(s.fit === undefined ? {} : { fit: { ...s.fit, forward: scale(s.fit.forward, forwardMs), backward: scale(s.fit.backward, backwardMs) } }),
    };
  });
  return parseProfile({ ...profile, stages, p2pLatencyMs: run.p2pLatency ?? 0 });
}
