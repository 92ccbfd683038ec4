/**
 * Pipeline schedules as data. A {@link Schedule} is, per stage (one row per device), the ordered
 * list of {@link Action}s that stage executes. Generators in ./schedules/ build them; validate.ts
 * checks and analyses them; simulate.ts times them; render.ts draws them.
 *
 * Data flow is not stored separately: it follows from the actions. For pipeline `p` and
 * micro-batch `m`, the forward of model part `j` consumes the forward of part `j-1`, the backward
 * of part `j` consumes the backward of part `j+1` and the forward of part `j`, and the stage that
 * runs an action is the stage whose list holds it. So one representation covers plain pipelines
 * (part = stage), interleaved ones (several parts per stage), rotating placements (Wavelet) and
 * data-parallel forms (one part, one pipeline per worker).
 */
import { InvalidArgumentError, InvalidScheduleError } from '../errors.js';
import { checkInteger, checkObject, describeValue } from '../validate.js';

/** What an action does. @category Pipeline schedules */
export type ActionKind =
  | 'forward'
  | 'backward'
  | 'weightGrad'
  | 'sendActivation'
  | 'recvActivation'
  | 'sendGradient'
  | 'recvGradient'
  | 'optimizerStep'
  | 'predictWeights'
  | 'stashWeights'
  | 'restoreWeights'
  | 'elasticAverage'
  | 'allReduce';

/** One step of one stage. Fields that do not apply are -1. @category Pipeline schedules */
export interface Action {
  readonly kind: ActionKind;
  /** The stage (device row) that executes it. */
  readonly stage: number;
  /** The model part (layer group) it concerns; equals `stage` in a plain pipeline. */
  readonly part: number;
  /**
   * The micro-batch, or -1. For `optimizerStep` it bounds which gradients are applied: those of
   * micro-batches up to it (-1: every gradient not yet applied), and the step waits for the
   * all-reduces of its part issued before it on its stage up to that micro-batch. For `allReduce`,
   * pipeline, part and micro-batch name the reduction: stages holding the same triple reduce together.
   */
  readonly microBatch: number;
  /** The pipeline (AvgPipe replica, Wavelet wave, data-parallel worker); 0 when there is one. */
  readonly pipeline: number;
  /**
   * For forward, backward and weight-gradient: the weight version read, counted in optimizer
   * steps of that part on that stage; -1 reads whatever is current when the action runs. A
   * version other than the current one is a stashed (or double-buffered) copy.
   */
  readonly version: number;
  /** For sends and receives: the stage at the other end; otherwise -1. */
  readonly peer: number;
}

/** A complete schedule. Build one with a generator, {@link createSchedule} or {@link parseSchedule}. @category Pipeline schedules */
export interface Schedule {
  /** Generator name (`gpipe`, `1f1b`, ...) or `custom`. */
  readonly name: string;
  /** Number of stages (rows, devices). */
  readonly stages: number;
  /** Number of model parts; equals `stages` except for interleaved and data-parallel forms. */
  readonly parts: number;
  /** Micro-batches per pipeline. */
  readonly microBatches: number;
  /** Number of pipelines. */
  readonly pipelines: number;
  /** Per stage, the actions in execution order. */
  readonly actions: readonly (readonly Action[])[];
  /** The generator parameters, for display (S, M, N, A, V, ...). */
  readonly params: Readonly<Record<string, number | string>>;
}

/** Kinds that occupy the compute engine with model work. @category Pipeline schedules */
export const computeKinds: ReadonlySet<ActionKind> = new Set(['forward', 'backward', 'weightGrad']);
/** Point-to-point kinds. @category Pipeline schedules */
export const p2pKinds: ReadonlySet<ActionKind> = new Set([
  'sendActivation',
  'recvActivation',
  'sendGradient',
  'recvGradient',
]);

const codeOfKind: Record<ActionKind, string> = {
  forward: 'F',
  backward: 'B',
  weightGrad: 'W',
  sendActivation: 'sa',
  recvActivation: 'ra',
  sendGradient: 'sg',
  recvGradient: 'rg',
  optimizerStep: 'U',
  predictWeights: 'P',
  stashWeights: 'S',
  restoreWeights: 'R',
  elasticAverage: 'E',
  allReduce: 'A',
};
/** Every action kind. @internal */
export const ACTION_KINDS: ReadonlySet<string> = new Set(Object.keys(codeOfKind));

