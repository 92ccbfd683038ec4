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
import { type Action, type Schedule, IdTable, buildSchedule, createSchedule, isCheckedSchedule, makeAction, p2pKinds, unitNumber } from './schedule.js';
import { timeSchedule } from './timeline.js';

/**
 * Decimal texts compared as strings: the message ids were once the text `kind:pipeline:micro-batch:part`
 * ordered as strings, and the placement keeps that order where keys tie. `x` and `y` are integers
 * >= 0; a number followed by ':' (every field but the last) sorts after a longer number it is a
 * prefix of, the last field before it.
 */
function compareAsText(x: number, y: number, last: boolean): number {
  if (x === y) return 0;
  const digits = (v: number): number => {
    let d = 1;
    for (let rest = v; rest >= 10; rest = Math.floor(rest / 10)) d++;
    return d;
  };
  const dx = digits(x);
  const dy = digits(y);
  if (dx === dy) return x < y ? -1 : 1;
  if (dx < dy) {
    const head = Math.floor(y / 10 ** (dy - dx));
    if (head !== x) return x < head ? -1 : 1;
    return last ? -1 : 1;
  }
  const head = Math.floor(x / 10 ** (dx - dy));
  if (head !== y) return head < y ? -1 : 1;
  return last ? 1 : -1;
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
  const rowsIn: unknown[] = schedule.actions;
  rowsIn.forEach((row, s) => {
    if (!Array.isArray(row)) throw new InvalidArgumentError(`withCommunication: schedule.actions[${s}] must be an array of actions`);
  });
  const filtered = (schedule.actions as readonly (readonly Action[])[]).map((row) =>
    row.filter((a: Action) => a === null || typeof a !== 'object' || !p2pKinds.has(a.kind)),
  );
  // A checked schedule's actions are frozen and sound, so the compute-only one needs no copies.
  const computeOnly = isCheckedSchedule(schedule)
    ? buildSchedule({ ...schedule, actions: filtered }, false, true)
    : createSchedule({ ...schedule, actions: filtered });
  const rows = computeOnly.actions;
  const S = computeOnly.stages;
  const P = computeOnly.parts;
  const M = computeOnly.microBatches;
  const { flat, start: starts } = timeSchedule(computeOnly, {
    duration: () => 1,
    transfer: () => 0,
    allReduce: () => 0,
  });
  const { rowStart, stageOf, total } = flat;
  const units = computeOnly.pipelines * M * P;
  // where each unit's forward and backward run (the last one, should there be two)
  const forwardAt = new IdTable(units, total);
  const backwardAt = new IdTable(units, total);
  for (let s = 0; s < S; s++) {
    const row = rows[s]!;
    for (let i = 0; i < row.length; i++) {
      const a = row[i]!;
      if (a.kind === 'forward') forwardAt.set(unitNumber(a.pipeline, a.microBatch, a.part, M, P), rowStart[s]! + i);
      else if (a.kind === 'backward') backwardAt.set(unitNumber(a.pipeline, a.microBatch, a.part, M, P), rowStart[s]! + i);
    }
  }
  // Slots: stage s has row.length + 1 of them, slot i before its action i, the last at its end.
  // Slot numbers run over all stages, slot i of stage s being rowStart[s] + s + i.
  const slotBase = (s: number): number => rowStart[s]! + s;
  // The first slot on `stage` after action `after` whose action starts at or after `key` (start
  // times never decrease along a row, so a binary search finds it).
  const insertionPoint = (stage: number, after: number, key: number): number => {
    let lo = after + 1;
    let hi = rows[stage]!.length;
    const base = rowStart[stage]!;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (starts[base + mid]! < key) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  };
  // One entry per send and per receive: message m is entries 2m (send) and 2m+1 (receive).
  const consumers: number[] = [];
  const producers: number[] = [];
  const entrySlot: number[] = [];
  for (let s = 0; s < S; s++) {
    const row = rows[s]!;
    for (let i = 0; i < row.length; i++) {
      const a = row[i]!;
      let producer: number;
      if (a.kind === 'forward' && a.part > 0) producer = forwardAt.get(unitNumber(a.pipeline, a.microBatch, a.part - 1, M, P));
      else if (a.kind === 'backward' && a.part < P - 1) producer = backwardAt.get(unitNumber(a.pipeline, a.microBatch, a.part + 1, M, P));
      else continue;
      if (producer < 0 || stageOf[producer] === s) continue;
      const consumer = rowStart[s]! + i;
      const from = stageOf[producer]!;
      consumers.push(consumer);
      producers.push(producer);
      entrySlot.push(slotBase(from) + insertionPoint(from, producer - rowStart[from]!, starts[consumer]!), slotBase(s) + i);
    }
  }
  // Entries grouped by slot (a counting sort), then ordered within a slot by (key, message id).
  const slots = total + S;
  const bucketStart = new Int32Array(slots + 1);
  for (const slot of entrySlot) bucketStart[slot + 1]!++;
  for (let k = 0; k < slots; k++) bucketStart[k + 1]! += bucketStart[k]!;
  const ordered = new Int32Array(entrySlot.length);
  const fill = bucketStart.slice(0, slots);
  entrySlot.forEach((slot, e) => (ordered[fill[slot]!++] = e));
  const consumerAction = (e: number): Action => {
    const f = consumers[e >> 1]!;
    return rows[stageOf[f]!]![f - rowStart[stageOf[f]!]!]!;
  };
  const byKey = (x: number, y: number): number => {
    const kx = starts[consumers[x >> 1]!]!;
    const ky = starts[consumers[y >> 1]!]!;
    if (kx !== ky) return kx - ky;
    const a = consumerAction(x);
    const b = consumerAction(y);
    // ids: `activation:` before `gradient:`, then pipeline, micro-batch and part as text
    if (a.kind !== b.kind) return a.kind === 'forward' ? -1 : 1;
    return compareAsText(a.pipeline, b.pipeline, false) || compareAsText(a.microBatch, b.microBatch, false) || compareAsText(a.part, b.part, true);
  };
  for (let k = 0; k < slots; k++) {
    const from = bucketStart[k]!;
    const to = bucketStart[k + 1]!;
    if (to - from > 1) ordered.subarray(from, to).sort(byKey);
  }
  const entryAction = (e: number): Action => {
    const a = consumerAction(e);
    const consumerStage = stageOf[consumers[e >> 1]!]!;
    const producerStage = stageOf[producers[e >> 1]!]!;
    const activation = a.kind === 'forward';
    if ((e & 1) === 0) {
      return makeAction(activation ? 'sendActivation' : 'sendGradient', producerStage, activation ? a.part - 1 : a.part + 1, a.microBatch, a.pipeline, -1, consumerStage);
    }
    return makeAction(activation ? 'recvActivation' : 'recvGradient', consumerStage, a.part, a.microBatch, a.pipeline, -1, producerStage);
  };
  const actions = rows.map((row, s) => {
    const out: Action[] = [];
    const base = slotBase(s);
    for (let i = 0; i <= row.length; i++) {
      for (let k = bucketStart[base + i]!; k < bucketStart[base + i + 1]!; k++) out.push(entryAction(ordered[k]!));
      if (i < row.length) out.push(row[i]!);
    }
    return out;
  });
  return buildSchedule({ ...schedule, actions }, false);
}
