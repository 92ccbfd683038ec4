/**
 * The schedule validator and analyser. Checks, in this order, that: the shape is sound; every
 * (pipeline, micro-batch, part) is forwarded and backwarded exactly once, its backward (and weight
 * gradient) on the stage of its forward; every input is produced earlier on the same stage or
 * received earlier from the stage that produced it; sends and receives pair up; and the schedule
 * runs to the end when every send blocks until its receive is posted (rendezvous, the strictest
 * blocking point-to-point). Then it measures activations, weight versions and staleness.
 */
import { InvalidArgumentError, InvalidScheduleError } from '../errors.js';
import { type Action, type Schedule, createSchedule, formatAction, p2pKinds, unitKey } from './schedule.js';
import { checkInteger, checkObject, describeValue } from '../validate.js';
import { collectiveKey, messageOf } from './timeline.js';

/** Staleness of one micro-batch's gradient on one stage and part. @category Pipeline schedules */
export interface StalenessEntry {
  readonly stage: number;
  readonly part: number;
  readonly pipeline: number;
  readonly microBatch: number;
  /** Version the forward read. */
  readonly readVersion: number;
  /** Version the gradient was applied to, or null if no optimizer step applies it. */
  readonly appliedTo: number | null;
  /** `appliedTo - readVersion`: optimizer steps between the two; null if never applied. */
  readonly staleness: number | null;
}

/** One set of weights: a part of one pipeline's model on one stage. @category Pipeline schedules */
export interface ReplicaAnalysis {
  readonly stage: number;
  readonly pipeline: number;
  readonly part: number;
  /** Most weight versions held at once (current, stashed copies still to be read, predicted copy). */
  readonly versionsHeld: number;
  /** Optimizer steps taken. */
  readonly updates: number;
}

/** What the validator measures. Arrays indexed by stage. @category Pipeline schedules */
export interface ScheduleAnalysis {
  /** Forwards a stage runs before its first backward (all pipelines and parts). */
  readonly forwardsBeforeFirstBackward: readonly number[];
  /** Most micro-batch activations stored at once (forward done, backward or weight gradient not yet). */
  readonly peakActivations: readonly number[];
  /** Most weight versions any one replica on the stage holds at once. */
  readonly weightVersions: readonly number[];
  /** Largest staleness on the stage (0 if none applied). */
  readonly maxStaleness: readonly number[];
  readonly replicas: readonly ReplicaAnalysis[];
  readonly staleness: readonly StalenessEntry[];
  /** Gradients computed but never applied by an optimizer step. */
  readonly unappliedGradients: number;
}

interface Location {
  readonly stage: number;
  readonly index: number;
}

const describe = (s: number, i: number, a: Action): string => `stage ${s}, action #${i} (${formatAction(a)})`;

function fail(s: number, i: number, a: Action, problem: string): never {
  throw new InvalidScheduleError(`${describe(s, i, a)}: ${problem}`);
}

/**
 * Validates a schedule and returns its analysis. Throws {@link InvalidScheduleError} naming the
 * first broken action, and saying what to change.
 *
 * @category Pipeline schedules
 */
