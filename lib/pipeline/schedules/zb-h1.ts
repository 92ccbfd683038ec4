import { withCommunication } from '../communication.js';
import { type ReadyTask, listSchedule } from '../list-scheduler.js';
import { type Action, type Schedule, buildSchedule, makeAction } from '../schedule.js';
import { type ScheduleOptions, checkOptions, checkUnits, limits } from './options.js';

/** The available task of this kind with the lowest micro-batch. */
function first(available: readonly ReadyTask[], kind: Action['kind']): ReadyTask | undefined {
  let best: ReadyTask | undefined;
  for (const r of available) if (r.action.kind === kind && (best === undefined || r.action.microBatch < best.action.microBatch)) best = r;
  return best;
}

/**
 * ZB-H1 (zero-bubble pipeline parallelism, the variant with 1F1B's peak memory): the backward is
 * split into the input-gradient pass B, which the previous stage waits for, and the weight-gradient
 * pass W, which nobody waits for and so fills bubbles. Each stage runs, when free: a ready B, else
 * a forward if fewer than `min(M, S)` micro-batches hold activations (activations are released by
 * W; `S` is 1F1B's peak, reached on its first stage, so later stages may defer their W's up to the
 * same peak), else a pending W. Built by greedy list scheduling with unit costs for F, B and W;
 * one synchronous step. At S=4, M=8 it takes 29 units against 1F1B's 33 and the hand-made
 * schedule's 27.
 *
 * @category Pipeline schedules
 */
export function zbH1(options: ScheduleOptions): Schedule {
  const { S, M } = checkOptions('zb-h1', options);
  checkUnits('zb-h1', S, M, {}, [], limits.listScheduledUnits);
  const tasks: Action[] = [];
  for (let k = 0; k < S; k++) {
    for (let m = 0; m < M; m++) {
      tasks.push(makeAction('forward', k, k, m, 0, -1, -1));
      tasks.push(makeAction('backward', k, k, m, 0, -1, -1));
      tasks.push(makeAction('weightGrad', k, k, m, 0, -1, -1));
    }
  }
  const live = new Array<number>(S).fill(0);
  // F, B and W each run in micro-batch order on a stage, so only the next of each can be chosen
  // (per stage, by kind: 0 forward, 1 backward, 2 weight gradient; task k*M+m has F, B, W at 3 (k*M+m) + kind)
  const next = new Int32Array(3 * S);
  // (one frontier array, reused: the scheduler reads it before asking again)
  const frontier: number[] = [];
  const order = listSchedule({
    stages: S,
    parts: S,
    tasks,
    duration: () => 1,
    transfer: 0,
    frontier: (s) => {
      frontier.length = 0;
      for (const kind of [1, 0, 2]) if (next[3 * s + kind]! < M) frontier.push((s * M + next[3 * s + kind]!) * 3 + kind);
      return frontier;
    },
    pick: (s, available) => first(available, 'backward') ?? (live[s]! < Math.min(M, S) ? first(available, 'forward') : undefined) ?? first(available, 'weightGrad'),
    onPlace: (s, a) => {
      next[3 * s + (a.kind === 'forward' ? 0 : a.kind === 'backward' ? 1 : 2)]!++;
      if (a.kind === 'forward') live[s]!++;
      else if (a.kind === 'weightGrad') live[s]!--;
    },
  });
  const actions = order.map((row, k) => [...row, makeAction('optimizerStep', k, k, -1, 0, -1, -1)]);
  return withCommunication(buildSchedule({ name: 'zb-h1', stages: S, microBatches: M, actions, params: { S, M } }, false));
}
