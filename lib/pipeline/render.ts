/**
 * Pictures of simulated schedules: stages as rows, time to the right, a colour per micro-batch,
 * forward, backward and weight-gradient passes told apart, idle time (bubbles) hatched, and a
 * legend; as text for a terminal, SVG, or a self-contained HTML page.
 */
import { InvalidArgumentError } from '../errors.js';
import { ACTION_KINDS, type Action, type ActionKind, computeKinds, formatAction, scheduleLimits } from './schedule.js';
import { scheduleEntry } from './schedules/registry.js';
import type { SimulationResult } from './simulate.js';
import type { TimedAction } from './timeline.js';
import { checkInteger, checkOptions, describeValue, optionKeys } from '../validate.js';

/** Options for the pictures. @category Pipeline schedules */
export interface RenderOptions {
  /** Title above the picture. Default: the schedule name and its parameters. */
  readonly title?: string;
  /** Pixels per time unit (SVG/HTML). Default: fits about 1100 px. */
  readonly scale?: number;
  /** Characters per smallest action (text). Default 3. */
  readonly cellWidth?: number;
}

const RENDER_OPTION_KEYS = optionKeys<RenderOptions>({ title: true, scale: true, cellWidth: true });

/**
 * The largest text picture, in characters: past it the time axis is scaled down to fit (an action
 * keeps at least one column). At 2^25 the largest generated schedules still draw one cell per
 * action, and the string stays far below what a JavaScript string can hold (2^29 characters).
 */
const MAX_TEXT_CELLS = 2 ** 25;
/** The longest SVG or HTML document, in characters; a picture that would be longer is refused. */
const MAX_SVG_CHARS = 2 ** 28;
/**
 * The widest SVG chart, in pixels. The default scale (at least 2 px per time unit) stays within it
 * for every generated schedule at unit costs; past it (costs in a very small unit) the default
 * fits the chart to 1100 px instead, and a `scale` past it is refused.
 */
const MAX_SVG_WIDTH = 1e6;

/**
 * Checks that `result` has the shape of a simulation result (from simulateSchedule or
 * measuredResult) in every field the pictures read, so that a malformed one is reported by field
 * rather than failing, or running away, inside the drawing.
 */