const kindOfCode = new Map<string, ActionKind>(
  Object.entries(codeOfKind).map(([kind, code]) => [code, kind as ActionKind]),
);

/** Kinds that must name a micro-batch. */
const needsMicroBatch: ReadonlySet<ActionKind> = new Set([
  'forward',
  'backward',
  'weightGrad',
  'sendActivation',
  'recvActivation',
  'sendGradient',
  'recvGradient',
  'stashWeights',
  'restoreWeights',
]);

/** Builds an action; unspecified fields default to part = stage, pipeline 0, and -1 elsewhere. @category Pipeline schedules */
export function action(
  kind: ActionKind,
  stage: number,
  fields: { part?: number; microBatch?: number; pipeline?: number; version?: number; peer?: number } = {},
): Action {
  checkObject(fields, 'action(kind, stage, fields): fields');
  return {
    kind,
    stage,
    part: fields.part ?? stage,
    microBatch: fields.microBatch ?? -1,
    pipeline: fields.pipeline ?? 0,
    version: fields.version ?? -1,
    peer: fields.peer ?? -1,
  };
}

/**
 * The compact text form of an action: `{stage}{code}{microBatch}` then, only where they differ
 * from the defaults, `/{part}` (default: the stage), `p{pipeline}`, `@{version}`, and `>{peer}` for
 * sends or `<{peer}` for receives. Codes: F forward, B backward, W weight gradient, sa/ra send and
 * receive activation, sg/rg send and receive gradient, U optimizer step, P weight prediction,
 * S stash, R restore, E elastic averaging, A all-reduce. Examples: `0F1`, `1B3@2`, `0sa1>1`, `3U`.
 *
 * @category Pipeline schedules
 */
export function formatAction(a: Action): string {
  if (a === null || typeof a !== 'object' || typeof a.kind !== 'string' || !Object.hasOwn(codeOfKind, a.kind))
    throw new InvalidArgumentError(`formatAction: pass an action (see action()), got ${describeValue(a)}`);
  for (const field of ['stage', 'microBatch', 'part', 'pipeline', 'version', 'peer'] as const)
    checkInteger(a[field], `formatAction: action.${field}`, -1, Number.MAX_SAFE_INTEGER);
  let text = `${a.stage}${codeOfKind[a.kind]}`;
  if (a.microBatch >= 0) text += String(a.microBatch);
  if (a.part !== a.stage) text += `/${a.part}`;
  if (a.pipeline !== 0) text += `p${a.pipeline}`;
  if (a.version >= 0) text += `@${a.version}`;
  if (a.peer >= 0) text += (a.kind === 'sendActivation' || a.kind === 'sendGradient' ? '>' : '<') + String(a.peer);
  return text;
}

const actionPattern = /^(\d+)(sa|ra|sg|rg|F|B|W|U|P|S|R|E|A)(\d+)?(?:\/(\d+))?(?:p(\d+))?(?:@(\d+))?(?:([<>])(\d+))?$/;

/** Parses the text form written by {@link formatAction}. @category Pipeline schedules */
export function parseAction(text: string): Action {
  if (typeof text !== 'string') throw new InvalidArgumentError('parseAction expects a string such as "0F1"');
  const match = actionPattern.exec(text.trim());
  if (!match) {
    throw new InvalidArgumentError(
      `cannot parse action "${text}": write {stage}{code}{micro-batch}[/{part}][p{pipeline}][@{version}][>{peer}|<{peer}], ` +
        'with code one of F B W sa ra sg rg U P S R E A, e.g. "0F1", "1B3", "0sa1>1"',
    );
  }
  const [, stageText, code, mbText, partText, pipeText, versionText, arrow, peerText] = match;
  const kind = kindOfCode.get(code!)!;
  const stage = Number(stageText);
  const isSend = kind === 'sendActivation' || kind === 'sendGradient';
  if (p2pKinds.has(kind)) {
    if (peerText === undefined || arrow !== (isSend ? '>' : '<')) {
      throw new InvalidArgumentError(
        `action "${text}" is a ${isSend ? 'send' : 'receive'} and needs its peer stage, written "${isSend ? '>' : '<'}{stage}"`,
      );
    }
  } else if (peerText !== undefined) {
    throw new InvalidArgumentError(`action "${text}" is not a send or receive; remove the peer "${arrow}${peerText}"`);
  }
  if (needsMicroBatch.has(kind) && mbText === undefined) {
    throw new InvalidArgumentError(`action "${text}" (${kind}) needs a micro-batch number after "${code}"`);
  }
  return {
    kind,
    stage,
    part: partText === undefined ? stage : Number(partText),
    microBatch: mbText === undefined ? -1 : Number(mbText),
    pipeline: pipeText === undefined ? 0 : Number(pipeText),
    version: versionText === undefined ? -1 : Number(versionText),
    peer: peerText === undefined ? -1 : Number(peerText),
  };
}

