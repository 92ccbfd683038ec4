/**
 * The schedule simulator: times a validated schedule from per-part costs, point-to-point latency
 * and bandwidth and all-reduce cost, and reports makespan, bubble fraction, throughput and peak
 * memory per stage.
 *
 * Model: each stage has one compute engine running its list in order; sends do not occupy it
 * (they are asynchronous, as `isend`), a message arrives `latency + bytes/bandwidth` after it is
 * sent, and links do not contend. All-reduces run beside compute once every stage taking part
 * has reached them. These are the usual assumptions of schedule papers; they make the simulator
 * exact for them and optimistic where links are shared.
 *
 * With `sharedCores` the stages are instead threads sharing a machine's cores (shared-cores.ts):
 * a pass that runs while more are asked for than the machine has slows down in proportion.
 */
import { InvalidArgumentError } from '../errors.js';
import { type Action, type Schedule, IdTable, createSchedule, unitNumber } from './schedule.js';
import { type TimedAction, timeSchedule, timedActions } from './timeline.js';
import { type ScheduleAnalysis, validateSchedule } from './validate.js';
import { timeScheduleSharedCores } from './shared-cores.js';
import { checkKnownKeys, describeValue, optionKeys } from '../validate.js';

/** A cost for every part, or one per part (index = part). @category Pipeline schedules */
export type PerPart = number | readonly number[];

/** Costs in any time unit (the results are in the same unit), sizes in bytes. @category Pipeline schedules */
export interface SimulationCosts {
  /** Forward time of a micro-batch on a part. Default 1. */
  readonly forward?: PerPart;
  /** Full backward time (input and weight gradients) of a micro-batch on a part. Default 2. */
  readonly backward?: PerPart;
  /**
   * Weight-gradient share of `backward`, used where a schedule splits the backward (zero-bubble):
   * its B then costs `backward - weightGrad` and its W `weightGrad`. Default `backward / 2`.
   */
  readonly weightGrad?: PerPart;
  /** Optimizer step of a part. Default 0. */
  readonly optimizerStep?: PerPart;
  /** Weight prediction, stash, restore, elastic averaging. Default 0. */
  readonly predict?: PerPart;
  readonly stash?: PerPart;
  readonly restore?: PerPart;
  readonly elastic?: PerPart;
  /** All-reduce of a part's gradient, once every participant has reached it. Default 0. */
  readonly allReduce?: PerPart;
  /** Point-to-point latency. Default 0. */
  readonly p2pLatency?: number;
  /** Point-to-point bandwidth in bytes per time unit. Default Infinity. */
  readonly p2pBandwidth?: number;
  /** Bytes of a micro-batch's boundary activation (and of its gradient) leaving a part. Default 0. */
  readonly activationBytes?: PerPart;
  /** Bytes a part keeps per stored micro-batch for its backward. Default `activationBytes`. */
  readonly storedActivationBytes?: PerPart;
  /** Bytes of one weight version of a part. Default 0. */
  readonly weightBytes?: PerPart;
  /** Bytes of optimizer state (momenta) of a part, held once per replica. Default 0. */
  readonly optimizerStateBytes?: PerPart;
  /**
   * The stages share a machine's cores instead of each having its own device (the default,
   * `undefined`): the costs above are then each pass's time alone, and passes that run at once
   * share the cores (docs/pipeline.md, "Stages sharing cores").
   */
  readonly sharedCores?: SharedCores;
}

/**
 * Stages as threads sharing `cores` (processor sharing): while the running passes ask for more
 * cores than there are, each runs at `cores / (cores asked)` of its speed alone.
 *
 * @category Pipeline schedules
 */
export interface SharedCores {
  /** Cores of the machine (`os.availableParallelism()`), > 0. */
  readonly cores: number;
  /**
   * Cores a pass of a part uses when it runs alone: 1 for a single-threaded pass, up to the
   * native thread pool's size for one whose products are split across it. Default 1.
   */
  readonly passCores?: PerPart;
  /**
   * `per-stage` (default): a row of the schedule is one thread. `per-pipeline`: each pipeline's
   * actions of a row are a thread of their own, as the runtime runs parallel pipelines (AvgPipe's N
   * pipelines on N x S workers).
   */
  readonly threads?: 'per-stage' | 'per-pipeline';
  /**
   * CPU time the message carrying part j's output between two stages (its activation forward, or
   * the gradient of it backward) costs the shared cores beside the passes: the transport's copy and
   * the wake-ups at both ends (on the runtime's `local` backend, a few tens of microseconds; see
   * `MachineProfile.messageCpu`). It takes its share of the cores from the moment the producing
   * pass ends, like a pass of demand 1, and delays no message by itself (`p2pLatency` is the
   * travel time). Default 0.
   */
  readonly messageCpu?: PerPart;
}