function checkResult(result: SimulationResult, what: string): void {
  const r = result as Partial<Record<keyof SimulationResult, unknown>> | null;
  if (r === null || typeof r !== 'object' || Array.isArray(r) || r.schedule === null || typeof r.schedule !== 'object' || !Array.isArray(r.timeline)) {
    throw new InvalidArgumentError(`${what}: pass the result of simulateSchedule(), got ${describeValue(result)}`);
  }
  const s = r.schedule as Partial<Record<keyof SimulationResult['schedule'], unknown>>;
  const stages = checkInteger(s.stages, `${what}: result.schedule.stages`, 1, scheduleLimits.stages);
  checkInteger(s.parts, `${what}: result.schedule.parts`, 1, scheduleLimits.parts);
  checkInteger(s.microBatches, `${what}: result.schedule.microBatches`, 1, scheduleLimits.microBatches);
  if (typeof s.name !== 'string') throw new InvalidArgumentError(`${what}: result.schedule.name must be a string, got ${describeValue(s.name)}`);
  if (s.params === null || typeof s.params !== 'object') throw new InvalidArgumentError(`${what}: result.schedule.params must be an object, got ${describeValue(s.params)}`);
  const rows = (field: string, value: unknown): unknown[][] => {
    if (!Array.isArray(value) || value.length !== stages) {
      throw new InvalidArgumentError(`${what}: result.${field} must hold one list per stage (${stages}), got ${describeValue(value)}`);
    }
    value.forEach((row: unknown, k) => {
      if (!Array.isArray(row)) throw new InvalidArgumentError(`${what}: result.${field}[${k}] must be an array, got ${describeValue(row)}`);
    });
    return value as unknown[][];
  };
  const checkAction = (a: unknown, where: string): void => {
    const x = a as Partial<Record<keyof Action, unknown>> | null;
    if (x === null || typeof x !== 'object' || typeof x.kind !== 'string' || !ACTION_KINDS.has(x.kind)) {
      throw new InvalidArgumentError(`${what}: ${where} must be an action, got ${describeValue(a)}`);
    }
    for (const field of ['stage', 'part', 'microBatch', 'pipeline', 'version', 'peer'] as const) {
      const v = x[field];
      if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < -1) {
        throw new InvalidArgumentError(`${what}: ${where}.${field} must be an integer >= -1, got ${describeValue(v)}`);
      }
    }
  };
  rows('schedule.actions', s.actions).forEach((row, k) => row.forEach((a, i) => checkAction(a, `result.schedule.actions[${k}][${i}]`)));
  rows('timeline', r.timeline).forEach((row, k) =>
    row.forEach((t, i) => {
      const x = t as Partial<Record<keyof TimedAction, unknown>> | null;
      const where = `result.timeline[${k}][${i}]`;
      if (x === null || typeof x !== 'object') throw new InvalidArgumentError(`${what}: ${where} must be { action, start, end, index }, got ${describeValue(t)}`);
      checkAction(x.action, `${where}.action`);
      for (const field of ['start', 'end'] as const) {
        const v = x[field];
        if (typeof v !== 'number' || !Number.isFinite(v)) throw new InvalidArgumentError(`${what}: ${where}.${field} must be a finite number, got ${describeValue(v)}`);
      }
    }),
  );
  const makespan = r.makespan;
  if (typeof makespan !== 'number' || !Number.isFinite(makespan) || makespan < 0) {
    throw new InvalidArgumentError(`${what}: result.makespan must be a finite number >= 0, got ${describeValue(makespan)}`);
  }
  for (const field of ['bubbleFraction', 'throughput'] as const) {
    if (typeof r[field] !== 'number') throw new InvalidArgumentError(`${what}: result.${field} must be a number, got ${describeValue(r[field])}`);
  }
  if (!Array.isArray(r.peakMemoryBytes)) throw new InvalidArgumentError(`${what}: result.peakMemoryBytes must be an array, got ${describeValue(r.peakMemoryBytes)}`);
  const analysis = r.analysis as Partial<Record<keyof SimulationResult['analysis'], unknown>> | null | undefined;
  if (analysis === null || typeof analysis !== 'object') throw new InvalidArgumentError(`${what}: result.analysis must be the analysis validateSchedule() returns, got ${describeValue(analysis)}`);
  for (const field of ['forwardsBeforeFirstBackward', 'peakActivations', 'weightVersions', 'maxStaleness'] as const) {
    if (!Array.isArray(analysis[field])) throw new InvalidArgumentError(`${what}: result.analysis.${field} must be an array, got ${describeValue(analysis[field])}`);
  }
}

function checkTitle(options: RenderOptions, what: string): void {
  if (options.title !== undefined && typeof options.title !== 'string') {
    throw new InvalidArgumentError(`${what}: options.title must be a string, got ${describeValue(options.title)}`);
  }
}

/** The default title: name and parameters. @category Pipeline schedules */
export function scheduleTitle(result: SimulationResult): string {
  checkResult(result, 'scheduleTitle(result)');
  return titleOf(result);
}

function titleOf(result: SimulationResult): string {
  const params = Object.entries(result.schedule.params)
    .map(([k, v]) => `${k}=${v}`)
    .join(' ');
  return `${result.schedule.name} (${params})`;
}

const round = (x: number, digits = 3): string => String(Number(x.toFixed(digits)));

/** Human-readable figures: makespan, bubble fraction, throughput, memory and staleness per stage. @category Pipeline schedules */
export function summarize(result: SimulationResult): string[] {
  checkResult(result, 'summarize(result)');
  return summaryOf(result);
}