export function validateSchedule(input: Schedule): ScheduleAnalysis {
  if (input === null || typeof input !== 'object') throw new InvalidArgumentError('validateSchedule expects a Schedule');
  const schedule = createSchedule(input);
  const { stages: S, parts: P, pipelines: N, microBatches: M } = schedule;
  const rows = schedule.actions;

  // 1. Where each unit's forward, backward and weight gradient run; each at most once.
  const loc = { F: new Map<string, Location>(), B: new Map<string, Location>(), W: new Map<string, Location>() };
  const sends = new Map<string, Location>();
  const recvs = new Map<string, Location>();
  rows.forEach((row, s) =>
    row.forEach((a, i) => {
      const letter = a.kind === 'forward' ? 'F' : a.kind === 'backward' ? 'B' : a.kind === 'weightGrad' ? 'W' : undefined;
      if (letter !== undefined) {
        const key = unitKey(a.pipeline, a.microBatch, a.part);
        const seen = loc[letter].get(key);
        if (seen) {
          fail(s, i, a, `${a.kind} of micro-batch ${a.microBatch} (part ${a.part}, pipeline ${a.pipeline}) runs a second time ` +
            `(first at stage ${seen.stage}, action #${seen.index}); remove one of them`);
        }
        loc[letter].set(key, { stage: s, index: i });
      } else if (p2pKinds.has(a.kind)) {
        const map = a.kind === 'sendActivation' || a.kind === 'sendGradient' ? sends : recvs;
        const id = messageOf(a)!;
        const seen = map.get(id);
        if (seen) fail(s, i, a, `the same message is already handled at stage ${seen.stage}, action #${seen.index}; remove the duplicate`);
        map.set(id, { stage: s, index: i });
      }
    }),
  );

  // 2. Local order: inputs produced before use, on this stage or received from their producer.
  rows.forEach((row, s) => {
    const done = new Set<string>();
    const counts = new Map<string, number>();
    row.forEach((a, i) => {
      const unit = unitKey(a.pipeline, a.microBatch, a.part);
      const replica = `${a.pipeline}:${a.part}`;
      const needLocal = (key: string, what: string): void => {
        if (!done.has(key)) fail(s, i, a, `${what} has not run on this stage before it; move it after that action`);
      };
      const needInput = (prodKey: string, prod: Location | undefined, msg: string, what: string, recvText: string): void => {
        if (prod === undefined) fail(s, i, a, `${what} never runs anywhere in the schedule; add it`);
        if (prod.stage === s) needLocal(prodKey, what);
        else if (!done.has(`recv:${msg}`)) {
          fail(s, i, a, `its input from stage ${prod.stage} (${what}) is not received before it; insert ${recvText} before it ` +
            'or build the schedule with withCommunication()');
        }
      };
      const checkVersion = (): void => {
        const current = counts.get(replica) ?? 0;
        if (a.version > current) {
          fail(s, i, a, `reads weight version ${a.version}, but only versions up to ${current} exist on this stage at that point`);
        }
      };
      switch (a.kind) {
        case 'forward': {
          if (a.part > 0) {
            const prodKey = unitKey(a.pipeline, a.microBatch, a.part - 1);
            const msg = messageOf({ ...a, kind: 'recvActivation' })!;
            const prod = loc.F.get(prodKey);
            const recvText = `"${s}ra${a.microBatch}${a.part !== s ? `/${a.part}` : ''}${a.pipeline ? `p${a.pipeline}` : ''}<${prod?.stage ?? '?'}"`;
            needInput(`F${prodKey}`, prod, msg, `the forward of part ${a.part - 1}`, recvText);
          }
          checkVersion();
          done.add(`F${unit}`);
          break;
        }
        case 'backward': {
          const fwd = loc.F.get(unit);
          if (fwd === undefined) fail(s, i, a, 'its micro-batch is never forwarded on this part; add the forward');
          if (fwd.stage !== s) fail(s, i, a, `must run on stage ${fwd.stage}, where its forward ran and its activations are`);
          needLocal(`F${unit}`, 'its forward');
          if (a.part < P - 1) {
            const prodKey = unitKey(a.pipeline, a.microBatch, a.part + 1);
            const msg = messageOf({ ...a, kind: 'recvGradient' })!;
            const prod = loc.B.get(prodKey);
            const recvText = `"${s}rg${a.microBatch}${a.part !== s ? `/${a.part}` : ''}${a.pipeline ? `p${a.pipeline}` : ''}<${prod?.stage ?? '?'}"`;
            needInput(`B${prodKey}`, prod, msg, `the backward of part ${a.part + 1}`, recvText);
          }
          checkVersion();
          done.add(`B${unit}`);
          break;
        }
        case 'weightGrad': {
          const b = loc.B.get(unit);
          if (b !== undefined && b.stage !== s) fail(s, i, a, `must run on stage ${b.stage}, where its backward ran`);
          needLocal(`B${unit}`, 'its backward');
          checkVersion();
          done.add(`W${unit}`);
          break;
        }
        case 'sendActivation':
        case 'sendGradient': {
          const isAct = a.kind === 'sendActivation';
          needLocal(`${isAct ? 'F' : 'B'}${unit}`, `the ${isAct ? 'forward' : 'backward'} whose output it sends`);
          const targetPart = isAct ? a.part + 1 : a.part - 1;
          if (targetPart < 0 || targetPart >= P) fail(s, i, a, `part ${a.part} has no ${isAct ? 'next' : 'previous'} part to send to; remove it`);
          const target = (isAct ? loc.F : loc.B).get(unitKey(a.pipeline, a.microBatch, targetPart));
          if (target === undefined || target.stage !== a.peer) {
            fail(s, i, a, `part ${targetPart} of this micro-batch runs on ${target === undefined ? 'no stage' : `stage ${target.stage}`}, not on stage ${a.peer}; send it there`);
          }
          break;
        }
        case 'recvActivation':
        case 'recvGradient': {
          const isAct = a.kind === 'recvActivation';
          const sourcePart = isAct ? a.part - 1 : a.part + 1;
          if (sourcePart < 0 || sourcePart >= P) fail(s, i, a, `part ${a.part} has no ${isAct ? 'previous' : 'next'} part to receive from; remove it`);
          const source = (isAct ? loc.F : loc.B).get(unitKey(a.pipeline, a.microBatch, sourcePart));
          if (source === undefined || source.stage !== a.peer) {
            fail(s, i, a, `part ${sourcePart} of this micro-batch runs on ${source === undefined ? 'no stage' : `stage ${source.stage}`}, not on stage ${a.peer}; receive from there`);
          }
          if (!sends.has(messageOf(a)!)) fail(s, i, a, `stage ${a.peer} never sends this message; add the matching send there`);
          done.add(`recv:${messageOf(a)!}`);
          break;
        }
        case 'restoreWeights':
          needLocal(`S${unit}`, 'the stash of this weight version');
          break;
        case 'stashWeights':
          done.add(`S${unit}`);
          break;
        case 'optimizerStep':
          counts.set(replica, (counts.get(replica) ?? 0) + 1);
          break;
        default:
          break;
      }
    });
  });
  for (const [id, at] of sends) {
    if (!recvs.has(id)) {
      const a = rows[at.stage]![at.index]!;
      fail(at.stage, at.index, a, `stage ${a.peer} never receives this message; add the matching receive there`);
    }
  }
  for (let p = 0; p < N; p++) {
    for (let m = 0; m < M; m++) {
      for (let j = 0; j < P; j++) {
        const key = unitKey(p, m, j);
        for (const [letter, word] of [['F', 'forwarded'], ['B', 'backwarded']] as const) {
          if (!loc[letter].has(key)) {
            throw new InvalidScheduleError(
              `pipeline ${p}, micro-batch ${m}, part ${j} is never ${word}; every micro-batch must be forwarded and ` +
                'backwarded once on every part of every pipeline (or lower microBatches/pipelines)',
            );
          }
        }
      }
    }
  }

  checkNoDeadlock(schedule);
  return analyse(schedule, loc.W);
}

