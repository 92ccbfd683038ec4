/**
 * Placement of point-to-point sends and receives into a schedule of compute actions.
 *
 * Why this order is deadlock-free even when a send blocks until its receive is posted: the
 * schedule is first timed with every action costing one unit, which gives each stage strictly
 * increasing start times. Each message gets the key (start of its consumer, message id); the
 * receive goes right before the consumer, the send before the first action of the sender that
 * starts at or after that key. Every stage then meets its messages in increasing key order, so
 * all stages agree on one global order of the exchanges and the one with the smallest key pending
 * always has both ends waiting for it.
 */
import { InvalidArgumentError } from '../errors.js';
import { type Action, type Schedule, action, createSchedule, p2pKinds, unitKey } from './schedule.js';
import { computeTimeline } from './timeline.js';

interface Placed {
  readonly key: number;
  readonly id: string;
  readonly action: Action;
}

/**
 * Returns the schedule with its sends and receives (re)placed so that it runs without deadlock
 * under blocking point-to-point. Existing sends and receives are dropped first.
 *
 * @category Pipeline schedules
 */
export function withCommunication(schedule: Schedule): Schedule {
  if (schedule === null || typeof schedule !== 'object' || !Array.isArray(schedule.actions)) {
    throw new InvalidArgumentError('withCommunication expects a Schedule');
  }
  const computeOnly = createSchedule({ ...schedule, actions: schedule.actions.map((row) => row.filter((a: Action) => !p2pKinds.has(a.kind))) });
  const timeline = computeTimeline(computeOnly, {
    duration: () => 1,
    transfer: () => 0,
    allReduce: () => 0,
  });
  const where = new Map<string, { stage: number; index: number }>();
  timeline.forEach((row, s) =>
    row.forEach((t) => {
      const a = t.action;
      if (a.kind === 'forward' || a.kind === 'backward') {
        where.set(`${a.kind === 'forward' ? 'F' : 'B'}${unitKey(a.pipeline, a.microBatch, a.part)}`, { stage: s, index: t.index });
      }
    }),
  );
  // before[s][i]: comm actions to insert before action i of stage s (i = length: at the end)
  const before: Placed[][][] = computeOnly.actions.map((row) => Array.from({ length: row.length + 1 }, () => []));
  const starts = timeline.map((row) => row.map((t) => t.start));
  const insertionPoint = (stage: number, after: number, key: number): number => {
    const row = starts[stage]!;
    let i = after + 1;
    while (i < row.length && row[i]! < key) i++;
    return i;
  };
  timeline.forEach((row, s) =>
    row.forEach((t, i) => {
      const a = t.action;
      let producer: { stage: number; index: number } | undefined;
      let kind: 'activation' | 'gradient';
      if (a.kind === 'forward' && a.part > 0) {
        producer = where.get(`F${unitKey(a.pipeline, a.microBatch, a.part - 1)}`);
        kind = 'activation';
      } else if (a.kind === 'backward' && a.part < schedule.parts - 1) {
        producer = where.get(`B${unitKey(a.pipeline, a.microBatch, a.part + 1)}`);
        kind = 'gradient';
      } else {
        return;
      }
      if (producer === undefined || producer.stage === s) return;
      const key = t.start;
      const id = `${kind}:${unitKey(a.pipeline, a.microBatch, a.part)}`;
      const senderPart = kind === 'activation' ? a.part - 1 : a.part + 1;
      const send = action(kind === 'activation' ? 'sendActivation' : 'sendGradient', producer.stage, {
        part: senderPart,
        microBatch: a.microBatch,
        pipeline: a.pipeline,
        peer: s,
      });
      const recv = action(kind === 'activation' ? 'recvActivation' : 'recvGradient', s, {
        part: a.part,
        microBatch: a.microBatch,
        pipeline: a.pipeline,
        peer: producer.stage,
      });
      before[producer.stage]![insertionPoint(producer.stage, producer.index, key)]!.push({ key, id, action: send });
      before[s]![i]!.push({ key, id, action: recv });
    }),
  );
  const byKey = (x: Placed, y: Placed): number => x.key - y.key || (x.id < y.id ? -1 : x.id > y.id ? 1 : 0);
  const actions = computeOnly.actions.map((row, s) => {
    const out: Action[] = [];
    for (let i = 0; i <= row.length; i++) {
      out.push(...before[s]![i]!.sort(byKey).map((p) => p.action));
      if (i < row.length) out.push(row[i]!);
    }
    return out;
  });
  return createSchedule({ ...schedule, actions });
}