/** What a simulation gives. Arrays are indexed by stage. @category Pipeline schedules */
export interface SimulationResult {
  readonly schedule: Schedule;
  readonly analysis: ScheduleAnalysis;
  readonly timeline: readonly (readonly TimedAction[])[];
  /** Time from start to the end of the last action. */
  readonly makespan: number;
  /** Engine time spent on actions, per stage. */
  readonly busy: readonly number[];
  /**
   * Idle share of all stages' time: `1 - sum(busy) / (stages * makespan)`; with
   * `sharedCores.threads: 'per-pipeline'`, of all threads' time (stages x pipelines).
   */
  readonly bubbleFraction: number;
  /** Micro-batches completed (all pipelines) per time unit. */
  readonly throughput: number;
  /** Most bytes of stored activations at once, per stage. */
  readonly peakActivationBytes: readonly number[];
  /** Weight versions, optimizer state and peak stored activations, per stage. */
  readonly peakMemoryBytes: readonly number[];
}

function perPart(name: string, value: PerPart | undefined, parts: number, fallback: (part: number) => number): number[] {
  const out: number[] = [];
  for (let j = 0; j < parts; j++) {
    let v: unknown;
    if (value === undefined) v = fallback(j);
    else if (typeof value === 'number') v = value;
    else if (Array.isArray(value)) {
      if (value.length !== parts) throw new InvalidArgumentError(`costs.${name} has ${value.length} entries; give one per part (${parts}) or a single number`);
      v = value[j];
    } else throw new InvalidArgumentError(`costs.${name} must be a number or an array of numbers`);
    if (typeof v !== 'number' || !Number.isFinite(v) || v < 0) {
      throw new InvalidArgumentError(`costs.${name}${typeof value === 'object' ? `[${j}]` : ''} must be a finite number >= 0, got ${describeValue(v)}`);
    }
    out.push(v);
  }
  return out;
}

/** Resolved per-part costs. */
interface Resolved {
  forward: number[];
  backward: number[];
  weightGrad: number[];
  optimizerStep: number[];
  predict: number[];
  stash: number[];
  restore: number[];
  elastic: number[];
  allReduce: number[];
  activationBytes: number[];
  storedActivationBytes: number[];
  weightBytes: number[];
  optimizerStateBytes: number[];
  latency: number;
  bandwidth: number;
  shared: { cores: number; passCores: number[]; threads: 'per-stage' | 'per-pipeline'; messageCpu: number[] } | undefined;
}

const COST_KEYS = optionKeys<SimulationCosts>({
  forward: true,
  backward: true,
  weightGrad: true,
  optimizerStep: true,
  predict: true,
  stash: true,
  restore: true,
  elastic: true,
  allReduce: true,
  p2pLatency: true,
  p2pBandwidth: true,
  activationBytes: true,
  storedActivationBytes: true,
  weightBytes: true,
  optimizerStateBytes: true,
  sharedCores: true,
});
const SHARED_CORES_KEYS = optionKeys<SharedCores>({ cores: true, passCores: true, threads: true, messageCpu: true });

