/**
 * The schedule validator and analyser. Checks, in this order, that: the shape is sound; every
 * (pipeline, micro-batch, part) is forwarded and backwarded exactly once, its backward (and weight
 * gradient) on the stage of its forward; every input is produced earlier on the same stage or
 * received earlier from the stage that produced it; sends and receives pair up; and the schedule
 * runs to the end when every send blocks until its receive is posted (rendezvous, the strictest
 * blocking point-to-point). Then it measures activations, weight versions and staleness.
 */
import { InvalidArgumentError, InvalidScheduleError } from '../errors.js';
import { type Action, type FlatIndex, type Schedule, IdTable, ReductionNumbering, StageWakeQueue, createSchedule, flatIndex, formatAction, p2pKinds, reductionLane, scheduleLimits, unitNumber } from './schedule.js';
import { checkInteger, checkObject, describeValue } from '../validate.js';

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

const describe = (s: number, i: number, a: Action): string => `stage ${s}, action #${i} (${formatAction(a)})`;

function fail(s: number, i: number, a: Action, problem: string): never {
  throw new InvalidScheduleError(`${describe(s, i, a)}: ${problem}`);
}

const isSend = (a: Action): boolean => a.kind === 'sendActivation' || a.kind === 'sendGradient';
const isGradientMessage = (a: Action): boolean => a.kind === 'sendGradient' || a.kind === 'recvGradient';
/** The part whose input a send or receive carries (out of range for a send with no next or previous part). */
const consumerPart = (a: Action): number => (a.kind === 'sendActivation' ? a.part + 1 : a.kind === 'sendGradient' ? a.part - 1 : a.part);

/**
 * Validates a schedule and returns its analysis. Throws {@link InvalidScheduleError} naming the
 * first broken action, and saying what to change.
 *
 * @category Pipeline schedules
 */
