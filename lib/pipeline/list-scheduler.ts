/**
 * Greedy list scheduling of forward/backward/weight-gradient tasks, for schedules defined by a
 * rule ("run a backward if one is ready, else a forward if memory allows, else a weight
 * gradient") rather than by a fixed per-stage pattern. Time advances in event order, so the
 * choice at each moment sees exactly the tasks whose inputs have arrived.
 */
import { InternalError } from '../errors.js';
import { type Action, IdTable, unitNumber } from './schedule.js';

/** A task whose inputs have all arrived by `ready`; `task` is its index in the task list. @category Pipeline schedules */
export interface ReadyTask {
  readonly action: Action;
  readonly ready: number;
  readonly task: number;
}

/**
 * The rule and the tasks. `frontier(s)` and `pick(s, ...)` may depend only on the choices already
 * made for stage `s` (as told by `onPlace`): each stage's next choice is worked out once and kept
 * until something it depends on changes.
 *
 * @category Pipeline schedules
 */
export interface ListScheduleOptions {
  readonly stages: number;
  readonly parts: number;
  /** Compute actions (forward, backward, weightGrad), each on the stage that must run it. */
  readonly tasks: readonly Action[];
  duration(a: Action): number;
  /** Delay of a message between two different stages. */
  readonly transfer: number;
  /**
   * The tasks (indices into `tasks`) a stage may run next if their inputs have arrived (for
   * example the head of each pipeline's queue). Keeping this small keeps scheduling fast; the
   * list is read before the next call, so one array may be reused.
   */
  frontier(stage: number): readonly number[];
  /** Chooses among the tasks available at this moment, or returns undefined to wait. The list is only valid during the call. */
  pick(stage: number, available: readonly ReadyTask[]): ReadyTask | undefined;
  /** Told of each choice once it is final. */
  onPlace?(stage: number, a: Action): void;
}

/**
 * Returns, per stage, the tasks in the order the rule runs them. At each step the earliest choice
 * over all stages is made (ties: the lowest stage). A priority queue holds each stage's next
 * choice, which changes only when the stage places a task or one of its tasks becomes ready, so a
 * step costs the work of the stages it touches rather than of every stage.
 *
 * @category Pipeline schedules
 */
