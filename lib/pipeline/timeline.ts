/**
 * The event core shared by the simulator and by communication placement: every stage runs its
 * list in order on one engine; an action starts when the engine is free and its inputs have
 * arrived. Sends are asynchronous (posted when their data is produced, costing the sender
 * nothing; the message travels for `transfer`); receives wait for arrival; all-reduces start when every stage taking part has
 * reached them, run beside compute, and an optimizer step waits for the reductions it applies.
 */
import { InvalidScheduleError } from '../errors.js';
import { type Action, type FlatIndex, type Schedule, IdTable, ReductionNumbering, StageWakeQueue, flatIndex, formatAction, reductionLane, unitKey, unitNumber } from './schedule.js';

/** How long things take; supplied by the simulator (real costs) or by placement (unit costs). @category Pipeline schedules */
export interface TimingModel {
  /** Engine time of an action (sends, receives and all-reduces are given 0 by the core). */
  duration(action: Action): number;
  /** Travel time of the message that feeds `consumer` (an activation into a forward, a gradient into a backward). */
  transfer(kind: 'activation' | 'gradient', part: number): number;
  /** Duration of an all-reduce once every participant has reached it. */
  allReduce(action: Action): number;
}

/** An action with its times. For an all-reduce, `start`/`end` span the reduction itself. @category Pipeline schedules */
export interface TimedAction {
  readonly action: Action;
  readonly start: number;
  readonly end: number;
  /** Index in its stage's list. */
  readonly index: number;
}

/** Message id for the input of a forward (`a`) or backward (`g`) of a unit. */
function messageKey(kind: 'a' | 'g', pipeline: number, microBatch: number, part: number): string {
  return `${kind}${unitKey(pipeline, microBatch, part)}`;
}

/** The message a send or receive action carries. @category Pipeline schedules */
export function messageOf(a: Action): string | undefined {
  switch (a.kind) {
    case 'sendActivation':
      return messageKey('a', a.pipeline, a.microBatch, a.part + 1);
    case 'recvActivation':
      return messageKey('a', a.pipeline, a.microBatch, a.part);
    case 'sendGradient':
      return messageKey('g', a.pipeline, a.microBatch, a.part - 1);
    case 'recvGradient':
      return messageKey('g', a.pipeline, a.microBatch, a.part);
    default:
      return undefined;
  }
}

/** Key matching the stages that take part in one all-reduce. @category Pipeline schedules */
export function collectiveKey(a: Action): string {
  return `${a.pipeline}:${a.part}:${a.microBatch}`;
}

/**
 * Start and end of every action, by position in {@link FlatIndex} order; for an all-reduce, the
 * span of the reduction itself.
 *
 * @internal
 */
export interface Times {
  readonly flat: FlatIndex;
  readonly start: Float64Array;
  readonly end: Float64Array;
}

/**
 * Times a schedule. Throws {@link InvalidScheduleError} if some stage can never proceed (an input
 * that is never produced, or produced later on the same stage).
 *
 * @category Pipeline schedules
 */
export function computeTimeline(schedule: Schedule, model: TimingModel): TimedAction[][] {
  return timedActions(schedule, timeSchedule(schedule, model));
}

/** The per-action objects of {@link computeTimeline} from the times of {@link timeSchedule}. @internal */
export function timedActions(schedule: Schedule, times: Times): TimedAction[][] {
  const { flat, start, end } = times;
  return schedule.actions.map((row, s) => {
    const base = flat.rowStart[s]!;
    const out = new Array<TimedAction>(row.length);
    for (let i = 0; i < row.length; i++) out[i] = { action: row[i]!, start: start[base + i]!, end: end[base + i]!, index: i };
    return out;
  });
}

/**
 * The event core. Each stage runs its list in order until an action's inputs are not yet known,
 * then waits; a stage is looked at again only when something it waits for has happened (the stage
 * that produces its input moved on, or the all-reduce its step waits for completed), so the work
 * is proportional to the number of actions. Times do not depend on the order stages are looked at
 * in: an action starts at `max(engine free, inputs ready)`, and both are fixed once known.
 *
 * @internal
 */
