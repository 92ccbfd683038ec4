/**
 * Pictures of simulated schedules: stages as rows, time to the right, a colour per micro-batch,
 * forward, backward and weight-gradient passes told apart, idle time (bubbles) hatched, and a
 * legend; as text for a terminal, SVG, or a self-contained HTML page.
 */
import { InvalidArgumentError } from '../errors.js';
import { type Action, computeKinds, formatAction } from './schedule.js';
import type { SimulationResult } from './simulate.js';
import { checkOptions, describeValue, optionKeys } from '../validate.js';

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

function checkResult(result: SimulationResult): void {
  const r = result as Partial<SimulationResult> | null;
  if (
    r === null ||
    typeof r !== 'object' ||
    !Array.isArray(r.timeline) ||
    typeof r.schedule !== 'object' ||
    r.schedule === null ||
    typeof r.schedule.params !== 'object' ||
    typeof r.analysis !== 'object' ||
    r.analysis === null
  ) {
    throw new InvalidArgumentError(`pass the result of simulateSchedule(), got ${describeValue(result)}`);
  }
}

/** The default title: name and parameters. @category Pipeline schedules */
export function scheduleTitle(result: SimulationResult): string {
  checkResult(result);
  const params = Object.entries(result.schedule.params)
    .map(([k, v]) => `${k}=${v}`)
    .join(' ');
  return `${result.schedule.name} (${params})`;
}

const round = (x: number, digits = 3): string => String(Number(x.toFixed(digits)));