/** Formats a whole schedule, one line per stage. @category Pipeline schedules */
export function formatSchedule(schedule: Schedule): string {
  if (schedule === null || typeof schedule !== 'object' || !Array.isArray(schedule.actions) || !schedule.actions.every(Array.isArray))
    throw new InvalidArgumentError(`formatSchedule: pass a Schedule, got ${describeValue(schedule)}`);
  return schedule.actions.map((row, s) => `${s}: ${row.map(formatAction).join(' ')}`).join('\n');
}

/** Shape of a schedule before checking, as a user may write it. @category Pipeline schedules */
export interface ScheduleInit {
  name?: string;
  stages: number;
  microBatches: number;
  parts?: number;
  pipelines?: number;
  actions: readonly (readonly Action[])[];
  params?: Record<string, number | string>;
}

/**
 * The largest counts any schedule may hold, a generator's or one written by hand
 * ({@link createSchedule}); the pictures and analyses take schedules within them. (The generators
 * stop well below, at `limits` of lib/pipeline/schedules/options.ts.) Stages fit in 16 bits.
 *
 * @category Pipeline schedules
 */
export const scheduleLimits = { stages: 4096, microBatches: 1 << 20, parts: 1 << 16, pipelines: 1 << 16 } as const;

/** Schedules built here: checked and frozen all the way down, so they need no second check. */
const checkedSchedules = new WeakSet<Schedule>();

/**
 * Builds a schedule and checks its shape (counts, field ranges, each action on its own stage's
 * list). It does not check dependencies or deadlock: {@link validateSchedule} does. A schedule that
 * this function (or a generator) built is returned as it is: it is frozen, so it is still sound.
 *
 * @category Pipeline schedules
 */
export function createSchedule(init: ScheduleInit): Schedule {
  if (isCheckedSchedule(init)) return init as Schedule;
  return buildSchedule(init, true);
}

/** Whether {@link createSchedule} (or a generator) built this schedule, so that it is checked and frozen. @internal */
export function isCheckedSchedule(value: unknown): boolean {
  return value !== null && typeof value === 'object' && checkedSchedules.has(value as Schedule);
}

/**
 * {@link createSchedule} for actions this library made: the same checks, but the actions are
 * frozen where they are rather than copied (a generator's schedule at its largest holds millions).
 * With `copy`, they are copied first, as a caller's actions must be. `checked` says the actions
 * come from a checked schedule of the same shape (a subset of its lists), so need no second look.
 *
 * @internal
 */