/** Runs the schedule with rendezvous sends; throws if some stages wait on each other forever. */
function checkNoDeadlock(schedule: Schedule): void {
  const rows = schedule.actions;
  const S = schedule.stages;
  const pc = new Array<number>(S).fill(0);
  const participants = new Map<string, number>();
  rows.forEach((row) => row.forEach((a) => a.kind === 'allReduce' && participants.set(collectiveKey(a), (participants.get(collectiveKey(a)) ?? 0) + 1)));
  const reached = new Map<string, number>();
  const issued: Action[][] = Array.from({ length: S }, () => []);
  const current = (s: number): Action | undefined => rows[s]![pc[s]!];
  let remaining = rows.reduce((n, row) => n + row.length, 0);
  while (remaining > 0) {
    let progressed = false;
    for (let s = 0; s < S; s++) {
      for (;;) {
        const a = current(s);
        if (a === undefined) break;
        if (p2pKinds.has(a.kind)) {
          const other = current(a.peer);
          const isSend = a.kind === 'sendActivation' || a.kind === 'sendGradient';
          const pairs =
            other !== undefined &&
            other.peer === s &&
            messageOf(other) === messageOf(a) &&
            (isSend ? other.kind === 'recvActivation' || other.kind === 'recvGradient' : other.kind === 'sendActivation' || other.kind === 'sendGradient');
          if (!pairs) break;
          pc[s]!++;
          pc[a.peer]!++;
          remaining -= 2;
          progressed = true;
          continue;
        }
        if (a.kind === 'optimizerStep') {
          const waiting = issued[s]!.some(
            (r) =>
              r.part === a.part &&
              (a.microBatch < 0 || r.microBatch <= a.microBatch) &&
              reached.get(collectiveKey(r))! < participants.get(collectiveKey(r))!,
          );
          if (waiting) break;
        }
        if (a.kind === 'allReduce') {
          reached.set(collectiveKey(a), (reached.get(collectiveKey(a)) ?? 0) + 1);
          issued[s]!.push(a);
        }
        pc[s]!++;
        remaining--;
        progressed = true;
      }
    }
    if (!progressed) {
      const waits: string[] = [];
      let first: string | undefined;
      for (let s = 0; s < S; s++) {
        const a = current(s);
        if (a === undefined) continue;
        const here = describe(s, pc[s]!, a);
        first ??= here;
        if (p2pKinds.has(a.kind)) {
          const other = current(a.peer);
          waits.push(`${here} waits for stage ${a.peer}, which is at ${other === undefined ? 'its end' : `#${pc[a.peer]} (${formatAction(other)})`}`);
        } else {
          waits.push(`${here} waits for an all-reduce that not every stage reaches`);
        }
      }
      throw new InvalidScheduleError(
        `deadlock under blocking point-to-point at ${first}: ${waits.join('; ')}. Reorder the sends and receives so that ` +
          'every stage meets its exchanges in the same order (withCommunication() places them so)',
      );
    }
  }
}

function analyse(schedule: Schedule, weightGrads: ReadonlyMap<string, Location>): ScheduleAnalysis {
  const S = schedule.stages;
  const forwardsBeforeFirstBackward: number[] = [];
  const peakActivations: number[] = [];
  const weightVersions: number[] = [];
  const maxStaleness: number[] = [];
  const replicas: ReplicaAnalysis[] = [];
  const staleness: StalenessEntry[] = [];
  let unapplied = 0;
  for (let s = 0; s < S; s++) {
    const row = schedule.actions[s]!;
    let forwards = 0;
    let firstBackward: number | undefined;
    let live = 0;
    let peak = 0;
    const counts = new Map<string, number>();
    const readF = new Map<string, number>();
    const pending = new Map<string, { microBatch: number; unit: string; pipeline: number; part: number }[]>();
    // per replica, the versions read in order and the current version at each read
    const reads = new Map<string, { version: number; current: number }[]>();
    const predicted = new Set<string>();
    const replicaKeys = new Set<string>();
    for (const a of row) {
      const replica = `${a.pipeline}:${a.part}`;
      const unit = unitKey(a.pipeline, a.microBatch, a.part);
      const count = counts.get(replica) ?? 0;
      const resolved = a.version >= 0 ? a.version : count;
      if (a.kind === 'forward' || a.kind === 'backward' || a.kind === 'weightGrad' || a.kind === 'optimizerStep' || a.kind === 'predictWeights') {
        replicaKeys.add(replica);
      }
      switch (a.kind) {
        case 'forward':
          forwards++;
          live++;
          peak = Math.max(peak, live);
          readF.set(unit, resolved);
          break;
        case 'backward':
        case 'weightGrad': {
          if (a.kind === 'backward') firstBackward ??= forwards;
          const last = a.kind === 'weightGrad' || !weightGrads.has(unit);
          if (last) {
            live--;
            const list = pending.get(replica) ?? [];
            list.push({ microBatch: a.microBatch, unit, pipeline: a.pipeline, part: a.part });
            pending.set(replica, list);
          }
          break;
        }
        case 'optimizerStep': {
          const list = pending.get(replica) ?? [];
          const keep: typeof list = [];
          for (const g of list) {
            if (a.microBatch >= 0 && g.microBatch > a.microBatch) {
              keep.push(g);
              continue;
            }
            const read = readF.get(g.unit) ?? 0;
            staleness.push({ stage: s, part: g.part, pipeline: g.pipeline, microBatch: g.microBatch, readVersion: read, appliedTo: count, staleness: count - read });
          }
          pending.set(replica, keep);
          counts.set(replica, count + 1);
          break;
        }
        case 'predictWeights':
          predicted.add(replica);
          break;
        default:
          break;
      }
      if (a.kind === 'forward' || a.kind === 'backward' || a.kind === 'weightGrad') {
        const list = reads.get(replica) ?? [];
        list.push({ version: resolved, current: count });
        reads.set(replica, list);
      }
    }
    for (const list of pending.values()) {
      for (const g of list) {
        unapplied++;
        staleness.push({ stage: s, part: g.part, pipeline: g.pipeline, microBatch: g.microBatch, readVersion: readF.get(g.unit) ?? 0, appliedTo: null, staleness: null });
      }
    }
    let stageVersions = 0;
    for (const replica of replicaKeys) {
      const list = reads.get(replica) ?? [];
      const lastRead = new Map<number, number>();
      list.forEach((r, i) => lastRead.set(r.version, i));
      let held = 1;
      list.forEach((r, i) => {
        let old = 0;
        for (const [v, last] of lastRead) if (v < r.current && last >= i) old++;
        held = Math.max(held, 1 + old);
      });
      if (predicted.has(replica)) held++;
      const [pipeline, part] = replica.split(':').map(Number) as [number, number];
      replicas.push({ stage: s, pipeline, part, versionsHeld: held, updates: counts.get(replica) ?? 0 });
      stageVersions = Math.max(stageVersions, held);
    }
    forwardsBeforeFirstBackward.push(firstBackward ?? forwards);
    peakActivations.push(peak);
    weightVersions.push(stageVersions);
    maxStaleness.push(staleness.filter((e) => e.stage === s && e.staleness !== null).reduce((m, e) => Math.max(m, e.staleness!), 0));
  }
  return { forwardsBeforeFirstBackward, peakActivations, weightVersions, maxStaleness, replicas, staleness, unappliedGradients: unapplied };
}

/**
 * The staleness of each micro-batch (index = micro-batch) on one stage, part and pipeline; null
 * where the gradient is never applied or the micro-batch does not run there.
 *
 * @category Pipeline schedules
 */
export function stalenessOf(
  analysis: ScheduleAnalysis,
  where: { stage: number; part?: number; pipeline?: number },
  microBatches: number,
): (number | null)[] {
  if (analysis === null || typeof analysis !== 'object' || !Array.isArray(analysis.staleness))
    throw new InvalidArgumentError(`stalenessOf: pass the analysis that validateSchedule() returns, got ${describeValue(analysis)}`);
  checkObject(where, 'stalenessOf(analysis, where): where');
  checkInteger(where.stage, 'stalenessOf: where.stage', 0, Number.MAX_SAFE_INTEGER);
  checkInteger(microBatches, 'stalenessOf: microBatches', 0, 1 << 20);
  const part = checkInteger(where.part ?? where.stage, 'stalenessOf: where.part', 0, Number.MAX_SAFE_INTEGER);
  const pipeline = checkInteger(where.pipeline ?? 0, 'stalenessOf: where.pipeline', 0, Number.MAX_SAFE_INTEGER);
  const out = new Array<number | null>(microBatches).fill(null);
  for (const e of analysis.staleness) {
    if (e.stage === where.stage && e.part === part && e.pipeline === pipeline && e.microBatch < microBatches) out[e.microBatch] = e.staleness;
  }
  return out;
}