function summaryOf(result: SimulationResult): string[] {
  const a = result.analysis;
  const memory = result.peakMemoryBytes.some((b) => b > 0);
  const lines = [
    `makespan:        ${round(result.makespan)}`,
    `bubble fraction: ${round(result.bubbleFraction, 4)}`,
    `throughput:      ${round(result.throughput, 4)} micro-batches per time unit`,
    `${rowName(result.schedule).padStart(6)}  forwards-before-first-backward  peak-activations  weight-versions  max-staleness` +
      (memory ? '  peak-memory-bytes' : ''),
  ];
  for (let s = 0; s < result.schedule.stages; s++) {
    lines.push(
      `${String(s).padStart(6)}  ${String(a.forwardsBeforeFirstBackward[s]).padStart(30)}  ${String(a.peakActivations[s]).padStart(16)}  ` +
        `${String(a.weightVersions[s]).padStart(15)}  ${String(a.maxStaleness[s]).padStart(13)}` +
        (memory ? `  ${String(Math.round(result.peakMemoryBytes[s]!)).padStart(17)}` : ''),
    );
  }
  if (a.unappliedGradients > 0) lines.push(`gradients never applied: ${a.unappliedGradients}`);
  return lines;
}

/** True when some stage runs work of more than one pipeline: labels then name the pipeline. */
function sharesStages(result: SimulationResult): boolean {
  return result.schedule.actions.some((row) => new Set(row.filter((a) => computeKinds.has(a.kind)).map((a) => a.pipeline)).size > 1);
}

/**
 * What a row of the picture is, as the schedule's registry entry says: a `worker` holding a whole
 * model replica in the data-parallel forms (SAPipe, Wavelet's data-parallel form), a pipeline
 * `stage` otherwise (and for a custom schedule).
 *
 * @category Pipeline schedules
 */
export function rowName(schedule: Pick<SimulationResult['schedule'], 'name' | 'params'>): 'worker' | 'stage' {
  if (schedule === null || typeof schedule !== 'object' || schedule.params === null || typeof schedule.params !== 'object') {
    throw new InvalidArgumentError(`rowName: pass a Schedule, got ${describeValue(schedule)}`);
  }
  return scheduleEntry(schedule.name)?.rowName(schedule.params) ?? 'stage';
}

/** Model chunk of an action where stages hold several (interleaved 1F1B): part = stage + chunk * S. */
const chunkOf = (a: Action, stages: number): number => Math.floor(a.part / stages);

/** F, B, W; lower case for the odd chunks of an interleaved schedule, so its two chunks differ. */
function letterOf(a: Action, stages: number, chunked: boolean): string {
  const letter = a.kind === 'forward' ? 'F' : a.kind === 'backward' ? 'B' : 'W';
  return chunked && chunkOf(a, stages) % 2 === 1 ? letter.toLowerCase() : letter;
}

/**
 * The timeline as text: one line per stage, `F3` a forward of micro-batch 3 (`F1.3` of pipeline 1
 * where a stage runs several pipelines), `.` idle.
 *
 * @category Pipeline schedules
 */
