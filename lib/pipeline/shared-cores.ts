/**
 * Timing a schedule on a machine whose stages share a few cores (the runtime's worker threads on
 * one CPU), as processor sharing: at every instant each running pass asks for `demand` cores (the
 * cores it would use alone: 1 for a single-threaded pass, up to the kernels' thread pool for one
 * whose products are split across it); while the running passes ask for no more than the machine's
 * `cores` each runs at full speed, and when they ask for more, every one of them slows by the same
 * factor `cores / (sum of demands)`. A pass's cost is its work alone; under sharing it takes
 * longer. Everything else is the event core's model (timeline.ts): an action starts when its
 * thread is free and its inputs have arrived, sends cost the sender nothing and arrive
 * `transfer` later, all-reduces run beside compute once every participant reached them. A message
 * between stages may cost the cores CPU time of its own (`messageCpu`: the transport's threads),
 * which runs beside the passes and shares the cores with them. With a
 * thread per pipeline, the elastic averaging of a part (AvgPipe) is what the runtime makes it: a
 * collective of the part's replicas, whose pass starts on each once all of them have reached it.
 *
 * Unlike the event core, times here depend on what runs at the same moment, so the schedule is
 * stepped in time order: the work is the number of actions times the number of threads.
 */
import { InvalidScheduleError } from '../errors.js';
import { type Action, type Schedule, IdTable, ReductionNumbering, flatIndex, formatAction, reductionLane, unitNumber } from './schedule.js';
import type { Times, TimingModel } from './timeline.js';

/** How the stages share the machine. @internal */
export interface SharedCoresModel {
  /** Cores of the machine (Infinity: every thread has its own). */
  readonly cores: number;
  /** Cores an action would use alone (only actions that take time ask for any). */
  demand(action: Action): number;
  /**
   * What runs as one thread: a stage's whole row (`per-stage`), or each pipeline's actions of a
   * row (`per-pipeline`: parallel pipelines on their own workers, as the runtime runs them).
   */
  readonly threads: 'per-stage' | 'per-pipeline';
  /**
   * CPU time the message that feeds `consumer` costs the shared cores (the transport's copy and the
   * wake-ups at both ends), spent beside the passes from the moment its producer ends; absent or 0:
   * messages cost the cores nothing. It delays no one by itself (`transfer` is the message's
   * travel time): it takes its share of the cores like a pass of demand 1.
   */
  messageCpu?(kind: 'activation' | 'gradient', consumerPart: number): number;
}

const p2p = (a: Action): boolean => a.kind === 'sendActivation' || a.kind === 'sendGradient' || a.kind === 'recvActivation' || a.kind === 'recvGradient';

/**
 * Start and end of every action under {@link SharedCoresModel}, by position in flat order (for an
 * all-reduce, the span of the reduction itself, as the event core gives it).
 *
 * @internal
 */