function resolveCosts(costs: SimulationCosts, parts: number): Resolved {
  if (costs === null || typeof costs !== 'object' || Array.isArray(costs)) {
    throw new InvalidArgumentError(`costs must be an object (e.g. { forward: 1, backward: 2 }), got ${describeValue(costs)}`);
  }
  // a misspelled cost would otherwise be left at its default without a word
  checkKnownKeys(costs, COST_KEYS, 'simulateSchedule(schedule, costs)');
  const forward = perPart('forward', costs.forward, parts, () => 1);
  const backward = perPart('backward', costs.backward, parts, () => 2);
  const weightGrad = perPart('weightGrad', costs.weightGrad, parts, (j) => backward[j]! / 2);
  weightGrad.forEach((w, j) => {
    if (w > backward[j]!) throw new InvalidArgumentError(`costs.weightGrad (${w}) exceeds costs.backward (${backward[j]}) for part ${j}; it is a share of it`);
  });
  const zero = (): number => 0;
  const activationBytes = perPart('activationBytes', costs.activationBytes, parts, zero);
  const latency = costs.p2pLatency ?? 0;
  const bandwidth = costs.p2pBandwidth ?? Infinity;
  if (typeof latency !== 'number' || !Number.isFinite(latency) || latency < 0) throw new InvalidArgumentError(`costs.p2pLatency must be a finite number >= 0, got ${describeValue(latency)}`);
  if (typeof bandwidth !== 'number' || Number.isNaN(bandwidth) || bandwidth <= 0) throw new InvalidArgumentError(`costs.p2pBandwidth must be a number > 0 (Infinity allowed), got ${describeValue(bandwidth)}`);
  return {
    forward,
    backward,
    weightGrad,
    optimizerStep: perPart('optimizerStep', costs.optimizerStep, parts, zero),
    predict: perPart('predict', costs.predict, parts, zero),
    stash: perPart('stash', costs.stash, parts, zero),
    restore: perPart('restore', costs.restore, parts, zero),
    elastic: perPart('elastic', costs.elastic, parts, zero),
    allReduce: perPart('allReduce', costs.allReduce, parts, zero),
    activationBytes,
    storedActivationBytes: perPart('storedActivationBytes', costs.storedActivationBytes, parts, (j) => activationBytes[j]!),
    weightBytes: perPart('weightBytes', costs.weightBytes, parts, zero),
    optimizerStateBytes: perPart('optimizerStateBytes', costs.optimizerStateBytes, parts, zero),
    latency,
    bandwidth,
    shared: resolveSharedCores(costs.sharedCores, parts),
  };
}

function resolveSharedCores(value: SharedCores | undefined, parts: number): Resolved['shared'] {
  if (value === undefined) return undefined;
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    throw new InvalidArgumentError(`costs.sharedCores must be an object { cores, passCores?, threads?, messageCpu? }, got ${describeValue(value)}`);
  }
  checkKnownKeys(value, SHARED_CORES_KEYS, 'costs.sharedCores');
  const cores = value.cores;
  if (typeof cores !== 'number' || Number.isNaN(cores) || cores <= 0) throw new InvalidArgumentError(`costs.sharedCores.cores must be a number > 0 (Infinity allowed), got ${describeValue(cores)}`);
  const passCores = perPart('sharedCores.passCores', value.passCores, parts, () => 1);
  passCores.forEach((d, j) => {
    if (!(d > 0)) throw new InvalidArgumentError(`costs.sharedCores.passCores${typeof value.passCores === 'object' ? `[${j}]` : ''} must be > 0, got ${d}`);
  });
  const threads = value.threads ?? 'per-stage';
  if (threads !== 'per-stage' && threads !== 'per-pipeline') throw new InvalidArgumentError(`costs.sharedCores.threads must be 'per-stage' or 'per-pipeline', got ${describeValue(threads)}`);
  const messageCpu = perPart('sharedCores.messageCpu', value.messageCpu, parts, () => 0);
  return { cores, passCores, threads, messageCpu };
}

/**
 * Validates and simulates a schedule. Throws InvalidScheduleError for a broken schedule and
 * InvalidArgumentError for bad costs.
 *
 * @category Pipeline schedules
 */
