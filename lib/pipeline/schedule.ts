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
 * Builds a schedule and checks its shape (counts, field ranges, each action on its own stage's
 * list). It does not check dependencies or deadlock: {@link validateSchedule} does.
 *
 * @category Pipeline schedules
 */
export function createSchedule(init: ScheduleInit): Schedule {
  if (init === null || typeof init !== 'object') throw new InvalidArgumentError('createSchedule expects an object');
  const stages = checkInteger(init.stages, 'stages', 1, 4096);
  const microBatches = checkInteger(init.microBatches, 'microBatches', 1, 1 << 20);
  const parts = checkInteger(init.parts ?? stages, 'parts', 1, 1 << 16);
  const pipelines = checkInteger(init.pipelines ?? 1, 'pipelines', 1, 1 << 16);
  if (!Array.isArray(init.actions) || init.actions.length !== stages) {
    throw new InvalidArgumentError(`actions must be an array with one list per stage (${stages} lists)`);
  }
  const actions = init.actions.map((row, s) => {
    if (!Array.isArray(row)) throw new InvalidArgumentError(`actions[${s}] must be an array of actions`);
    return row.map((a: Action, i) => {
      const where = `stage ${s}, action #${i}`;
      if (a === null || typeof a !== 'object' || !Object.hasOwn(codeOfKind, a.kind)) {
        throw new InvalidScheduleError(`${where} is not an action (unknown kind); build actions with action() or parseAction()`);
      }
      if (a.stage !== s) throw new InvalidScheduleError(`${where} (${formatAction(a)}) says stage ${a.stage}; move it to that stage's list`);
      const bad = (field: string, range: string): never => {
        throw new InvalidScheduleError(`${where} (${formatAction(a)}): ${field} must be ${range}`);
      };
      if (!Number.isInteger(a.part) || a.part < 0 || a.part >= parts) bad('part', `in [0, ${parts - 1}]`);
      if (!Number.isInteger(a.pipeline) || a.pipeline < 0 || a.pipeline >= pipelines) bad('pipeline', `in [0, ${pipelines - 1}]`);
      if (!Number.isInteger(a.microBatch) || a.microBatch < -1 || a.microBatch >= microBatches) {
        bad('microBatch', `-1 or in [0, ${microBatches - 1}]`);
      }
      if (needsMicroBatch.has(a.kind) && a.microBatch < 0) bad('microBatch', `set for a ${a.kind}`);
      if (!Number.isInteger(a.version) || a.version < -1) bad('version', '-1 (current) or a version number >= 0');
      if (p2pKinds.has(a.kind)) {
        if (!Number.isInteger(a.peer) || a.peer < 0 || a.peer >= stages || a.peer === s) {
          bad('peer', `another stage in [0, ${stages - 1}]`);
        }
      } else if (a.peer !== -1) bad('peer', '-1 for an action that is not a send or receive');
      return Object.freeze({ ...a });
    });
  });
  return Object.freeze({
    name: init.name ?? 'custom',
    stages,
    parts,
    microBatches,
    pipelines,
    actions,
    params: Object.freeze({ ...(init.params ?? {}) }),
  });
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
