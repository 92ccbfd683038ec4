import { withCommunication } from '../communication.js';
import { type ReadyTask, listSchedule } from '../list-scheduler.js';
import { type Action, type Schedule, buildSchedule, makeAction } from '../schedule.js';
import { stageOrder } from './advance-forward.js';
import { type ScheduleOptions, checkOptions, checkUnits, limits } from './options.js';
import { checkInteger } from '../../validate.js';

/**
 * Where AvgPipe's N pipelines run on the runtime (`averaging.layout`), and what the tuner simulates:
 * - `shared-stages` (default; the paper's form): S workers, worker k running row k of the schedule
 *   as the generator interleaved the pipelines' passes, with N replicas of part k, one per
 *   pipeline, averaged with their center on the worker;
 * - `worker-per-replica`: N x S workers, each pipeline on S of its own, the N replicas of a part
 *   averaged over a communicator (one all-reduce of the differences per exchange).
 *
 * @category Pipeline runtime
 */
export type AveragingLayout = (typeof AVERAGING_LAYOUTS)[number];
/** The layouts of {@link AveragingLayout}, the default first. @category Pipeline runtime */
export const AVERAGING_LAYOUTS = ['shared-stages', 'worker-per-replica'] as const;

/** N, AvgPipe's parallel pipelines, where none is given (the generator's and the runtime's default). @category Pipeline schedules */
export const AVGPIPE_DEFAULT_PIPELINES = 2;

/**
 * AvgPipe: N pipelines share the same S stages, each on its own batch of M micro-batches, each
 * with advance forward propagation (stage k runs `min(M, (S-k) + max(0, A-k))` forwards before
 * its first backward). The pipelines' orders are merged per stage by running whichever pipeline's
 * next step is ready first, so one pipeline's bubbles are filled by another's work. Each pipeline
 * then steps its own replica and exchanges with the center copy (elastic averaging).
 *
 * @category Pipeline schedules
 */
export function avgpipe(options: ScheduleOptions): Schedule {
  const { S, M } = checkOptions('avgpipe', options);
  const N = checkInteger(options.pipelines ?? AVGPIPE_DEFAULT_PIPELINES, 'avgpipe: pipelines', 1, limits.pipelines);
  const A = checkInteger(options.advance ?? S - 1, 'avgpipe: advance', 0, limits.microBatches);
  checkUnits('avgpipe', S, M, { pipelines: N }, ['pipelines'], limits.listScheduledUnits);
  // per stage and pipeline, the AFP order still to run, as indices into the task list
  const queues: number[][][] = [];
  const tasks: Action[] = [];
  for (let k = 0; k < S; k++) {
    const perPipeline: number[][] = [];
    for (let p = 0; p < N; p++) {
      const steps = stageOrder(S, M, A, k).map((step) => {
        tasks.push(makeAction(step.kind, k, k, step.microBatch, p, -1, -1));
        return tasks.length - 1;
      });
      perPipeline.push(steps);
    }
    queues.push(perPipeline);
  }
  const next = queues.map((perPipeline) => perPipeline.map(() => 0));
  const frontier: number[] = [];
  const order = listSchedule({
    stages: S,
    parts: S,
    tasks,
    duration: (a) => (a.kind === 'forward' ? 1 : 2),
    transfer: 0,
    frontier: (s) => {
      // (one array, reused: the scheduler reads it before asking again)
      frontier.length = 0;
      for (let p = 0; p < N; p++) {
        const t = queues[s]![p]![next[s]![p]!];
        if (t !== undefined) frontier.push(t);
      }
      return frontier;
    },
    pick: (s, available) => {
      let best: ReadyTask | undefined;
      for (const r of available) {
        const p = r.action.pipeline;
        if (best === undefined || r.ready < best.ready || (r.ready === best.ready && p < best.action.pipeline)) best = r;
      }
      return best;
    },
    onPlace: (s, a) => {
      next[s]![a.pipeline]!++;
    },
  });
  const actions = order.map((row, k) => {
    const out = [...row];
    for (let p = 0; p < N; p++) out.push(makeAction('optimizerStep', k, k, -1, p, -1, -1));
    for (let p = 0; p < N; p++) out.push(makeAction('elasticAverage', k, k, -1, p, -1, -1));
    return out;
  });
  return withCommunication(
    buildSchedule({ name: 'avgpipe', stages: S, microBatches: M, pipelines: N, actions, params: { S, M, N, A } }, false),
  );
}