export function simulateSchedule(schedule: Schedule, costs: SimulationCosts = {}): SimulationResult {
  const analysis = validateSchedule(schedule);
  // validateSchedule checked it; createSchedule now returns the checked, frozen schedule itself
  const checked = createSchedule(schedule);
  const c = resolveCosts(costs, checked.parts);
  const M = checked.microBatches;
  const P = checked.parts;
  const total = checked.actions.reduce((n, row) => n + row.length, 0);
  // units whose backward is split into B and W (zero-bubble schedules)
  const split = new IdTable(checked.pipelines * M * P, total);
  for (const row of checked.actions) for (const a of row) if (a.kind === 'weightGrad') split.set(unitNumber(a.pipeline, a.microBatch, a.part, M, P), 1);
  const isSplit = (a: Action): boolean => split.get(unitNumber(a.pipeline, a.microBatch, a.part, M, P)) > 0;
  const duration = (a: Action): number => {
    const j = a.part;
    switch (a.kind) {
      case 'forward':
        return c.forward[j]!;
      case 'backward':
        return isSplit(a) ? c.backward[j]! - c.weightGrad[j]! : c.backward[j]!;
      case 'weightGrad':
        return c.weightGrad[j]!;
      case 'optimizerStep':
        return c.optimizerStep[j]!;
      case 'predictWeights':
        return c.predict[j]!;
      case 'stashWeights':
        return c.stash[j]!;
      case 'restoreWeights':
        return c.restore[j]!;
      case 'elasticAverage':
        return c.elastic[j]!;
      default:
        return 0;
    }
  };
  const model = {
    duration,
    // an activation into part j left part j-1; a gradient into part j left part j+1 and has the size of part j's output
    transfer: (kind: 'activation' | 'gradient', part: number) => c.latency + (kind === 'activation' ? c.activationBytes[part - 1]! : c.activationBytes[part]!) / c.bandwidth,
    allReduce: (a: Action) => c.allReduce[a.part]!,
  };
  const shared = c.shared;
  const times =
    shared === undefined
      ? timeSchedule(checked, model)
      : timeScheduleSharedCores(checked, model, {
          cores: shared.cores,
          threads: shared.threads,
          demand: (a) => shared.passCores[a.part]!,
          // an activation into part j carries part j-1's output; a gradient into part j, part j's
          ...(shared.messageCpu.some((x) => x > 0) ? { messageCpu: (kind: 'activation' | 'gradient', part: number) => shared.messageCpu[kind === 'activation' ? part - 1 : part]! } : {}),
        });
  let makespan = 0;
  const busy = checked.actions.map((row, s) => {
    let sum = 0;
    const base = times.flat.rowStart[s]!;
    for (let i = 0; i < row.length; i++) {
      const end = times.end[base + i]!;
      makespan = Math.max(makespan, end);
      if (row[i]!.kind !== 'allReduce') sum += end - times.start[base + i]!;
    }
    return sum;
  });
  if (!Number.isFinite(makespan)) {
    throw new InvalidArgumentError(
      'costs: the simulated times overflow (the makespan is not a finite number); give the costs in a larger unit, ' +
        'so that their sum over the schedule stays below about 1e300',
    );
  }
  const totalBusy = busy.reduce((x, y) => x + y, 0);
  // with a thread per pipeline on each row, a row's busy time sums its threads'
  const threads = checked.stages * (c.shared?.threads === 'per-pipeline' ? checked.pipelines : 1);
  const bubbleFraction = makespan > 0 ? 1 - totalBusy / (threads * makespan) : 0;
  const peakActivationBytes = checked.actions.map((row) => {
    let live = 0;
    let peak = 0;
    for (const a of row) {
      const releases = a.kind === 'weightGrad' || (a.kind === 'backward' && !isSplit(a));
      if (a.kind === 'forward') peak = Math.max(peak, (live += c.storedActivationBytes[a.part]!));
      else if (releases) live -= c.storedActivationBytes[a.part]!;
    }
    return peak;
  });
  const peakMemoryBytes = peakActivationBytes.slice();
  for (const r of analysis.replicas) peakMemoryBytes[r.stage]! += r.versionsHeld * c.weightBytes[r.part]! + c.optimizerStateBytes[r.part]!;
  const completed = schedule.pipelines * schedule.microBatches;
  const result: SimulationResult = {
    schedule,
    analysis,
    timeline: [],
    makespan,
    busy,
    bubbleFraction,
    throughput: makespan > 0 ? completed / makespan : Infinity,
    peakActivationBytes,
    peakMemoryBytes,
  };
  // The timeline's per-action objects are made when first read: the figures above come from the
  // times directly, and a caller that only wants them (the tuner simulates hundreds of settings)
  // is spared millions of objects. Reading it once turns it into an ordinary property.
  let timeline: TimedAction[][] | undefined;
  Object.defineProperty(result, 'timeline', {
    enumerable: true,
    configurable: true,
    get(): TimedAction[][] {
      timeline ??= timedActions(checked, times);
      // (a result frozen before its first read keeps the getter, which then returns the same rows)
      if (Object.getOwnPropertyDescriptor(result, 'timeline')?.configurable) {
        Object.defineProperty(result, 'timeline', { value: timeline, enumerable: true, configurable: true, writable: true });
      }
      return timeline;
    },
  });
  return result;
}