export function buildSchedule(init: ScheduleInit, copy: boolean, checked = false): Schedule {
  if (init === null || typeof init !== 'object' || Array.isArray(init)) {
    throw new InvalidArgumentError(`createSchedule expects an object such as { stages, microBatches, actions }, got ${describeValue(init)}`);
  }
  const stages = checkInteger(init.stages, 'createSchedule: stages', 1, scheduleLimits.stages);
  const microBatches = checkInteger(init.microBatches, 'createSchedule: microBatches', 1, scheduleLimits.microBatches);
  const parts = checkInteger(init.parts ?? stages, 'createSchedule: parts', 1, scheduleLimits.parts);
  const pipelines = checkInteger(init.pipelines ?? 1, 'createSchedule: pipelines', 1, scheduleLimits.pipelines);
  const name = init.name ?? 'custom';
  if (typeof name !== 'string') throw new InvalidArgumentError(`createSchedule: name must be a string, got ${describeValue(name)}`);
  const params = init.params ?? {};
  if (params === null || typeof params !== 'object' || Array.isArray(params)) {
    throw new InvalidArgumentError(`createSchedule: params must be an object of numbers and strings, got ${describeValue(params)}`);
  }
  // (they are printed in titles: a Symbol, or an object without a prototype, cannot be)
  for (const [key, value] of Object.entries(params)) {
    if (typeof value !== 'string' && typeof value !== 'number') {
      throw new InvalidArgumentError(`createSchedule: params.${key} must be a number or a string, got ${describeValue(value)}`);
    }
  }
  if (!Array.isArray(init.actions) || init.actions.length !== stages) {
    throw new InvalidArgumentError(
      `createSchedule: actions must be an array with one list per stage (${stages} lists), got ${describeValue(init.actions)}`,
    );
  }
  const actions: (readonly Action[])[] = [];
  for (let s = 0; s < stages; s++) {
    const row: unknown = init.actions[s];
    if (!Array.isArray(row)) throw new InvalidArgumentError(`createSchedule: actions[${s}] must be an array of actions, got ${describeValue(row)}`);
    const out: Action[] = copy ? new Array<Action>(row.length) : (row as Action[]);
    for (let i = 0; i < row.length; i++) {
      const a: unknown = row[i];
      if (!checked) checkShape(a, s, i, stages, parts, microBatches, pipelines);
      out[i] = copy ? Object.freeze({ ...(a as Action) }) : Object.freeze(a as Action);
    }
    actions.push(Object.freeze(out));
  }
  const schedule: Schedule = Object.freeze({
    name,
    stages,
    parts,
    microBatches,
    pipelines,
    actions: Object.freeze(actions),
    params: Object.freeze({ ...params }),
  });
  checkedSchedules.add(schedule);
  return schedule;
}

/** Throws InvalidScheduleError unless `a` is a well-formed action for position `i` of stage `s`. */
function checkShape(a: unknown, s: number, i: number, stages: number, parts: number, microBatches: number, pipelines: number): asserts a is Action {
  const where = `stage ${s}, action #${i}`;
  // (a kind that is not a string is not looked up: an object without a prototype cannot be made a key)
  const kind: unknown = a === null || typeof a !== 'object' ? undefined : (a as Action).kind;
  if (typeof kind !== 'string' || !Object.hasOwn(codeOfKind, kind)) {
    throw new InvalidScheduleError(
      `${where} is not an action (${a === null || typeof a !== 'object' ? describeValue(a) : `unknown kind ${describeValue(kind)}`}); ` +
        'build actions with action() or parseAction()',
    );
  }
  const x = a as Action;
  // describeAction, not formatAction: a field of the wrong type must be reported by its name, not
  // fail inside the description of the action that holds it.
  const bad = (field: string, range: string): never => {
    const value: unknown = (x as unknown as Record<string, unknown>)[field];
    const got = Number.isInteger(value) ? '' : `, got ${describeValue(value)}`;
    throw new InvalidScheduleError(`${where} (${describeAction(x)}): ${field} must be ${range}${got}`);
  };
  if (!Number.isInteger(x.stage) || x.stage < 0) bad('stage', `${s} (the stage whose list holds it)`);
  if (x.stage !== s) throw new InvalidScheduleError(`${where} (${describeAction(x)}) says stage ${x.stage}; move it to that stage's list`);
  if (!Number.isInteger(x.part) || x.part < 0 || x.part >= parts) bad('part', `in [0, ${parts - 1}]`);
  if (!Number.isInteger(x.pipeline) || x.pipeline < 0 || x.pipeline >= pipelines) bad('pipeline', `in [0, ${pipelines - 1}]`);
  if (!Number.isInteger(x.microBatch) || x.microBatch < -1 || x.microBatch >= microBatches) bad('microBatch', `-1 or in [0, ${microBatches - 1}]`);
  if (needsMicroBatch.has(x.kind) && x.microBatch < 0) bad('microBatch', `set for a ${x.kind}`);
  if (!Number.isInteger(x.version) || x.version < -1) bad('version', '-1 (current) or a version number >= 0');
  if (p2pKinds.has(x.kind)) {
    if (!Number.isInteger(x.peer) || x.peer < 0 || x.peer >= stages || x.peer === s) bad('peer', `another stage in [0, ${stages - 1}]`);
  } else if (x.peer !== -1) bad('peer', '-1 for an action that is not a send or receive');
}