export function timeSchedule(schedule: Schedule, model: TimingModel): Times {
  const S = schedule.stages;
  const P = schedule.parts;
  const M = schedule.microBatches;
  const rows = schedule.actions;
  const flat = flatIndex(rows);
  const { rowStart, stageOf, total } = flat;
  const unit = (a: Action, part: number): number => unitNumber(a.pipeline, a.microBatch, part, M, P);

  // Where each unit's forward and backward run (the last one, should a broken schedule hold two).
  const units = schedule.pipelines * M * P;
  const forwardAt = new IdTable(units, total);
  const backwardAt = new IdTable(units, total);
  // All-reduces: one number per (pipeline, part, micro-batch), and how many actions take part.
  const numbering = new ReductionNumbering(M, P);
  const reduceOf = (a: Action): number => numbering.of(a);
  const { participants, microBatch: reduceMicroBatch } = numbering;
  const lane = reductionLane(schedule);
  for (let s = 0; s < S; s++) {
    const row = rows[s]!;
    for (let i = 0; i < row.length; i++) {
      const a = row[i]!;
      const f = rowStart[s]! + i;
      if (a.kind === 'forward') forwardAt.set(unit(a, a.part), f);
      else if (a.kind === 'backward') backwardAt.set(unit(a, a.part), f);
      else if (a.kind === 'allReduce') {
        numbering.add(a);
      }
    }
  }
  const reductions = participants.length;
  const reached = new Int32Array(reductions);
  const reachedLast = new Float64Array(reductions).fill(-Infinity);
  const completion = new Float64Array(reductions).fill(NaN);
  const reduceWaiters: (number[] | undefined)[] = new Array(reductions);

  const start = new Float64Array(total);
  const end = new Float64Array(total).fill(NaN);
  const pc = new Int32Array(S);
  const free = new Float64Array(S);
  // Per stage and part (and wave: reductionLane), the all-reduces issued that no optimizer step has
  // waited for yet. A step waits for those of its part up to its micro-batch; one that an earlier step on the stage
  // waited for is complete and ended before that step, so before this one starts: dropping it
  // changes no start time and keeps each step's look to what is new.
  const uncovered: Map<number, number[]>[] = Array.from({ length: S }, () => new Map());
  // where the step a stage is held at stopped looking, and the latest completion it had seen
  const scanAt = new Int32Array(S);
  const scanMax = new Float64Array(S);
  // Stages to wake when stage t moves on.
  const wake = new StageWakeQueue(S);

  // What the last readyTime() that returned NaN waits for: a stage, or an all-reduce (-2 - r);
  // -1: something that never comes.
  let waitFor = -1;
  const endOf = (producer: number): number => {
    if (producer < 0) {
      waitFor = -1;
      return NaN;
    }
    const t = end[producer]!;
    if (Number.isNaN(t)) waitFor = stageOf[producer]!;
    return t;
  };
  // Arrival of the input of a forward/backward (or a receive) of `part` on `stage`; NaN while unknown.
  const arrival = (gradient: boolean, a: Action, stage: number): number => {
    const from = gradient ? a.part + 1 : a.part - 1;
    if (from < 0 || from >= P) {
      waitFor = -1;
      return NaN;
    }
    const producer = (gradient ? backwardAt : forwardAt).get(unit(a, from));
    const produced = endOf(producer);
    if (Number.isNaN(produced)) return NaN;
    if (stageOf[producer] === stage) return produced;
    // Sends are posted as soon as their data exists (isend); where the send action sits in the
    // sender's list matters for deadlock under blocking sends, which the validator checks, not here.
    return produced + model.transfer(gradient ? 'gradient' : 'activation', a.part);
  };
  const readyTime = (a: Action, s: number): number => {
    switch (a.kind) {
      case 'forward':
        return a.part === 0 ? 0 : arrival(false, a, s);
      case 'backward': {
        const fwd = endOf(forwardAt.get(unit(a, a.part)));
        if (Number.isNaN(fwd)) return NaN;
        if (a.part === P - 1) return fwd;
        const grad = arrival(true, a, s);
        return Number.isNaN(grad) ? NaN : Math.max(fwd, grad);
      }
      case 'weightGrad':
        return endOf(backwardAt.get(unit(a, a.part)));
      case 'recvActivation':
        return arrival(false, a, s);
      case 'recvGradient':
        return arrival(true, a, s);
      case 'optimizerStep': {
        // A step looked at again resumes where it stopped: the stage is held at the step, so its
        // list gains nothing, and what it already passed has completed for good.
        const list = uncovered[s]!.get(lane(a, s)) ?? [];
        let t = scanMax[s]!;
        for (let k = scanAt[s]!; k < list.length; k++) {
          const r = list[k]!;
          if (a.microBatch < 0 || reduceMicroBatch[r]! <= a.microBatch) {
            const done = completion[r]!;
            if (Number.isNaN(done)) {
              scanAt[s] = k;
              scanMax[s] = t;
              waitFor = -2 - r;
              return NaN;
            }
            t = Math.max(t, done);
          }
        }
        return t;
      }
      default:
        return 0;
    }
  };

  let remaining = total;
  for (let s = wake.next(); s >= 0; s = wake.next()) {
    const row = rows[s]!;
    const base = rowStart[s]!;
    let progressed = false;
    while (pc[s]! < row.length) {
      const i = pc[s]!;
      const a = row[i]!;
      const f = base + i;
      const ready = readyTime(a, s);
      if (Number.isNaN(ready)) {
        if (waitFor >= 0) wake.wait(s, waitFor);
        else if (waitFor <= -2) (reduceWaiters[-2 - waitFor] ??= []).push(s);
        break;
      }
      const begin = Math.max(free[s]!, ready);
      start[f] = begin;
      if (a.kind === 'allReduce') {
        const r = reduceOf(a);
        reached[r]!++;
        reachedLast[r] = Math.max(reachedLast[r]!, begin);
        const list = uncovered[s]!.get(lane(a, s));
        if (list === undefined) uncovered[s]!.set(lane(a, s), [r]);
        else list.push(r);
        end[f] = begin;
        if (reached[r] === participants[r]) {
          completion[r] = reachedLast[r]! + model.allReduce(a);
          for (const w of reduceWaiters[r] ?? []) wake.push(w);
          reduceWaiters[r] = undefined;
        }
      } else {
        const p2p = a.kind === 'sendActivation' || a.kind === 'sendGradient' || a.kind === 'recvActivation' || a.kind === 'recvGradient';
        const finish = p2p ? begin : begin + model.duration(a);
        end[f] = finish;
        free[s] = finish;
        if (a.kind === 'optimizerStep') {
          const list = uncovered[s]!.get(lane(a, s));
          if (list !== undefined) uncovered[s]!.set(lane(a, s), a.microBatch < 0 ? [] : list.filter((r) => reduceMicroBatch[r]! > a.microBatch));
          scanAt[s] = 0;
          scanMax[s] = 0;
        }
      }
      pc[s] = i + 1;
      remaining--;
      progressed = true;
    }
    if (progressed) wake.moved(s);
  }
  if (remaining > 0) {
    const blocked: string[] = [];
    for (let s = 0; s < S; s++) if (pc[s]! < rows[s]!.length) blocked.push(`stage ${s} at #${pc[s]} (${formatAction(rows[s]![pc[s]!]!)})`);
    throw new InvalidScheduleError(
      `the schedule cannot run to the end: ${blocked.join('; ')} wait for inputs that never arrive; ` +
        'check the order of these actions with validateSchedule()',
    );
  }
  // An all-reduce spans the reduction itself, now that every one has completed.
  if (reductions > 0) {
    for (let s = 0; s < S; s++) {
      const row = rows[s]!;
      for (let i = 0; i < row.length; i++) {
        if (row[i]!.kind !== 'allReduce') continue;
        const r = reduceOf(row[i]!);
        start[rowStart[s]! + i] = reachedLast[r]!;
        end[rowStart[s]! + i] = completion[r]!;
      }
    }
  }
  return { flat, start, end };
}