export function listSchedule(options: ListScheduleOptions): Action[][] {
  const { stages, parts, tasks } = options;
  const n = tasks.length;
  let microBatches = 1;
  let pipelines = 1;
  for (const a of tasks) {
    microBatches = Math.max(microBatches, a.microBatch + 1);
    pipelines = Math.max(pipelines, a.pipeline + 1);
  }
  const letter = (a: Action): number => (a.kind === 'forward' ? 0 : a.kind === 'backward' ? 1 : 2);
  const keyOf = (l: number, a: Action, part: number): number => unitNumber(a.pipeline, a.microBatch, part, microBatches, parts) * 3 + l;
  const byKey = new IdTable(pipelines * microBatches * parts * 3, n);
  tasks.forEach((a, t) => byKey.set(keyOf(letter(a), a, a.part), t));
  // dependencies and dependents of each task, in task order (compressed rows)
  const stageOf = new Int32Array(n);
  const depStart = new Int32Array(n + 1);
  const depList: number[] = [];
  const dependentStart = new Int32Array(n + 1);
  const addDependency = (d: number): void => {
    if (d < 0) return;
    depList.push(d);
    dependentStart[d + 1]!++;
  };
  for (let t = 0; t < n; t++) {
    const a = tasks[t]!;
    stageOf[t] = a.stage;
    if (a.kind === 'forward') {
      if (a.part > 0) addDependency(byKey.get(keyOf(0, a, a.part - 1)));
    } else if (a.kind === 'backward') {
      addDependency(byKey.get(keyOf(0, a, a.part)));
      if (a.part < parts - 1) addDependency(byKey.get(keyOf(1, a, a.part + 1)));
    } else {
      addDependency(byKey.get(keyOf(1, a, a.part)));
    }
    depStart[t + 1] = depList.length;
  }
  const missing = new Int32Array(n);
  for (let t = 0; t < n; t++) missing[t] = depStart[t + 1]! - depStart[t]!;
  for (let t = 0; t < n; t++) dependentStart[t + 1]! += dependentStart[t]!;
  const dependents = new Int32Array(dependentStart[n]!);
  const fill = dependentStart.slice(0, n);
  for (let t = 0; t < n; t++) for (let k = depStart[t]!; k < depStart[t + 1]!; k++) dependents[fill[depList[k]!]!++] = t;
  const readyAt = new Float64Array(n).fill(NaN);
  const end = new Float64Array(n).fill(NaN);
  for (let t = 0; t < n; t++) if (missing[t] === 0) readyAt[t] = 0;

  const free = new Float64Array(stages);
  const version = new Int32Array(stages);
  // A binary heap of choices ordered by (time, stage), kept in parallel arrays: a choice is pushed
  // for every reconsideration, so this is the allocation that would otherwise dominate.
  let heapSize = 0;
  let heapTime = new Float64Array(64);
  let heapStage = new Int32Array(64);
  let heapTask = new Int32Array(64);
  let heapVersion = new Int32Array(64);
  const earlier = (i: number, j: number): boolean => heapTime[i]! < heapTime[j]! || (heapTime[i] === heapTime[j] && heapStage[i]! < heapStage[j]!);
  const move = (to: number, from: number): void => {
    heapTime[to] = heapTime[from]!;
    heapStage[to] = heapStage[from]!;
    heapTask[to] = heapTask[from]!;
    heapVersion[to] = heapVersion[from]!;
  };
  const push = (time: number, stage: number, task: number, v: number): void => {
    if (heapSize + 1 >= heapTime.length) {
      const grow = <T extends Float64Array | Int32Array>(x: T): T => {
        const y = new (x.constructor as new (n: number) => T)(x.length * 2);
        y.set(x);
        return y;
      };
      heapTime = grow(heapTime);
      heapStage = grow(heapStage);
      heapTask = grow(heapTask);
      heapVersion = grow(heapVersion);
    }
    // the new entry waits in the spare slot at the end while it sifts up
    const spare = heapTime.length - 1;
    heapTime[spare] = time;
    heapStage[spare] = stage;
    heapTask[spare] = task;
    heapVersion[spare] = v;
    let i = heapSize++;
    while (i > 0) {
      const up = (i - 1) >> 1;
      if (!earlier(spare, up)) break;
      move(i, up);
      i = up;
    }
    move(i, spare);
  };
  /** Removes the earliest choice into the spare slot at the end of the arrays. */
  const pop = (): number => {
    const spare = heapTime.length - 1;
    move(spare, 0);
    heapSize--;
    if (heapSize > 0) {
      // sift the last entry down from the root
      const last = heapSize;
      let i = 0;
      for (;;) {
        const l = 2 * i + 1;
        if (l >= heapSize) break;
        const c = l + 1 < heapSize && earlier(l + 1, l) ? l + 1 : l;
        if (!earlier(c, last)) break;
        move(i, c);
        i = c;
      }
      move(i, last);
    }
    return spare;
  };
  /** Works out stage s's next choice: the first moment at which the rule picks one of its ready tasks. */
  // Scratch space, reused: this runs once or more per task placed, and the rule only reads what it
  // is given during the call (a frontier is a few tasks).
  const times: number[] = [];
  const ready: { action: Action; ready: number; task: number }[] = [];
  const available: ReadyTask[] = [];
  const slot = (k: number): { action: Action; ready: number; task: number } => {
    while (ready.length <= k) ready.push({ action: tasks[0]!, ready: 0, task: 0 });
    return ready[k]!;
  };
  const reconsider = (s: number): void => {
    version[s]!++;
    let count = 0;
    for (const t of options.frontier(s)) {
      const at = readyAt[t]!;
      if (Number.isNaN(at) || !Number.isNaN(end[t]!)) continue;
      const r = slot(count++);
      r.action = tasks[t]!;
      r.ready = at;
      r.task = t;
    }
    // the distinct moments at which the choice can change, earliest first (an insertion sort)
    let distinct = 0;
    for (let k = 0; k < count; k++) {
      const time = Math.max(ready[k]!.ready, free[s]!);
      let i = distinct;
      while (i > 0 && times[i - 1]! > time) i--;
      if (i > 0 && times[i - 1] === time) continue;
      for (let j = distinct; j > i; j--) times[j] = times[j - 1]!;
      times[i] = time;
      distinct++;
    }
    for (let k = 0; k < distinct; k++) {
      const time = times[k]!;
      available.length = 0;
      for (let k = 0; k < count; k++) if (ready[k]!.ready <= time) available.push(ready[k]!);
      if (available.length === 0) continue;
      const choice = options.pick(s, available);
      if (choice !== undefined) {
        push(time, s, choice.task, version[s]!);
        return;
      }
    }
  };

  const order: Action[][] = Array.from({ length: stages }, () => []);
  for (let s = 0; s < stages; s++) reconsider(s);
  const touched: number[] = [];
  for (let placed = 0; placed < n; placed++) {
    let found = -1;
    while (heapSize > 0) {
      const c = pop();
      if (heapVersion[c] === version[heapStage[c]!]) {
        found = c;
        break;
      }
    }
    if (found < 0) throw new InternalError('list scheduling found no runnable task; the scheduling rule waits forever');
    const stage = heapStage[found]!;
    const time = heapTime[found]!;
    const task = heapTask[found]!;
    const action = tasks[task]!;
    const finish = time + options.duration(action);
    end[task] = finish;
    free[stage] = finish;
    order[stage]!.push(action);
    options.onPlace?.(stage, action);
    touched.length = 0;
    touched.push(stage);
    for (let k = dependentStart[task]!; k < dependentStart[task + 1]!; k++) {
      const next = dependents[k]!;
      const left = --missing[next]!;
      if (left === 0) {
        const nextStage = stageOf[next]!;
        let at = -Infinity;
        for (let j = depStart[next]!; j < depStart[next + 1]!; j++) {
          const d = depList[j]!;
          at = Math.max(at, end[d]! + (stageOf[d] === nextStage ? 0 : options.transfer));
        }
        readyAt[next] = at;
        if (!touched.includes(nextStage)) touched.push(nextStage);
      }
    }
    for (const s of touched) reconsider(s);
  }
  return order;
}