/** formatAction for an action that may be malformed: the text form where it has one, else its fields. */
function describeAction(a: Action): string {
  const fields = ['stage', 'microBatch', 'part', 'pipeline', 'version', 'peer'] as const;
  if (fields.every((f) => Number.isSafeInteger(a[f]) && a[f] >= -1)) return formatAction(a);
  return `${a.kind} with ${fields.map((f) => `${f} ${describeValue(a[f])}`).join(', ')}`;
}

/**
 * Parses a hand-written schedule: one string per stage, actions in text form separated by spaces
 * (see {@link formatAction}). Lines may start with a `{stage}:` label.
 *
 * @category Pipeline schedules
 */
export function parseSchedule(
  lines: string | readonly string[],
  shape: { microBatches: number; parts?: number; pipelines?: number; name?: string },
): Schedule {
  const rows = typeof lines === 'string' ? lines.split('\n').filter((l) => l.trim() !== '') : lines;
  if (!Array.isArray(rows)) throw new InvalidArgumentError('parseSchedule expects a string or an array of strings');
  const actions = rows.map((line: string, s) => {
    if (typeof line !== 'string') throw new InvalidArgumentError(`line ${s} must be a string`);
    const body = line.replace(/^\s*\d+\s*:/, '');
    return body
      .split(/\s+/)
      .filter((w) => w !== '')
      .map((w) => parseAction(w));
  });
  return createSchedule({ ...shape, stages: rows.length, actions });
}

/** A key naming the (pipeline, micro-batch, part) an action belongs to. @category Pipeline schedules */
export function unitKey(pipeline: number, microBatch: number, part: number): string {
  return `${pipeline}:${microBatch}:${part}`;
}

/**
 * An action made by the library itself, frozen as a schedule holds it; the fields in
 * {@link action}'s order. Generators make millions of these, so no options object is read.
 *
 * @internal
 */
export function makeAction(kind: ActionKind, stage: number, part: number, microBatch: number, pipeline: number, version: number, peer: number): Action {
  return Object.freeze({ kind, stage, part, microBatch, pipeline, version, peer });
}

/**
 * Positions of a schedule's actions in one sequence, stage after stage: action `i` of stage `s`
 * is number `rowStart[s] + i`, and `stageOf` maps a number back to its stage. The analyses keep
 * their per-action state in typed arrays indexed by these numbers.
 *
 * @internal
 */
export interface FlatIndex {
  readonly rowStart: Int32Array;
  /** (16 bits: a schedule holds at most scheduleLimits.stages = 4096 stages) */
  readonly stageOf: Int16Array;
  readonly total: number;
}

/** @internal */
export function flatIndex(actions: readonly (readonly Action[])[]): FlatIndex {
  const rowStart = new Int32Array(actions.length + 1);
  for (let s = 0; s < actions.length; s++) rowStart[s + 1] = rowStart[s]! + actions[s]!.length;
  const total = rowStart[actions.length]!;
  const stageOf = new Int16Array(total);
  for (let s = 0; s < actions.length; s++) stageOf.fill(s, rowStart[s]!, rowStart[s + 1]!);
  return { rowStart, stageOf, total };
}

/**
 * The number of a (pipeline, micro-batch, part) among `microBatches * parts` per pipeline. Exact:
 * createSchedule's bounds keep it below 2^52.
 *
 * @internal
 */
export function unitNumber(pipeline: number, microBatch: number, part: number, microBatches: number, parts: number): number {
  return (pipeline * microBatches + microBatch) * parts + part;
}

/**
 * A map from non-negative integer ids below `size` to integers, -1 meaning absent: an Int32Array
 * where `size` is of the order of the entries expected (ids of a generated schedule are dense),
 * a Map otherwise (a hand-written schedule may declare far more units than it holds).
 *
 * @internal
 */
export class IdTable {
  private readonly dense: Int32Array | undefined;
  private readonly sparse: Map<number, number> | undefined;

  constructor(size: number, expected: number) {
    if (size <= Math.max(1 << 16, 4 * expected) && size <= 1 << 28) this.dense = new Int32Array(size).fill(-1);
    else this.sparse = new Map();
  }

  get(id: number): number {
    return this.dense !== undefined ? this.dense[id]! : (this.sparse!.get(id) ?? -1);
  }

  set(id: number, value: number): void {
    if (this.dense !== undefined) this.dense[id] = value;
    else this.sparse!.set(id, value);
  }
}