/** Human-readable figures: makespan, bubble fraction, throughput, memory and staleness per stage. @category Pipeline schedules */
export function summarize(result: SimulationResult): string[] {
  checkResult(result);
  const a = result.analysis;
  const lines = [
    `makespan:        ${round(result.makespan)}`,
    `bubble fraction: ${round(result.bubbleFraction, 4)}`,
    `throughput:      ${round(result.throughput, 4)} micro-batches per time unit`,
    `${rowName(result.schedule).padStart(6)}  forwards-before-first-backward  peak-activations  weight-versions  max-staleness` +
      (result.peakMemoryBytes.some((b) => b > 0) ? '  peak-memory-bytes' : ''),
  ];
  for (let s = 0; s < result.schedule.stages; s++) {
    lines.push(
      `${String(s).padStart(6)}  ${String(a.forwardsBeforeFirstBackward[s]).padStart(30)}  ${String(a.peakActivations[s]).padStart(16)}  ` +
        `${String(a.weightVersions[s]).padStart(15)}  ${String(a.maxStaleness[s]).padStart(13)}` +
        (result.peakMemoryBytes.some((b) => b > 0) ? `  ${String(Math.round(result.peakMemoryBytes[s]!)).padStart(17)}` : ''),
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
 * What a row of the picture is: a `worker` holding a whole model replica in the data-parallel
 * forms (SAPipe, Wavelet's data-parallel form), a pipeline `stage` otherwise.
 *
 * @category Pipeline schedules
 */
export function rowName(schedule: Pick<SimulationResult['schedule'], 'name' | 'params'>): 'worker' | 'stage' {
  return schedule.name === 'sapipe' || (schedule.name === 'wavelet' && schedule.params.form === 'data-parallel') ? 'worker' : 'stage';
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
  checkResult(result);
  checkOptions(options, RENDER_OPTION_KEYS, 'renderAscii(result, options)');
  const many = sharesStages(result);
  const S = result.schedule.stages;
  const chunked = result.schedule.parts > S;
  const labelOf = (a: Action): string => `${letterOf(a, S, chunked)}${many ? `${a.pipeline}.` : ''}${a.microBatch}`;
  const rowLabel = rowName(result.schedule);
  let longest = 2;
  for (const row of result.timeline) for (const t of row) if (computeKinds.has(t.action.kind)) longest = Math.max(longest, labelOf(t.action).length);
  const cellWidth = options.cellWidth ?? Math.min(12, longest + 1);
  if (!Number.isInteger(cellWidth) || cellWidth < 2 || cellWidth > 12) throw new InvalidArgumentError('cellWidth must be an integer in [2, 12]');
  let quantum = Infinity;
  for (const row of result.timeline) for (const t of row) if (t.end > t.start && t.action.kind !== 'allReduce') quantum = Math.min(quantum, t.end - t.start);
  if (!Number.isFinite(quantum)) quantum = 1;
  const col = (time: number): number => Math.round((time / quantum) * cellWidth);
  const width = col(result.makespan);
  const lines = [options.title ?? scheduleTitle(result)];
  result.timeline.forEach((row, s) => {
    const cells = new Array<string>(width).fill('.');
    for (const t of row) {
      const a = t.action;
      const from = col(t.start);
      const to = Math.max(from + 1, col(t.end));
      if (a.kind === 'forward' || a.kind === 'backward' || a.kind === 'weightGrad') {
        const label = labelOf(a);
        const fill = a.kind === 'forward' ? ' ' : a.kind === 'backward' ? '=' : '~';
        for (let c = from; c < to && c < width; c++) cells[c] = label[c - from] ?? fill;
        if (to - from < label.length && to - 1 < width && to - 1 >= from) cells[to - 1] = label[label.length - 1] ?? fill;
      } else if (a.kind === 'optimizerStep' || a.kind === 'elasticAverage') {
        const mark = a.kind === 'optimizerStep' ? '|' : '*';
        if (t.end > t.start) for (let c = from; c < to && c < width; c++) cells[c] = mark;
        else if (from > 0 && cells[from - 1] === '.') cells[from - 1] = mark;
        else if (from < width && cells[from] === '.') cells[from] = mark;
      }
    }
    lines.push(`${rowLabel} ${String(s).padStart(2)} |${cells.join('')}|`);
    // The all-reduce runs beside the compute (that overlap is what SAPipe and Wavelet are for), so
    // it gets a lane of its own under the row.
    const reduces = row.filter((t) => t.action.kind === 'allReduce' && t.end > t.start);
    if (reduces.length > 0) {
      const lane = new Array<string>(width).fill(' ');
      for (const t of reduces) for (let c = col(t.start); c < Math.max(col(t.start) + 1, col(t.end)) && c < width; c++) lane[c] = 'A';
      lines.push(`${''.padStart(rowLabel.length + 3)} |${lane.join('')}|`);
    }
  });
  lines.push(
    'legend: F forward, B backward (=), W weight gradient (~), | optimizer step, * elastic averaging, A all-reduce (the lane under a row), . idle' +
      (chunked ? '; upper case: even model chunks (0, 2, ...), lower case: odd chunks (1, 3, ...)' : ''),
  );
  lines.push(...summarize(result));
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
  checkResult(result);
  checkOptions(options, RENDER_OPTION_KEYS, 'renderSvg(result, options)');
  const chunkedSvg = result.schedule.parts > result.schedule.stages;
  const S = result.schedule.stages;
  const makespan = result.makespan > 0 ? result.makespan : 1;
  const scale = options.scale ?? Math.max(2, Math.min(60, 1100 / makespan));
  if (typeof scale !== 'number' || !Number.isFinite(scale) || scale <= 0) throw new InvalidArgumentError('scale must be a number > 0');
  const left = 70;
  const top = 64;
  const rowHeight = 30;
  const laneHeight = 6;
  const gap = 8;
  const rowPitch = rowHeight + laneHeight + gap;
  const chartWidth = makespan * scale;
  const many = sharesStages(result);
  const stats = summarize(result);
  const legendTop = top + S * rowPitch + 26;
  const M = result.schedule.microBatches;
  const swatches = Math.min(M, 32);
  const legendRows = 2;
  const statsTop = legendTop + legendRows * 22 + 14;
  const width = Math.max(left + chartWidth + 30, 760);
  const height = statsTop + stats.length * 15 + 16;
  const out: string[] = [];
  out.push(
    `<svg xmlns="http://www.w3.org/2000/svg" width="${Math.ceil(width)}" height="${Math.ceil(height)}" viewBox="0 0 ${Math.ceil(width)} ${Math.ceil(height)}" font-family="Helvetica, Arial, sans-serif">`,
    '<defs><pattern id="idle" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">' +
      '<rect width="6" height="6" fill="#fbeaea"/><line x1="0" y1="0" x2="0" y2="6" stroke="#e3a5a5" stroke-width="2"/></pattern></defs>',
    `<rect width="100%" height="100%" fill="white"/>`,
    `<text x="${left}" y="24" font-size="17" font-weight="bold">${escapeXml(options.title ?? scheduleTitle(result))}</text>`,
    `<text x="${left}" y="44" font-size="12" fill="#444">makespan ${round(result.makespan)}, bubble fraction ${round(result.bubbleFraction, 4)}, ` +
      `peak activations ${result.analysis.peakActivations.join('/')}, weight versions ${result.analysis.weightVersions.join('/')}, ` +
      `max staleness ${result.analysis.maxStaleness.join('/')} (per stage)</text>`,
  );
  // time axis ticks
  const step = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000].find((x) => x * scale >= 40) ?? Math.ceil(makespan / 10);
  for (let t = 0; t <= makespan + 1e-9; t += step) {
    const x = left + t * scale;
    out.push(`<line x1="${x}" y1="${top - 6}" x2="${x}" y2="${top + S * rowPitch - gap}" stroke="#ddd" stroke-width="0.5"/>`);
    out.push(`<text x="${x}" y="${top - 9}" font-size="9" fill="#777" text-anchor="middle">${round(t)}</text>`);
  }
  result.timeline.forEach((row, s) => {
    const y = top + s * rowPitch;
    out.push(`<text x="${left - 8}" y="${y + rowHeight / 2 + 4}" font-size="12" text-anchor="end">${rowName(result.schedule)} ${s}</text>`);
    out.push(`<rect x="${left}" y="${y}" width="${chartWidth}" height="${rowHeight}" fill="url(#idle)" stroke="#ccc" stroke-width="0.5"/>`);
    for (const t of row) {
      const a = t.action;
      const x = left + t.start * scale;
      const w = (t.end - t.start) * scale;
      const tip = `<title>${escapeXml(formatAction(a))} [${round(t.start)}, ${round(t.end)})</title>`;
      if (a.kind === 'forward' || a.kind === 'backward' || a.kind === 'weightGrad') {
        const dashed = a.kind === 'weightGrad' ? ' stroke-dasharray="3,2"' : '';
        out.push(`<rect x="${x}" y="${y}" width="${Math.max(w, 0.5)}" height="${rowHeight}" fill="${fillOf(a)}" stroke="#222" stroke-width="0.6"${dashed}>${tip}</rect>`);
        // Interleaved chunks: the chunk's letter before the micro-batch (a1 = chunk 0, b1 = chunk 1).
        const chunk = chunkedSvg ? String.fromCharCode(97 + (chunkOf(a, result.schedule.stages) % 26)) : '';
        const label = `${chunk}${many ? `${a.pipeline}.` : ''}${a.microBatch}`;
        if (w >= 7 * label.length + 2) {
          const color = a.kind === 'backward' ? 'white' : '#111';
          out.push(`<text x="${x + w / 2}" y="${y + rowHeight / 2 + 4}" font-size="11" text-anchor="middle" fill="${color}">${label}</text>`);
        }
        if (a.kind === 'backward' && w >= 6) {
          out.push(`<line x1="${x + 1}" y1="${y + rowHeight - 3}" x2="${x + w - 1}" y2="${y + rowHeight - 3}" stroke="white" stroke-width="1.2"/>`);
        }
      } else if (a.kind === 'allReduce') {
        const lw = Math.max(w, 2);
        out.push(`<rect x="${x}" y="${y + rowHeight + 1}" width="${lw}" height="${laneHeight - 1}" fill="#2b6cb0">${tip}</rect>`);
      } else if (a.kind === 'optimizerStep' || a.kind === 'elasticAverage') {
        const color = a.kind === 'optimizerStep' ? '#111' : '#8e44ad';
        out.push(`<rect x="${x - (w > 0 ? 0 : 1.5)}" y="${y - 2}" width="${Math.max(w, 3)}" height="${rowHeight + 4}" fill="${color}">${tip}</rect>`);
      } else if (a.kind === 'predictWeights') {
        out.push(`<path d="M ${x - 3} ${y} L ${x + 3} ${y} L ${x} ${y + 6} Z" fill="#e67e22">${tip}</path>`);
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
    out.push(`<g transform="translate(${lx},${legendTop})">${icon}<text x="18" y="10" font-size="11">${label}</text></g>`);
    lx += 30 + label.length * 6.2;
  }
  out.push(`<text x="${left}" y="${legendTop + 34}" font-size="11">micro-batch:</text>`);
  for (let m = 0; m < swatches; m++) {
    const x = left + 76 + m * 24;
    out.push(`<rect x="${x}" y="${legendTop + 24}" width="20" height="13" fill="hsl(${hue(m)},72%,62%)" stroke="#222" stroke-width="0.5"/>`);
    out.push(`<text x="${x + 10}" y="${legendTop + 34}" font-size="9" text-anchor="middle">${m}</text>`);
  }
  if (M > swatches) out.push(`<text x="${left + 80 + swatches * 24}" y="${legendTop + 34}" font-size="11">... (${M} in all)</text>`);
  stats.forEach((line, i) => {
    out.push(`<text x="${left}" y="${statsTop + i * 15}" font-size="11" font-family="Menlo, Consolas, monospace" xml:space="preserve">${escapeXml(line)}</text>`);
  });
  out.push('</svg>');
  return out.join('\n');
}

/** A self-contained HTML page with the SVG picture and the figures. @category Pipeline schedules */
export function renderHtml(result: SimulationResult, options: RenderOptions = {}): string {
  checkOptions(options, RENDER_OPTION_KEYS, 'renderHtml(result, options)');
  const title = options.title ?? scheduleTitle(result);
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
