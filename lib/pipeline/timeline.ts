/**
 * The event core shared by the simulator and by communication placement: every stage runs its
 * list in order on one engine; an action starts when the engine is free and its inputs have
 * arrived. Sends are asynchronous (posted when their data is produced, costing the sender
 * nothing; the message travels for `transfer`); receives wait for arrival; all-reduces start when every stage taking part has
 * reached them, run beside compute, and an optimizer step waits for the reductions it applies.
 */
import { InvalidScheduleError } from '../errors.js';
import { type Action, type Schedule, formatAction, unitKey } from './schedule.js';

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
 * Times a schedule. Throws {@link InvalidScheduleError} if some stage can never proceed (an input
 * that is never produced, or produced later on the same stage).
 *
 * @category Pipeline schedules
 */
export function computeTimeline(schedule: Schedule, model: TimingModel): TimedAction[][] {
  const S = schedule.stages;
  const producers = new Map<string, { stage: number; index: number }>();
  const participants = new Map<string, number>();
  schedule.actions.forEach((row, s) =>
    row.forEach((a, i) => {
      if (a.kind === 'forward' || a.kind === 'backward') {
        producers.set(`${a.kind === 'forward' ? 'F' : 'B'}${unitKey(a.pipeline, a.microBatch, a.part)}`, { stage: s, index: i });
      } else if (a.kind === 'allReduce') {
        const key = collectiveKey(a);
        participants.set(key, (participants.get(key) ?? 0) + 1);
      }
    }),
  );
  const timed: (TimedAction | undefined)[][] = schedule.actions.map((row) => new Array<TimedAction | undefined>(row.length));
  const reached = new Map<string, number[]>();
  const completion = new Map<string, number>();
  // all-reduces issued so far per stage, to find those an optimizer step waits for
  const issued: { key: string; pipeline: number; part: number; microBatch: number }[][] = Array.from({ length: S }, () => []);
  const pc = new Array<number>(S).fill(0);
  const free = new Array<number>(S).fill(0);

  const endOf = (key: string): number | undefined => {
    const at = producers.get(key);
    return at === undefined ? undefined : timed[at.stage]![at.index]?.end;
  };
  // Arrival of the input of a forward/backward on `stage`; undefined while unknown.
  const arrival = (kind: 'a' | 'g', a: Action, stage: number): number | undefined => {
    const part = a.part;
    const producerKey = kind === 'a' ? `F${unitKey(a.pipeline, a.microBatch, part - 1)}` : `B${unitKey(a.pipeline, a.microBatch, part + 1)}`;
    const at = producers.get(producerKey);
    if (at === undefined) return undefined;
    const produced = timed[at.stage]![at.index]?.end;
    if (produced === undefined) return undefined;
    if (at.stage === stage) return produced;
    // Sends are posted as soon as their data exists (isend); where the send action sits in the
    // sender's list matters for deadlock under blocking sends, which the validator checks, not here.
    return produced + model.transfer(kind === 'a' ? 'activation' : 'gradient', part);
  };

  const readyTime = (a: Action, s: number): number | undefined => {
    switch (a.kind) {
      case 'forward':
        return a.part === 0 ? 0 : arrival('a', a, s);
      case 'backward': {
        const fwd = endOf(`F${unitKey(a.pipeline, a.microBatch, a.part)}`);
        if (fwd === undefined) return undefined;
        if (a.part === schedule.parts - 1) return fwd;
        const grad = arrival('g', a, s);
        return grad === undefined ? undefined : Math.max(fwd, grad);
      }
      case 'weightGrad':
        return endOf(`B${unitKey(a.pipeline, a.microBatch, a.part)}`);
      case 'recvActivation':
        return arrival('a', a, s);
      case 'recvGradient':
        return arrival('g', { ...a, part: a.part }, s);
      case 'optimizerStep': {
        let t = 0;
        for (const r of issued[s]!) {
          if (r.part !== a.part) continue;
          if (a.microBatch >= 0 && r.microBatch > a.microBatch) continue;
          const done = completion.get(r.key);
          if (done === undefined) return undefined;
          t = Math.max(t, done);
        }
        return t;
      }
      default:
        return 0;
    }
  };

  let remaining = schedule.actions.reduce((n, row) => n + row.length, 0);
  while (remaining > 0) {
    let progressed = false;
    for (let s = 0; s < S; s++) {
      const row = schedule.actions[s]!;
      while (pc[s]! < row.length) {
        const i = pc[s]!;
        const a = row[i]!;
        const ready = readyTime(a, s);
        if (ready === undefined) break;
        const start = Math.max(free[s]!, ready);
        let end = start;
        if (a.kind === 'allReduce') {
          const key = collectiveKey(a);
          const list = reached.get(key) ?? [];
          list.push(start);
          reached.set(key, list);
          issued[s]!.push({ key, pipeline: a.pipeline, part: a.part, microBatch: a.microBatch });
          if (list.length === participants.get(key)) {
            const begin = Math.max(...list);
            completion.set(key, begin + model.allReduce(a));
          }
          timed[s]![i] = { action: a, start, end: start, index: i };
        } else {
          if (!(a.kind === 'sendActivation' || a.kind === 'sendGradient' || a.kind === 'recvActivation' || a.kind === 'recvGradient')) {
            end = start + model.duration(a);
          }
          timed[s]![i] = { action: a, start, end, index: i };
          free[s] = end;
        }
        pc[s] = i + 1;
        remaining--;
        progressed = true;
      }
    }
    if (!progressed) {
      const blocked = pc
        .map((i, s) => (i < schedule.actions[s]!.length ? `stage ${s} at #${i} (${formatAction(schedule.actions[s]![i]!)})` : ''))
        .filter((x) => x !== '');
      throw new InvalidScheduleError(
        `the schedule cannot run to the end: ${blocked.join('; ')} wait for inputs that never arrive; ` +
          'check the order of these actions with validateSchedule()',
      );
    }
  }
  // Re-stamp all-reduces with the span of the reduction itself, now that every one has completed.
  return timed.map((row) =>
    row.map((t) => {
      const ta = t!;
      if (ta.action.kind !== 'allReduce') return ta;
      const key = collectiveKey(ta.action);
      const end = completion.get(key) ?? ta.start;
      const begin = Math.max(...(reached.get(key) ?? [ta.start]));
      return { ...ta, start: begin, end };
    }),
  );
}
