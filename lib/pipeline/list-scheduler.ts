/**
 * Greedy list scheduling of forward/backward/weight-gradient tasks, for schedules defined by a
 * rule ("run a backward if one is ready, else a forward if memory allows, else a weight
 * gradient") rather than by a fixed per-stage pattern. Time advances in event order, so the
 * choice at each moment sees exactly the tasks whose inputs have arrived.
 */
import { InternalError } from '../errors.js';
import { type Action, unitKey } from './schedule.js';

/** A task whose inputs have all arrived by `ready`. @category Pipeline schedules */
export interface ReadyTask {
  readonly action: Action;
  readonly ready: number;
}

/** @category Pipeline schedules */
export interface ListScheduleOptions {
  readonly stages: number;
  readonly parts: number;
  /** Compute actions (forward, backward, weightGrad), each on the stage that must run it. */
  readonly tasks: readonly Action[];
  duration(a: Action): number;
  /** Delay of a message between two different stages. */
  readonly transfer: number;
  /**
   * The tasks a stage may run next if their inputs have arrived (for example the head of each
   * pipeline's queue). Keeping this small keeps scheduling fast.
   */
  frontier(stage: number): readonly Action[];
  /** Chooses among the tasks available at this moment, or returns undefined to wait. */
  pick(stage: number, available: readonly ReadyTask[]): Action | undefined;
  /** Told of each choice once it is final. */
  onPlace?(stage: number, a: Action): void;
}

const letter = (a: Action): string => (a.kind === 'forward' ? 'F' : a.kind === 'backward' ? 'B' : 'W');

/** Returns, per stage, the tasks in the order the rule runs them. @category Pipeline schedules */
export function listSchedule(options: ListScheduleOptions): Action[][] {
  const { stages, parts, tasks } = options;
  const byKey = new Map<string, Action>();
  for (const a of tasks) byKey.set(`${letter(a)}${unitKey(a.pipeline, a.microBatch, a.part)}`, a);
  const end = new Map<Action, number>();
  const deps = (a: Action): Action[] => {
    const u = (l: string, part: number): Action | undefined => byKey.get(`${l}${unitKey(a.pipeline, a.microBatch, part)}`);
    const list: (Action | undefined)[] =
      a.kind === 'forward' ? (a.part > 0 ? [u('F', a.part - 1)] : []) : a.kind === 'backward' ? [u('F', a.part), ...(a.part < parts - 1 ? [u('B', a.part + 1)] : [])] : [u('B', a.part)];
    return list.filter((d): d is Action => d !== undefined);
  };
  const dependents = new Map<Action, Action[]>();
  const missing = new Map<Action, number>();
  const readyAt = new Map<Action, number>();
  for (const a of tasks) {
    const ds = deps(a);
    missing.set(a, ds.length);
    for (const d of ds) {
      const list = dependents.get(d);
      if (list) list.push(a);
      else dependents.set(d, [a]);
    }
    if (ds.length === 0) readyAt.set(a, 0);
  }
  const free = new Array<number>(stages).fill(0);
  const order: Action[][] = Array.from({ length: stages }, () => []);
  for (let placed = 0; placed < tasks.length; placed++) {
    let best: { stage: number; time: number; action: Action } | undefined;
    for (let s = 0; s < stages; s++) {
      const ready: ReadyTask[] = [];
      for (const a of options.frontier(s)) {
        const at = readyAt.get(a);
        if (at !== undefined && !end.has(a)) ready.push({ action: a, ready: at });
      }
      const times = [...new Set(ready.map((r) => Math.max(r.ready, free[s]!)))].sort((x, y) => x - y);
      for (const time of times) {
        if (best !== undefined && time >= best.time) break;
        const available = ready.filter((r) => r.ready <= time);
        if (available.length === 0) continue;
        const choice = options.pick(s, available);
        if (choice !== undefined) {
          best = { stage: s, time, action: choice };
          break;
        }
      }
    }
    if (best === undefined) throw new InternalError('list scheduling found no runnable task; the scheduling rule waits forever');
    const { stage, time, action } = best;
    const finish = time + options.duration(action);
    end.set(action, finish);
    free[stage] = finish;
    order[stage]!.push(action);
    options.onPlace?.(stage, action);
    for (const next of dependents.get(action) ?? []) {
      const left = missing.get(next)! - 1;
      missing.set(next, left);
      if (left === 0) {
        const at = Math.max(...deps(next).map((d) => end.get(d)! + (d.stage === next.stage ? 0 : options.transfer)));
        readyAt.set(next, at);
      }
    }
  }
  return order;
}