export function validateSchedule(input: Schedule): ScheduleAnalysis {
  if (input === null || typeof input !== 'object') throw new InvalidArgumentError(`validateSchedule expects a Schedule, got ${describeValue(input)}`);
  const schedule = createSchedule(input);
  const { stages: S, parts: P, pipelines: N, microBatches: M } = schedule;
  const rows = schedule.actions;
  const flat = flatIndex(rows);
  const { rowStart, stageOf, total } = flat;
  const unitOf = (a: Action, part: number): number => unitNumber(a.pipeline, a.microBatch, part, M, P);
  const stageAt = (f: number): number => stageOf[f]!;
  const indexAt = (f: number): number => f - rowStart[stageOf[f]!]!;

  // 1. Where each unit's forward, backward and weight gradient run; each at most once. Messages
  // are numbered by the unit that consumes them, with room for the part before the first and
  // after the last (a send from the last part has nowhere to go, which step 2 reports).
  const units = N * M * P;
  const loc = { F: new IdTable(units, total), B: new IdTable(units, total), W: new IdTable(units, total) };
  const messages = N * M * (P + 2);
  const messageOf = (a: Action): number => (a.pipeline * M + a.microBatch) * (P + 2) + consumerPart(a) + 1;
  const sends = { a: new IdTable(messages, total), g: new IdTable(messages, total) };
  const recvs = { a: new IdTable(messages, total), g: new IdTable(messages, total) };
  const sendOrder: number[] = [];
  for (let s = 0; s < S; s++) {
    const row = rows[s]!;
    for (let i = 0; i < row.length; i++) {
      const a = row[i]!;
      const f = rowStart[s]! + i;
      const letter = a.kind === 'forward' ? 'F' : a.kind === 'backward' ? 'B' : a.kind === 'weightGrad' ? 'W' : undefined;
      if (letter !== undefined) {
        const key = unitOf(a, a.part);
        const seen = loc[letter].get(key);
        if (seen >= 0) {
          fail(s, i, a, `${a.kind} of micro-batch ${a.microBatch} (part ${a.part}, pipeline ${a.pipeline}) runs a second time ` +
            `(first at stage ${stageAt(seen)}, action #${indexAt(seen)}); remove one of them`);
        }
        loc[letter].set(key, f);
      } else if (p2pKinds.has(a.kind)) {
        const table = (isSend(a) ? sends : recvs)[isGradientMessage(a) ? 'g' : 'a'];
        const id = messageOf(a);
        const seen = table.get(id);
        if (seen >= 0) fail(s, i, a, `the same message is already handled at stage ${stageAt(seen)}, action #${indexAt(seen)}; remove the duplicate`);
        table.set(id, f);
        if (isSend(a)) sendOrder.push(f);
      }
    }
  }

  // 2. Local order: inputs produced before use, on this stage or received from their producer.
  // The forward, backward and receive of a unit run once (step 1), so "done on this stage before
  // action i" is "placed on this stage at an index below i".
  const doneHere = (at: number, s: number, i: number): boolean => at >= 0 && stageAt(at) === s && indexAt(at) < i;
  // (helpers take the position rather than close over it: they run once per action)
  const needLocal = (s: number, i: number, a: Action, at: number, what: string): void => {
    if (!doneHere(at, s, i)) fail(s, i, a, `${what} has not run on this stage before it; move it after that action`);
  };
  const needInput = (s: number, i: number, a: Action, prod: number, gradient: boolean): void => {
    const what = (): string => (gradient ? `the backward of part ${a.part + 1}` : `the forward of part ${a.part - 1}`);
    if (prod < 0) fail(s, i, a, `${what()} never runs anywhere in the schedule; add it`);
    if (stageAt(prod) === s) {
      if (!doneHere(prod, s, i)) needLocal(s, i, a, prod, what());
    } else if (!doneHere(recvs[gradient ? 'g' : 'a'].get((a.pipeline * M + a.microBatch) * (P + 2) + a.part + 1), s, i)) {
      const recvText = `"${s}${gradient ? 'rg' : 'ra'}${a.microBatch}${a.part !== s ? `/${a.part}` : ''}${a.pipeline ? `p${a.pipeline}` : ''}<${stageAt(prod)}"`;
      fail(s, i, a, `its input from stage ${stageAt(prod)} (${what()}) is not received before it; insert ${recvText} before it ` +
        'or build the schedule with withCommunication()');
    }
  };
  const checkVersion = (s: number, i: number, a: Action, counts: Map<number, number>): void => {
    // every replica has version 0, so only a later one needs looking up
    if (a.version <= 0) return;
    const current = counts.get(a.pipeline * P + a.part) ?? 0;
    if (a.version > current) {
      fail(s, i, a, `reads weight version ${a.version}, but only versions up to ${current} exist on this stage at that point`);
    }
  };
  for (let s = 0; s < S; s++) {
    const row = rows[s]!;
    const counts = new Map<number, number>();
    const stashed = new Set<number>();
    for (let i = 0; i < row.length; i++) {
      const a = row[i]!;
      const unit = unitOf(a, a.part);
      switch (a.kind) {
        case 'forward':
          if (a.part > 0) needInput(s, i, a, loc.F.get(unitOf(a, a.part - 1)), false);
          checkVersion(s, i, a, counts);
          break;
        case 'backward': {
          const fwd = loc.F.get(unit);
          if (fwd < 0) fail(s, i, a, 'its micro-batch is never forwarded on this part; add the forward');
          if (stageAt(fwd) !== s) fail(s, i, a, `must run on stage ${stageAt(fwd)}, where its forward ran and its activations are`);
          needLocal(s, i, a, fwd, 'its forward');
          if (a.part < P - 1) needInput(s, i, a, loc.B.get(unitOf(a, a.part + 1)), true);
          checkVersion(s, i, a, counts);
          break;
        }
        case 'weightGrad': {
          const b = loc.B.get(unit);
          if (b >= 0 && stageAt(b) !== s) fail(s, i, a, `must run on stage ${stageAt(b)}, where its backward ran`);
          needLocal(s, i, a, b, 'its backward');
          checkVersion(s, i, a, counts);
          break;
        }
        case 'sendActivation':
        case 'sendGradient': {
          const isAct = a.kind === 'sendActivation';
          const own = (isAct ? loc.F : loc.B).get(unit);
          if (!doneHere(own, s, i)) needLocal(s, i, a, own, `the ${isAct ? 'forward' : 'backward'} whose output it sends`);
          const targetPart = isAct ? a.part + 1 : a.part - 1;
          if (targetPart < 0 || targetPart >= P) fail(s, i, a, `part ${a.part} has no ${isAct ? 'next' : 'previous'} part to send to; remove it`);
          const target = (isAct ? loc.F : loc.B).get(unitOf(a, targetPart));
          if (target < 0 || stageAt(target) !== a.peer) {
            fail(s, i, a, `part ${targetPart} of this micro-batch runs on ${target < 0 ? 'no stage' : `stage ${stageAt(target)}`}, not on stage ${a.peer}; send it there`);
          }
          break;
        }
        case 'recvActivation':
        case 'recvGradient': {
          const isAct = a.kind === 'recvActivation';
          const sourcePart = isAct ? a.part - 1 : a.part + 1;
          if (sourcePart < 0 || sourcePart >= P) fail(s, i, a, `part ${a.part} has no ${isAct ? 'previous' : 'next'} part to receive from; remove it`);
          const source = (isAct ? loc.F : loc.B).get(unitOf(a, sourcePart));
          if (source < 0 || stageAt(source) !== a.peer) {
            fail(s, i, a, `part ${sourcePart} of this micro-batch runs on ${source < 0 ? 'no stage' : `stage ${stageAt(source)}`}, not on stage ${a.peer}; receive from there`);
          }
          if (sends[isAct ? 'a' : 'g'].get(messageOf(a)) < 0) fail(s, i, a, `stage ${a.peer} never sends this message; add the matching send there`);
          break;
        }
        case 'restoreWeights':
          if (!stashed.has(unit)) fail(s, i, a, 'the stash of this weight version has not run on this stage before it; move it after that action');
          break;
        case 'stashWeights':
          stashed.add(unit);
          break;
        case 'optimizerStep':
          counts.set(a.pipeline * P + a.part, (counts.get(a.pipeline * P + a.part) ?? 0) + 1);
          break;
        default:
          break;
      }
    }
  }
  for (const f of sendOrder) {
    const a = rows[stageAt(f)]![indexAt(f)]!;
    if (recvs[isGradientMessage(a) ? 'g' : 'a'].get(messageOf(a)) < 0) {
      fail(stageAt(f), indexAt(f), a, `stage ${a.peer} never receives this message; add the matching receive there`);
    }
  }
  // Every unit forwarded and backwarded; when all are, this visits each once, and otherwise it
  // stops at the first missing one, so its cost is bounded by the actions, not the declared sizes.
  for (let p = 0; p < N; p++) {
    for (let m = 0; m < M; m++) {
      for (let j = 0; j < P; j++) {
        const key = unitNumber(p, m, j, M, P);
        const missing = loc.F.get(key) < 0 ? 'forwarded' : loc.B.get(key) < 0 ? 'backwarded' : undefined;
        if (missing !== undefined) {
          throw new InvalidScheduleError(
            `pipeline ${p}, micro-batch ${m}, part ${j} is never ${missing}; every micro-batch must be forwarded and ` +
              'backwarded once on every part of every pipeline (or lower microBatches/pipelines)',
          );
        }
      }
    }
  }

  checkNoDeadlock(schedule, flat);
  return analyse(schedule, loc.W);
}

