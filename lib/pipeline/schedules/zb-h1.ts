import { withCommunication } from '../communication.js';
import { listSchedule } from '../list-scheduler.js';
import { type Action, type Schedule, action, createSchedule } from '../schedule.js';
import { type ScheduleOptions, checkOptions } from './options.js';

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
  const tasks: Action[] = [];
  for (let k = 0; k < S; k++) {
    for (let m = 0; m < M; m++) {
      tasks.push(action('forward', k, { microBatch: m }));
      tasks.push(action('backward', k, { microBatch: m }));
      tasks.push(action('weightGrad', k, { microBatch: m }));
    }
  }
  const live = new Array<number>(S).fill(0);
  // F, B and W each run in micro-batch order on a stage, so only the next of each can be chosen
  const next = Array.from({ length: S }, () => ({ forward: 0, backward: 0, weightGrad: 0 }));
  const byKind = (k: number, kind: 'forward' | 'backward' | 'weightGrad'): Action | undefined =>
    next[k]![kind] < M ? tasks[(k * M + next[k]![kind]) * 3 + (kind === 'forward' ? 0 : kind === 'backward' ? 1 : 2)] : undefined;
  const order = listSchedule({
    stages: S,
    parts: S,
    tasks,
    duration: () => 1,
    transfer: 0,
    frontier: (s) => [byKind(s, 'backward'), byKind(s, 'forward'), byKind(s, 'weightGrad')].filter((a): a is Action => a !== undefined),
    pick: (s, available) => {
      const first = (kind: Action['kind']): Action | undefined =>
        available
          .filter((r) => r.action.kind === kind)
          .reduce<Action | undefined>((best, r) => (best === undefined || r.action.microBatch < best.microBatch ? r.action : best), undefined);
      return first('backward') ?? (live[s]! < Math.min(M, S) ? first('forward') : undefined) ?? first('weightGrad');
    },
    onPlace: (s, a) => {
      next[s]![a.kind as 'forward' | 'backward' | 'weightGrad']++;
      if (a.kind === 'forward') live[s]!++;
      else if (a.kind === 'weightGrad') live[s]!--;
    },
  });
  const actions = order.map((row, k) => [...row, action('optimizerStep', k)]);
  return withCommunication(createSchedule({ name: 'zb-h1', stages: S, microBatches: M, actions, params: { S, M } }));
}