export function renderAscii(result: SimulationResult, options: RenderOptions = {}): string {
  checkResult(result, 'renderAscii(result)');
  checkOptions(options, RENDER_OPTION_KEYS, 'renderAscii(result, options)');
  checkTitle(options, 'renderAscii');
  const many = sharesStages(result);
  const S = result.schedule.stages;
  const chunked = result.schedule.parts > S;
  const labelOf = (a: Action): string => `${letterOf(a, S, chunked)}${many ? `${a.pipeline}.` : ''}${a.microBatch}`;
  const rowLabel = rowName(result.schedule);
  let longest = 2;
  for (const row of result.timeline) for (const t of row) if (computeKinds.has(t.action.kind)) longest = Math.max(longest, labelOf(t.action).length);
  const cellWidth = options.cellWidth ?? Math.min(12, longest + 1);
  if (!Number.isInteger(cellWidth) || cellWidth < 2 || cellWidth > 12) {
    throw new InvalidArgumentError(`renderAscii: options.cellWidth must be an integer in [2, 12], got ${describeValue(cellWidth)}`);
  }
  let quantum = Infinity;
  for (const row of result.timeline) for (const t of row) if (t.end > t.start && t.action.kind !== 'allReduce') quantum = Math.min(quantum, t.end - t.start);
  if (!Number.isFinite(quantum)) quantum = 1;
  const hasLane = (row: readonly TimedAction[]): boolean => row.some((t) => t.action.kind === 'allReduce' && t.end > t.start);
  const lineCount = result.timeline.reduce((n, row) => n + (hasLane(row) ? 2 : 1), 0);
  // The smallest action gets `cellWidth` columns, unless the picture would then pass
  // MAX_TEXT_CELLS (actions of very different lengths, or a long schedule): then the time axis
  // is scaled to fit, and each action keeps at least one column.
  const maxWidth = Math.max(1, Math.floor(MAX_TEXT_CELLS / lineCount));
  const makespan = result.makespan;
  let col = (time: number): number => Math.round((time / quantum) * cellWidth);
  let width = col(makespan);
  const scaled = !(width <= maxWidth);
  if (scaled) {
    // as wide as `cellWidth` columns for each action of the busiest row, at least 120
    let busiest = 0;
    for (const row of result.timeline) busiest = Math.max(busiest, row.length);
    width = Math.min(maxWidth, Math.max(120, busiest * cellWidth));
    col = (time: number): number => Math.min(width, Math.round((time / makespan) * width));
  }
  const from = (time: number): number => Math.max(0, col(time));
  const lines = [options.title ?? titleOf(result)];
  if (scaled) {
    lines.push(
      `(scaled to ${width} columns, ${round(makespan / width, 6)} time units each: at ${cellWidth} columns for the shortest action ` +
        `(${round(quantum, 6)}) the picture would not fit; actions shorter than a column are drawn one column wide)`,
    );
  }
  result.timeline.forEach((row, s) => {
    const cells = new Array<string>(width).fill('.');
    for (const t of row) {
      const a = t.action;
      const start = from(t.start);
      const to = Math.max(start + 1, col(t.end));
      if (a.kind === 'forward' || a.kind === 'backward' || a.kind === 'weightGrad') {
        const label = labelOf(a);
        const fill = a.kind === 'forward' ? ' ' : a.kind === 'backward' ? '=' : '~';
        for (let c = start; c < to && c < width; c++) cells[c] = label[c - start] ?? fill;
        if (to - start < label.length && to - 1 < width && to - 1 >= start) cells[to - 1] = label[label.length - 1] ?? fill;
      } else if (a.kind === 'optimizerStep' || a.kind === 'elasticAverage') {
        const mark = a.kind === 'optimizerStep' ? '|' : '*';
        if (t.end > t.start) for (let c = start; c < to && c < width; c++) cells[c] = mark;
        else if (start > 0 && cells[start - 1] === '.') cells[start - 1] = mark;
        else if (start < width && cells[start] === '.') cells[start] = mark;
      }
    }
    lines.push(`${rowLabel} ${String(s).padStart(2)} |${cells.join('')}|`);
    // The all-reduce runs beside the compute (that overlap is what SAPipe and Wavelet are for), so
    // it gets a lane of its own under the row.
    if (hasLane(row)) {
      const lane = new Array<string>(width).fill(' ');
      for (const t of row) {
        if (t.action.kind !== 'allReduce' || !(t.end > t.start)) continue;
        for (let c = from(t.start); c < Math.max(from(t.start) + 1, col(t.end)) && c < width; c++) lane[c] = 'A';
      }
      lines.push(`${''.padStart(rowLabel.length + 3)} |${lane.join('')}|`);
    }
  });
  lines.push(
    'legend: F forward, B backward (=), W weight gradient (~), | optimizer step, * elastic averaging, A all-reduce (the lane under a row), . idle' +
      (chunked ? '; upper case: even model chunks (0, 2, ...), lower case: odd chunks (1, 3, ...)' : ''),
  );
  lines.push(...summaryOf(result));
  return lines.join('\n');
}

const escapeXml = (text: string): string => text.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;');

/** Hue of micro-batch m: golden-angle steps keep neighbours apart for any M. */
function hue(m: number): number {
  return Math.round((m * 137.508) % 360);
}