/**
 * Runs the schedule with rendezvous sends; throws if some stages wait on each other forever. Each
 * stage runs until it must wait, and is looked at again only when the stage it waits for has moved
 * on or the all-reduce it waits for is complete. Every stage has one next action and nothing that
 * may run stops being able to, so where the run ends does not depend on the order stages are
 * looked at in.
 */
function checkNoDeadlock(schedule: Schedule, flat: FlatIndex): void {
  const rows = schedule.actions;
  const S = schedule.stages;
  const P = schedule.parts;
  const M = schedule.microBatches;
  const { rowStart, total } = flat;
  // Per action (by flat position): what it is (1 send, 2 receive, with 4 added for a gradient; 8
  // an optimizer step, 9 an all-reduce, 0 anything else), and for a send or receive its peer and
  // the unit that consumes it: two ends pair when one sends and the other receives the same kind
  // of message for the same unit. Typed arrays rather than the action objects: the run jumps
  // between stages, and these keep what it reads at each step in a few cache lines (and small,
  // which spares the garbage collector work at millions of actions).
  const code = new Uint8Array(total);
  const peerOf = new Int16Array(total);
  const consumer = schedule.pipelines * M * P < 2 ** 31 ? new Int32Array(total) : new Float64Array(total);
  const numbering = new ReductionNumbering(M, P);
  const reduceOf = (a: Action): number => numbering.of(a);
  const { participants, microBatch: reduceMicroBatch } = numbering;
  const lane = reductionLane(schedule);
  for (let s = 0; s < S; s++) {
    const row = rows[s]!;
    for (let i = 0; i < row.length; i++) {
      const a = row[i]!;
      const f = rowStart[s]! + i;
      if (p2pKinds.has(a.kind)) {
        code[f] = (isSend(a) ? 1 : 2) + (isGradientMessage(a) ? 4 : 0);
        peerOf[f] = a.peer;
        consumer[f] = unitNumber(a.pipeline, a.microBatch, consumerPart(a), M, P);
      } else if (a.kind === 'optimizerStep') {
        code[f] = 8;
      } else if (a.kind === 'allReduce') {
        code[f] = 9;
        numbering.add(a);
      }
    }
  }
  // each stage's position, as a flat number
  const pos = rowStart.slice(0, S);
  const actionAt = (s: number, f: number): Action => rows[s]![f - rowStart[s]!]!;
  const reached = new Int32Array(participants.length);
  const complete = (r: number): boolean => reached[r]! >= participants[r]!;
  const reduceWaiters: (number[] | undefined)[] = new Array(participants.length);
  // per stage and part (and wave: reductionLane), the all-reduces issued that no optimizer step has waited for yet (one that
  // a step waited for is complete, and stays so)
  const uncovered: Map<number, number[]>[] = Array.from({ length: S }, () => new Map());
  const scanAt = new Int32Array(S);
  const wake = new StageWakeQueue(S);

  let remaining = total;
  for (let s = wake.next(); s >= 0; s = wake.next()) {
    const end = rowStart[s + 1]!;
    let f = pos[s]!;
    const from = f;
    while (f < end) {
      const c = code[f]!;
      if (c !== 0 && c < 8) {
        const peer = peerOf[f]!;
        const g = pos[peer]!;
        // a send (1, or 5 for a gradient) pairs with the receive of the same kind (2, or 6)
        const pairs = g < rowStart[peer + 1]! && code[g] === (c & 4) + 3 - (c & 3) && peerOf[g] === s && consumer[g] === consumer[f];
        if (!pairs) {
          wake.wait(s, peer);
          break;
        }
        f++;
        pos[peer] = g + 1;
        remaining -= 2;
        wake.push(peer);
        wake.moved(peer);
        continue;
      }
      if (c === 8) {
        const a = actionAt(s, f);
        const list = uncovered[s]!.get(lane(a, s));
        if (list !== undefined) {
          // a step looked at again resumes where it stopped (the stage is held, its list does not grow)
          let k = scanAt[s]!;
          while (k < list.length && !((a.microBatch < 0 || reduceMicroBatch[list[k]!]! <= a.microBatch) && !complete(list[k]!))) k++;
          if (k < list.length) {
            scanAt[s] = k;
            (reduceWaiters[list[k]!] ??= []).push(s);
            break;
          }
          scanAt[s] = 0;
          uncovered[s]!.set(lane(a, s), a.microBatch < 0 ? [] : list.filter((r) => reduceMicroBatch[r]! > a.microBatch));
        }
      } else if (c === 9) {
        const a = actionAt(s, f);
        const r = reduceOf(a);
        reached[r]!++;
        const list = uncovered[s]!.get(lane(a, s));
        if (list === undefined) uncovered[s]!.set(lane(a, s), [r]);
        else list.push(r);
        if (complete(r)) {
          for (const w of reduceWaiters[r] ?? []) wake.push(w);
          reduceWaiters[r] = undefined;
        }
      }
      f++;
      remaining--;
    }
    pos[s] = f;
    if (f > from) wake.moved(s);
  }
  if (remaining > 0) {
    const waits: string[] = [];
    let first: string | undefined;
    const pc = (s: number): number => pos[s]! - rowStart[s]!;
    const current = (s: number): Action | undefined => rows[s]![pc(s)];
    for (let s = 0; s < S; s++) {
      const a = current(s);
      if (a === undefined) continue;
      const here = describe(s, pc(s), a);
      first ??= here;
      if (p2pKinds.has(a.kind)) {
        const other = current(a.peer);
        waits.push(`${here} waits for stage ${a.peer}, which is at ${other === undefined ? 'its end' : `#${pc(a.peer)} (${formatAction(other)})`}`);
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

/** Gradients of one replica waiting for the optimizer step that applies them. */
interface Pending {
  /** Unapplied gradients as (micro-batch, arrival) pairs in a min-heap, so a step takes its own in log time. */
  readonly heap: { microBatch: number; seq: number; unit: number; pipeline: number; part: number }[];
  seq: number;
}

function heapPush<T extends { microBatch: number; seq: number }>(heap: T[], x: T): void {
  heap.push(x);
  let i = heap.length - 1;
  while (i > 0) {
    const up = (i - 1) >> 1;
    const p = heap[up]!;
    if (p.microBatch < x.microBatch || (p.microBatch === x.microBatch && p.seq < x.seq)) break;
    heap[i] = p;
    i = up;
  }
  heap[i] = x;
}

function heapPop<T extends { microBatch: number; seq: number }>(heap: T[]): T {
  const top = heap[0]!;
  const last = heap.pop()!;
  if (heap.length > 0) {
    let i = 0;
    for (;;) {
      const l = 2 * i + 1;
      if (l >= heap.length) break;
      const r = l + 1;
      const c = r < heap.length && (heap[r]!.microBatch < heap[l]!.microBatch || (heap[r]!.microBatch === heap[l]!.microBatch && heap[r]!.seq < heap[l]!.seq)) ? r : l;
      const child = heap[c]!;
      if (last.microBatch < child.microBatch || (last.microBatch === child.microBatch && last.seq < child.seq)) break;
      heap[i] = child;
      i = c;
    }
    heap[i] = last;
  }
  return top;
}

/**
 * The most weight versions a replica holds at once: at each read, 1 (the current version) plus
 * the older versions (below the version current at that read) that are read at or after it. A
 * Fenwick tree over version numbers counts the older ones still to be read, in log time per read.
 */
function versionsHeld(versions: readonly number[], currents: readonly number[]): number {
  let top = 0;
  for (const v of versions) top = Math.max(top, v);
  const lastRead = new Int32Array(top + 1).fill(-1);
  versions.forEach((v, i) => (lastRead[v] = i));
  const tree = new Int32Array(top + 2);
  const add = (v: number, d: number): void => {
    for (let x = v + 1; x < tree.length; x += x & -x) tree[x]! += d;
  };
  // versions below `v` still to be read
  const below = (v: number): number => {
    let sum = 0;
    for (let x = Math.min(v, top + 1); x > 0; x -= x & -x) sum += tree[x]!;
    return sum;
  };
  for (let v = 0; v <= top; v++) if (lastRead[v]! >= 0) add(v, 1);
  let held = 1;
  for (let i = 0; i < versions.length; i++) {
    held = Math.max(held, 1 + below(currents[i]!));
    if (lastRead[versions[i]!] === i) add(versions[i]!, -1);
  }
  return held;
}

function analyse(schedule: Schedule, weightGrads: IdTable): ScheduleAnalysis {
  const S = schedule.stages;
  const P = schedule.parts;
  const M = schedule.microBatches;
  const forwardsBeforeFirstBackward: number[] = [];
  const peakActivations: number[] = [];
  const weightVersions: number[] = [];
  const maxStaleness: number[] = [];
  const replicas: ReplicaAnalysis[] = [];
  const staleness: StalenessEntry[] = [];
  // the version each unit's forward read (a unit is forwarded once, on the stage of its backward)
  const readF = new IdTable(schedule.pipelines * M * P, schedule.actions.reduce((n, row) => n + row.length, 0));
  let unapplied = 0;
  for (let s = 0; s < S; s++) {
    const row = schedule.actions[s]!;
    let forwards = 0;
    let firstBackward: number | undefined;
    let live = 0;
    let peak = 0;
    let stageStaleness = 0;
    // per replica (pipeline * P + part), in the order the original analysis met them
    const counts = new Map<number, number>();
    const pending = new Map<number, Pending>();
    const readVersions = new Map<number, number[]>();
    const readCurrents = new Map<number, number[]>();
    const predicted = new Set<number>();
    const replicaKeys = new Set<number>();
    const record = (g: Pending['heap'][number], appliedTo: number | null): void => {
      const read = Math.max(readF.get(g.unit), 0);
      staleness.push({
        stage: s,
        part: g.part,
        pipeline: g.pipeline,
        microBatch: g.microBatch,
        readVersion: read,
        appliedTo,
        staleness: appliedTo === null ? null : appliedTo - read,
      });
      if (appliedTo !== null) stageStaleness = Math.max(stageStaleness, appliedTo - read);
    };
    const pendingOf = (replica: number): Pending => {
      let list = pending.get(replica);
      if (list === undefined) {
        list = { heap: [], seq: 0 };
        pending.set(replica, list);
      }
      return list;
    };
    for (const a of row) {
      const replica = a.pipeline * P + a.part;
      const count = counts.get(replica) ?? 0;
      const resolved = a.version >= 0 ? a.version : count;
      const compute = a.kind === 'forward' || a.kind === 'backward' || a.kind === 'weightGrad';
      if (compute || a.kind === 'optimizerStep' || a.kind === 'predictWeights') replicaKeys.add(replica);
      switch (a.kind) {
        case 'forward':
          forwards++;
          live++;
          peak = Math.max(peak, live);
          readF.set(unitNumber(a.pipeline, a.microBatch, a.part, M, P), resolved);
          break;
        case 'backward':
        case 'weightGrad': {
          if (a.kind === 'backward') firstBackward ??= forwards;
          const unit = unitNumber(a.pipeline, a.microBatch, a.part, M, P);
          const last = a.kind === 'weightGrad' || weightGrads.get(unit) < 0;
          if (last) {
            live--;
            const list = pendingOf(replica);
            heapPush(list.heap, { microBatch: a.microBatch, seq: list.seq++, unit, pipeline: a.pipeline, part: a.part });
          }
          break;
        }
        case 'optimizerStep': {
          const list = pendingOf(replica);
          const applied: Pending['heap'] = [];
          while (list.heap.length > 0 && (a.microBatch < 0 || list.heap[0]!.microBatch <= a.microBatch)) applied.push(heapPop(list.heap));
          // in the order the gradients arrived, as the analysis reports them
          applied.sort((x, y) => x.seq - y.seq);
          for (const g of applied) record(g, count);
          counts.set(replica, count + 1);
          break;
        }
        case 'predictWeights':
          predicted.add(replica);
          break;
        default:
          break;
      }
      if (compute) {
        let versions = readVersions.get(replica);
        if (versions === undefined) {
          versions = [];
          readVersions.set(replica, versions);
          readCurrents.set(replica, []);
        }
        versions.push(resolved);
        readCurrents.get(replica)!.push(count);
      }
    }
    for (const list of pending.values()) {
      const left = [...list.heap].sort((x, y) => x.seq - y.seq);
      for (const g of left) {
        unapplied++;
        record(g, null);
      }
    }
    let stageVersions = 0;
    for (const replica of replicaKeys) {
      let held = readVersions.has(replica) ? versionsHeld(readVersions.get(replica)!, readCurrents.get(replica)!) : 1;
      if (predicted.has(replica)) held++;
      const pipeline = Math.floor(replica / P);
      const part = replica - pipeline * P;
      replicas.push({ stage: s, pipeline, part, versionsHeld: held, updates: counts.get(replica) ?? 0 });
      stageVersions = Math.max(stageVersions, held);
    }
    forwardsBeforeFirstBackward.push(firstBackward ?? forwards);
    peakActivations.push(peak);
    weightVersions.push(stageVersions);
    maxStaleness.push(stageStaleness);
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
  checkInteger(microBatches, 'stalenessOf: microBatches', 0, scheduleLimits.microBatches);
  const part = checkInteger(where.part ?? where.stage, 'stalenessOf: where.part', 0, Number.MAX_SAFE_INTEGER);
  const pipeline = checkInteger(where.pipeline ?? 0, 'stalenessOf: where.pipeline', 0, Number.MAX_SAFE_INTEGER);
  const out = new Array<number | null>(microBatches).fill(null);
  for (const e of analysis.staleness) {
    if (e.stage === where.stage && e.part === part && e.pipeline === pipeline && e.microBatch < microBatches) out[e.microBatch] = e.staleness;
  }
  return out;
}