/**
 * Whether a schedule's rows are Wavelet data-parallel workers, two waves each: one part, 2S
 * pipelines, row x's passes and steps on pipelines 2x (tick) and 2x+1 (tock), its all-reduces
 * naming wave 0 or 1.
 *
 * @internal
 */
export function hasTwoWaves(schedule: Schedule): boolean {
  return (
    schedule.parts === 1 &&
    schedule.pipelines === 2 * schedule.stages &&
    schedule.actions.every((row, x) => row.every((a) => (a.kind === 'allReduce' ? a.pipeline === 0 || a.pipeline === 1 : a.pipeline === 2 * x || a.pipeline === 2 * x + 1)))
  );
}

/**
 * Which of a row's all-reduces an optimizer step waits for: the key of the list an `allReduce`
 * joins and an `optimizerStep` reads on row `stage`. It is the part; in Wavelet's data-parallel
 * form ({@link hasTwoWaves}) the wave too, as the runtime keeps them: a wave's step waits for its
 * own wave's reductions, not the other wave's.
 *
 * @internal
 */
export function reductionLane(schedule: Schedule): (a: Action, stage: number) => number {
  if (!hasTwoWaves(schedule)) return (a) => a.part;
  return (a, stage) => (a.kind === 'allReduce' ? a.pipeline : a.pipeline - 2 * stage);
}

/**
 * The all-reduces of a schedule numbered in order of first appearance: one number per (pipeline,
 * part, micro-batch), with how many actions take part in each and its micro-batch. The simulator
 * and the deadlock check both wait on reductions by these numbers.
 *
 * @internal
 */
export class ReductionNumbering {
  private readonly ids = new Map<number, number>();
  /** Per reduction: the actions taking part. */
  readonly participants: number[] = [];
  /** Per reduction: its micro-batch (-1: a whole step's). */
  readonly microBatch: number[] = [];

  constructor(
    private readonly microBatches: number,
    private readonly parts: number,
  ) {}

  private key(a: Action): number {
    return (a.pipeline * this.parts + a.part) * (this.microBatches + 1) + (a.microBatch + 1);
  }

  /** Counts `a` (an allReduce) as taking part in its reduction. */
  add(a: Action): void {
    const id = this.key(a);
    let r = this.ids.get(id);
    if (r === undefined) {
      r = this.participants.length;
      this.ids.set(id, r);
      this.participants.push(0);
      this.microBatch.push(a.microBatch);
    }
    this.participants[r]!++;
  }

  /** The number of `a`'s reduction (after every action was added). */
  of(a: Action): number {
    return this.ids.get(this.key(a))!;
  }

  get count(): number {
    return this.participants.length;
  }
}

/**
 * The stages still to visit while a schedule is stepped through (the simulator, the deadlock
 * check): each stage at most once in the queue, and a stage held up by another woken when that one
 * moves on, so that the whole pass visits a stage only when what it waits for has happened.
 *
 * @internal
 */
export class StageWakeQueue {
  private items: number[] = [];
  private head = 0;
  private readonly queued: Uint8Array;
  private waiters: number[][];

  /** Every stage starts queued, in order. */
  constructor(stages: number) {
    this.queued = new Uint8Array(stages);
    this.waiters = Array.from({ length: stages }, () => []);
    for (let s = 0; s < stages; s++) this.push(s);
  }

  push(stage: number): void {
    if (this.queued[stage] !== 0) return;
    this.queued[stage] = 1;
    this.items.push(stage);
  }

  /** The next stage to visit, or -1 when none is left. */
  next(): number {
    if (this.head >= this.items.length) return -1;
    const stage = this.items[this.head++]!;
    this.queued[stage] = 0;
    // Drop what was visited now and then, so the list stays as long as what is queued.
    if (this.head > 4096 && this.head * 2 > this.items.length) {
      this.items.splice(0, this.head);
      this.head = 0;
    }
    return stage;
  }

  /** `stage` waits until `on` moves on. */
  wait(stage: number, on: number): void {
    this.waiters[on]!.push(stage);
  }

  /** `stage` moved on: the stages waiting for it are queued again. */
  moved(stage: number): void {
    for (const w of this.waiters[stage]!) this.push(w);
    this.waiters[stage] = [];
  }
}