function fillOf(a: Action): string {
  const h = hue(a.microBatch);
  if (a.kind === 'forward') return `hsl(${h},72%,62%)`;
  if (a.kind === 'backward') return `hsl(${h},62%,36%)`;
  return `hsl(${h},60%,84%)`;
}

/** The timeline as a standalone SVG document. @category Pipeline schedules */
export function renderSvg(result: SimulationResult, options: RenderOptions = {}): string {
  checkResult(result, 'renderSvg(result)');
  checkOptions(options, RENDER_OPTION_KEYS, 'renderSvg(result, options)');
  checkTitle(options, 'renderSvg');
  const chunkedSvg = result.schedule.parts > result.schedule.stages;
  const S = result.schedule.stages;
  const makespan = result.makespan > 0 ? result.makespan : 1;
  const usual = Math.max(2, Math.min(60, 1100 / makespan));
  const scale = options.scale ?? (makespan * usual <= MAX_SVG_WIDTH ? usual : 1100 / makespan);
  if (typeof scale !== 'number' || !Number.isFinite(scale) || scale <= 0) {
    throw new InvalidArgumentError(`renderSvg: options.scale must be a number > 0, got ${describeValue(scale)}`);
  }
  if (makespan * scale > MAX_SVG_WIDTH) {
    throw new InvalidArgumentError(
      `renderSvg: options.scale ${scale} makes the chart ${makespan * scale} px wide (the makespan is ${makespan}); ` +
        `pass a scale of at most ${MAX_SVG_WIDTH / makespan}, or leave it out to fit about 1100 px`,
    );
  }
  const left = 70;
  const top = 64;
  const rowHeight = 30;
  const laneHeight = 6;
  const gap = 8;
  const rowPitch = rowHeight + laneHeight + gap;
  const chartWidth = makespan * scale;
  const many = sharesStages(result);
  const stats = summaryOf(result);
  const legendTop = top + S * rowPitch + 26;
  const M = result.schedule.microBatches;
  const swatches = Math.min(M, 32);
  const legendRows = 2;
  const statsTop = legendTop + legendRows * 22 + 14;
  const width = Math.max(left + chartWidth + 30, 760);
  const height = statsTop + stats.length * 15 + 16;
  // Every pass drawn takes at least 133 characters (its rectangle and tooltip, with the shortest
  // numbers), every other action drawn 85: a schedule certain to be too large is refused before
  // any of it is built.
  let drawn = 0;
  let least = 0;
  for (const row of result.timeline) {
    for (const t of row) {
      const kind = t.action.kind;
      if (computeKinds.has(kind)) least += 133;
      else if (kind === 'allReduce' || kind === 'optimizerStep' || kind === 'elasticAverage' || kind === 'predictWeights') least += 85;
      else continue;
      drawn++;
    }
  }
  const tooLarge = (): InvalidArgumentError =>
    new InvalidArgumentError(
      `renderSvg: the picture of this schedule (${drawn} actions drawn) would pass ${MAX_SVG_CHARS} characters; ` +
        'draw a smaller schedule (fewer micro-batches or stages), or use renderAscii(), which scales to fit',
    );
  if (least > MAX_SVG_CHARS) throw tooLarge();
  const out: string[] = [];
  let length = 0;
  // The document grows with the actions drawn; past MAX_SVG_CHARS it is refused with what to do
  // instead, rather than failing in the string join (or the browser).
  const emit = (...parts: string[]): void => {
    for (const part of parts) length += part.length + 1;
    if (length > MAX_SVG_CHARS) throw tooLarge();
    out.push(...parts);
  };
  emit(
    `<svg xmlns="http://www.w3.org/2000/svg" width="${Math.ceil(width)}" height="${Math.ceil(height)}" viewBox="0 0 ${Math.ceil(width)} ${Math.ceil(height)}" font-family="Helvetica, Arial, sans-serif">`,
    '<defs><pattern id="idle" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">' +
      '<rect width="6" height="6" fill="#fbeaea"/><line x1="0" y1="0" x2="0" y2="6" stroke="#e3a5a5" stroke-width="2"/></pattern></defs>',
    `<rect width="100%" height="100%" fill="white"/>`,
    `<text x="${left}" y="24" font-size="17" font-weight="bold">${escapeXml(options.title ?? titleOf(result))}</text>`,
    `<text x="${left}" y="44" font-size="12" fill="#444">makespan ${round(result.makespan)}, bubble fraction ${round(result.bubbleFraction, 4)}, ` +
      `peak activations ${result.analysis.peakActivations.join('/')}, weight versions ${result.analysis.weightVersions.join('/')}, ` +
      `max staleness ${result.analysis.maxStaleness.join('/')} (per stage)</text>`,
  );
  // time axis ticks
  const step = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000].find((x) => x * scale >= 40) ?? niceStep(40 / scale);
  for (let k = 0; k * step <= makespan + 1e-9; k++) {
    const t = k * step;
    const x = left + t * scale;
    emit(`<line x1="${x}" y1="${top - 6}" x2="${x}" y2="${top + S * rowPitch - gap}" stroke="#ddd" stroke-width="0.5"/>`);
    emit(`<text x="${x}" y="${top - 9}" font-size="9" fill="#777" text-anchor="middle">${round(t)}</text>`);
  }
  result.timeline.forEach((row, s) => {
    const y = top + s * rowPitch;
    emit(`<text x="${left - 8}" y="${y + rowHeight / 2 + 4}" font-size="12" text-anchor="end">${rowName(result.schedule)} ${s}</text>`);
    emit(`<rect x="${left}" y="${y}" width="${chartWidth}" height="${rowHeight}" fill="url(#idle)" stroke="#ccc" stroke-width="0.5"/>`);
    for (const t of row) {
      const a = t.action;
      const x = left + t.start * scale;
      const w = (t.end - t.start) * scale;
      const tip = `<title>${escapeXml(formatAction(a))} [${round(t.start)}, ${round(t.end)})</title>`;
      if (a.kind === 'forward' || a.kind === 'backward' || a.kind === 'weightGrad') {
        const dashed = a.kind === 'weightGrad' ? ' stroke-dasharray="3,2"' : '';
        emit(`<rect x="${x}" y="${y}" width="${Math.max(w, 0.5)}" height="${rowHeight}" fill="${fillOf(a)}" stroke="#222" stroke-width="0.6"${dashed}>${tip}</rect>`);
        // Interleaved chunks: the chunk's letter before the micro-batch (a1 = chunk 0, b1 = chunk 1).
        const chunk = chunkedSvg ? String.fromCharCode(97 + (chunkOf(a, result.schedule.stages) % 26)) : '';
        const label = `${chunk}${many ? `${a.pipeline}.` : ''}${a.microBatch}`;
        if (w >= 7 * label.length + 2) {
          const color = a.kind === 'backward' ? 'white' : '#111';
          emit(`<text x="${x + w / 2}" y="${y + rowHeight / 2 + 4}" font-size="11" text-anchor="middle" fill="${color}">${label}</text>`);
        }
        if (a.kind === 'backward' && w >= 6) {
          emit(`<line x1="${x + 1}" y1="${y + rowHeight - 3}" x2="${x + w - 1}" y2="${y + rowHeight - 3}" stroke="white" stroke-width="1.2"/>`);
        }
      } else if (a.kind === 'allReduce') {
        const lw = Math.max(w, 2);
        emit(`<rect x="${x}" y="${y + rowHeight + 1}" width="${lw}" height="${laneHeight - 1}" fill="#2b6cb0">${tip}</rect>`);
      } else if (a.kind === 'optimizerStep' || a.kind === 'elasticAverage') {
        const color = a.kind === 'optimizerStep' ? '#111' : '#8e44ad';
        emit(`<rect x="${x - (w > 0 ? 0 : 1.5)}" y="${y - 2}" width="${Math.max(w, 3)}" height="${rowHeight + 4}" fill="${color}">${tip}</rect>`);
      } else if (a.kind === 'predictWeights') {
        emit(`<path d="M ${x - 3} ${y} L ${x + 3} ${y} L ${x} ${y + 6} Z" fill="#e67e22">${tip}</path>`);
      }
    }
  });
  // legend
  const present = new Set<string>(result.timeline.flatMap((row) => row.map((x) => x.action.kind)));
  const items: [string, string, string][] = [
    ['forward', 'forward', `<rect width="14" height="12" fill="hsl(0,72%,62%)" stroke="#222" stroke-width="0.6"/>`],
    ['backward', 'backward', `<rect width="14" height="12" fill="hsl(0,62%,36%)" stroke="#222" stroke-width="0.6"/><line x1="1" y1="9" x2="13" y2="9" stroke="white"/>`],
    ['weightGrad', 'weight gradient', `<rect width="14" height="12" fill="hsl(0,60%,84%)" stroke="#222" stroke-width="0.6" stroke-dasharray="3,2"/>`],
    ['optimizerStep', 'optimizer step', `<rect x="5" width="3" height="12" fill="#111"/>`],
    ['elasticAverage', 'elastic averaging', `<rect x="5" width="3" height="12" fill="#8e44ad"/>`],
    ['predictWeights', 'weight prediction', `<path d="M 3 0 L 11 0 L 7 7 Z" fill="#e67e22"/>`],
    ['allReduce', 'all-reduce', `<rect y="4" width="14" height="5" fill="#2b6cb0"/>`],
    ['', 'idle (bubble)', `<rect width="14" height="12" fill="url(#idle)" stroke="#ccc"/>`],
  ];
  let lx = left;
  for (const [kind, label, icon] of items) {
    if (kind !== '' && !present.has(kind)) continue;
    emit(`<g transform="translate(${lx},${legendTop})">${icon}<text x="18" y="10" font-size="11">${label}</text></g>`);
    lx += 30 + label.length * 6.2;
  }
  emit(`<text x="${left}" y="${legendTop + 34}" font-size="11">micro-batch:</text>`);
  for (let m = 0; m < swatches; m++) {
    const x = left + 76 + m * 24;
    emit(`<rect x="${x}" y="${legendTop + 24}" width="20" height="13" fill="hsl(${hue(m)},72%,62%)" stroke="#222" stroke-width="0.5"/>`);
    emit(`<text x="${x + 10}" y="${legendTop + 34}" font-size="9" text-anchor="middle">${m}</text>`);
  }
  if (M > swatches) emit(`<text x="${left + 80 + swatches * 24}" y="${legendTop + 34}" font-size="11">... (${M} in all)</text>`);
  stats.forEach((line, i) => {
    emit(`<text x="${left}" y="${statsTop + i * 15}" font-size="11" font-family="Menlo, Consolas, monospace" xml:space="preserve">${escapeXml(line)}</text>`);
  });
  emit('</svg>');
  return out.join('\n');
}

/** The smallest of 1, 2 and 5 times a power of ten that is at least `x` (a tick spacing). */
function niceStep(x: number): number {
  const power = 10 ** Math.floor(Math.log10(x));
  for (const m of [1, 2, 5, 10]) if (m * power >= x) return m * power;
  return 10 * power;
}

/** A self-contained HTML page with the SVG picture and the figures. @category Pipeline schedules */
export function renderHtml(result: SimulationResult, options: RenderOptions = {}): string {
  checkResult(result, 'renderHtml(result)');
  checkOptions(options, RENDER_OPTION_KEYS, 'renderHtml(result, options)');
  checkTitle(options, 'renderHtml');
  const title = options.title ?? titleOf(result);
  return [
    '<!doctype html>',
    '<html lang="en"><head><meta charset="utf-8">',
    `<title>${escapeXml(title)}</title>`,
    '<style>body{font-family:Helvetica,Arial,sans-serif;margin:16px;color:#111}svg{max-width:100%;height:auto}</style>',
    '</head><body>',
    renderSvg(result, options),
    '</body></html>',
  ].join('\n');
}