export function timeScheduleSharedCores(schedule: Schedule, model: TimingModel, machine: SharedCoresModel): Times {
  const rows = schedule.actions;
  const P = schedule.parts;
  const M = schedule.microBatches;
  const flat = flatIndex(rows);
  const { rowStart, stageOf, total } = flat;
  const unit = (a: Action, part: number): number => unitNumber(a.pipeline, a.microBatch, part, M, P);

  // threads: lists of flat indices, in row order
  const threads: number[][] = [];
  const byKey = new Map<string, number[]>();
  const forwardAt = new IdTable(schedule.pipelines * M * P, total);
  const backwardAt = new IdTable(schedule.pipelines * M * P, total);
  const numbering = new ReductionNumbering(M, P);
  for (let s = 0; s < rows.length; s++) {
    const row = rows[s]!;
    for (let i = 0; i < row.length; i++) {
      const a = row[i]!;
      const f = rowStart[s]! + i;
      const key = machine.threads === 'per-pipeline' ? `${s}:${a.pipeline}` : `${s}`;
      let list = byKey.get(key);
      if (list === undefined) {
        list = [];
        byKey.set(key, list);
        threads.push(list);
      }
      list.push(f);
      if (a.kind === 'forward') forwardAt.set(unit(a, a.part), f);
      else if (a.kind === 'backward') backwardAt.set(unit(a, a.part), f);
      else if (a.kind === 'allReduce') numbering.add(a);
    }
  }
  const actionAt = (f: number): Action => rows[stageOf[f]!]![f - rowStart[stageOf[f]!]!]!;
  // Elastic averaging across threads: the k-th averaging of a part on a row is one exchange.
  const exchangeOf = new Map<number, string>();
  const exchangeSize = new Map<string, number>();
  if (machine.threads === 'per-pipeline') {
    for (const list of threads) {
      const seen = new Map<number, number>();
      for (const f of list) {
        const a = actionAt(f);
        if (a.kind !== 'elasticAverage') continue;
        const k = seen.get(a.part) ?? 0;
        seen.set(a.part, k + 1);
        const key = `${stageOf[f]}:${a.part}:${k}`;
        exchangeOf.set(f, key);
        exchangeSize.set(key, (exchangeSize.get(key) ?? 0) + 1);
      }
    }
  }
  const exchangeReached = new Map<string, { count: number; last: number }>();
  const arrived = new Uint8Array(total);
  const reductions = numbering.count;
  const reached = new Int32Array(reductions);
  const reachedLast = new Float64Array(reductions).fill(-Infinity);
  const completion = new Float64Array(reductions).fill(NaN);

  const start = new Float64Array(total);
  const end = new Float64Array(total).fill(NaN);
  const T = threads.length;
  const pc = new Int32Array(T);
  const running = new Int32Array(T).fill(-1);
  const remaining = new Float64Array(T);
  const demand = new Float64Array(T);
  // per thread and part (and wave: reductionLane): the reductions issued there that no optimizer step has waited for yet
  const lane = reductionLane(schedule);
  const uncovered: Map<number, number[]>[] = Array.from({ length: T }, () => new Map());
  // Messages' CPU work still to do (remaining time alone, demand 1 each): it runs beside the passes.
  const messageWork: number[] = [];

  const arrival = (gradient: boolean, a: Action, stage: number): number => {
    const from = gradient ? a.part + 1 : a.part - 1;
    if (from < 0 || from >= P) return NaN;
    const producer = (gradient ? backwardAt : forwardAt).get(unit(a, from));
    if (producer < 0) return NaN;
    const produced = end[producer]!;
    if (Number.isNaN(produced) || stageOf[producer] === stage) return produced;
    return produced + model.transfer(gradient ? 'gradient' : 'activation', a.part);
  };
  const readyTime = (a: Action, stage: number, t: number, f: number, now: number): number => {
    switch (a.kind) {
      case 'elasticAverage': {
        const key = exchangeOf.get(f);
        if (key === undefined) return 0;
        const entry = exchangeReached.get(key) ?? { count: 0, last: 0 };
        if (!arrived[f]) {
          arrived[f] = 1;
          entry.count++;
          entry.last = Math.max(entry.last, now);
          exchangeReached.set(key, entry);
        }
        return entry.count === exchangeSize.get(key) ? entry.last : NaN;
      }
      case 'forward':
        return a.part === 0 ? 0 : arrival(false, a, stage);
      case 'backward': {
        const producer = forwardAt.get(unit(a, a.part));
        const fwd = producer < 0 ? NaN : end[producer]!;
        if (Number.isNaN(fwd) || a.part === P - 1) return fwd;
        return Math.max(fwd, arrival(true, a, stage));
      }
      case 'weightGrad': {
        const producer = backwardAt.get(unit(a, a.part));
        return producer < 0 ? NaN : end[producer]!;
      }
      case 'recvActivation':
        return arrival(false, a, stage);
      case 'recvGradient':
        return arrival(true, a, stage);
      case 'optimizerStep': {
        let ready = 0;
        for (const r of uncovered[t]!.get(lane(a, stage)) ?? []) {
          if (a.microBatch >= 0 && numbering.microBatch[r]! > a.microBatch) continue;
          ready = Math.max(ready, completion[r]!); // NaN while the reduction has not completed
        }
        return ready;
      }
      default:
        return 0;
    }
  };
  // `x` is later than `now`, beyond rounding
  const later = (x: number, now: number): boolean => x - now > 1e-12 * Math.max(1, Math.abs(now), Math.abs(x));

  let now = 0;
  let done = 0;
  for (;;) {
    // Start everything that can start now; actions that take no time complete at once and may
    // let others start, so go round until nothing moves.
    let wake = Infinity;
    for (let moved = true; moved; ) {
      moved = false;
      wake = Infinity;
      for (let t = 0; t < T; t++) {
        const list = threads[t]!;
        while (running[t] === -1 && pc[t]! < list.length) {
          const f = list[pc[t]!]!;
          const a = actionAt(f);
          const stage = stageOf[f]!;
          const ready = readyTime(a, stage, t, f, now);
          if (Number.isNaN(ready)) break;
          if (later(ready, now)) {
            wake = Math.min(wake, ready);
            break;
          }
          start[f] = now;
          if (a.kind === 'allReduce') {
            const r = numbering.of(a);
            reached[r]!++;
            reachedLast[r] = Math.max(reachedLast[r]!, now);
            const list2 = uncovered[t]!.get(lane(a, stage));
            if (list2 === undefined) uncovered[t]!.set(lane(a, stage), [r]);
            else list2.push(r);
            end[f] = now;
            if (reached[r] === numbering.participants[r]) completion[r] = reachedLast[r]! + model.allReduce(a);
          } else {
            const cost = p2p(a) ? 0 : model.duration(a);
            if (cost > 0) {
              running[t] = f;
              remaining[t] = cost;
              demand[t] = machine.demand(a);
              break;
            }
            end[f] = now;
            finished(t, a, stage);
          }
          pc[t]!++;
          done++;
          moved = true;
        }
      }
    }
    // The next moment something changes: a running action ends, or an input arrives.
    let asked = messageWork.length;
    let active = 0;
    for (let t = 0; t < T; t++) {
      if (running[t]! < 0) continue;
      asked += demand[t]!;
      active++;
    }
    if (active === 0 && wake === Infinity) break;
    const rate = asked > machine.cores ? machine.cores / asked : 1;
    let next = wake;
    for (let t = 0; t < T; t++) if (running[t]! >= 0) next = Math.min(next, now + remaining[t]! / rate);
    for (const w of messageWork) next = Math.min(next, now + w / rate);
    const dt = next - now;
    // (in place: this runs at every event of the simulation)
    let kept = 0;
    for (const w of messageWork) if (w - rate * dt > 1e-12 * Math.max(1, Math.abs(next))) messageWork[kept++] = w - rate * dt;
    messageWork.length = kept;
    for (let t = 0; t < T; t++) {
      const f = running[t]!;
      if (f < 0) continue;
      if (!later(now + remaining[t]! / rate, next)) {
        end[f] = next;
        running[t] = -1;
        finished(t, actionAt(f), stageOf[f]!);
        pc[t]!++;
        done++;
      } else remaining[t] = remaining[t]! - rate * dt;
    }
    now = next;
  }

  function finished(t: number, a: Action, stage: number): void {
    if (a.kind === 'forward' || a.kind === 'backward') sent(a, stage);
    if (a.kind !== 'optimizerStep') return;
    const list = uncovered[t]!.get(lane(a, stage));
    if (list !== undefined) uncovered[t]!.set(lane(a, stage), a.microBatch < 0 ? [] : list.filter((r) => numbering.microBatch[r]! > a.microBatch));
  }

  // A pass whose output feeds another stage starts its message's CPU work.
  function sent(a: Action, stage: number): void {
    if (machine.messageCpu === undefined) return;
    const gradient = a.kind === 'backward';
    const to = gradient ? a.part - 1 : a.part + 1;
    if (to < 0 || to >= P) return;
    const consumer = (gradient ? backwardAt : forwardAt).get(unit(a, to));
    if (consumer < 0 || stageOf[consumer] === stage) return;
    const cpu = machine.messageCpu(gradient ? 'gradient' : 'activation', to);
    if (cpu > 0) messageWork.push(cpu);
  }

  if (done < total) {
    const blocked: string[] = [];
    for (let t = 0; t < T; t++) {
      const list = threads[t]!;
      if (pc[t]! < list.length) {
        const f = list[pc[t]!]!;
        blocked.push(`stage ${stageOf[f]} at #${f - rowStart[stageOf[f]!]!} (${formatAction(actionAt(f))})`);
      }
    }
    throw new InvalidScheduleError(
      `the schedule cannot run to the end: ${blocked.join('; ')} wait for inputs that never arrive; check the order of these actions with validateSchedule()`,
    );
  }
  for (let s = 0; s < rows.length; s++) {
    const row = rows[s]!;
    for (let i = 0; i < row.length; i++) {
      if (row[i]!.kind !== 'allReduce') continue;
      const r = numbering.of(row[i]!);
      start[rowStart[s]! + i] = reachedLast[r]!;
      end[rowStart[s]! + i] = completion[r]!;
    }
  }
  return { flat, start, end };
}
