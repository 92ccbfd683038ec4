/**
 * Cases whose outcome is pinned by digests in fixtures/equivalence.json: generated schedules
 * (every generator, many shapes and options), their analyses and simulations under several cost
 * models, text pictures, hand-written schedules, and randomly broken schedules with the error
 * each one gets. The digests were recorded from the generators, validator and simulator as they
 * were before they were rewritten to run in linear time, so equal digests mean the same actions
 * in the same order, the same figures to the last bit, and the same first broken action named.
 *
 * The module takes the pipeline API as an argument, so the same cases run against another build
 * (test/pipeline/equivalence.test.ts explains how the fixture is recorded).
 */
import { createHash } from 'node:crypto';

/** The part of the pipeline API the cases use (the shape of lib/pipeline/index.ts). */
export interface PipelineApi {
  generateSchedule(name: string, options: Record<string, unknown>): Schedule;
  validateSchedule(schedule: Schedule): unknown;
  simulateSchedule(schedule: Schedule, costs?: Record<string, unknown>): SimulationResult;
  withCommunication(schedule: Schedule): Schedule;
  parseSchedule(lines: string | readonly string[], shape: Record<string, unknown>): Schedule;
  createSchedule(init: Record<string, unknown>): Schedule;
  formatSchedule(schedule: Schedule): string;
  renderAscii(result: SimulationResult): string;
  renderSvg(result: SimulationResult): string;
}

interface Action {
  readonly kind: string;
  readonly stage: number;
  readonly part: number;
  readonly microBatch: number;
  readonly pipeline: number;
  readonly version: number;
  readonly peer: number;
}

interface Schedule {
  readonly name: string;
  readonly stages: number;
  readonly parts: number;
  readonly microBatches: number;
  readonly pipelines: number;
  readonly actions: readonly (readonly Action[])[];
  readonly params: Readonly<Record<string, number | string>>;
}

interface SimulationResult {
  readonly timeline: readonly (readonly { start: number; end: number; index: number }[])[];
  readonly makespan: number;
  readonly busy: readonly number[];
  readonly bubbleFraction: number;
  readonly throughput: number;
  readonly peakActivationBytes: readonly number[];
  readonly peakMemoryBytes: readonly number[];
  readonly analysis: unknown;
}

/** mulberry32, as in the package, written out so that the module needs nothing from lib/. */
function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let x = a;
    x = Math.imul(x ^ (x >>> 15), x | 1);
    x ^= x + Math.imul(x ^ (x >>> 7), x | 61);
    return ((x ^ (x >>> 14)) >>> 0) / 4294967296;
  };
}

/** JSON with object keys sorted, so that digests do not depend on the order fields were set in. */
function canonical(value: unknown): string {
  return JSON.stringify(value, (_key, v: unknown) => {
    if (v === null || typeof v !== 'object' || Array.isArray(v)) return typeof v === 'number' && !Number.isFinite(v) ? String(v) : v;
    return Object.fromEntries(Object.keys(v).sort().map((k) => [k, (v as Record<string, unknown>)[k]]));
  });
}

const digest = (text: string): string => createHash('sha256').update(text).digest('hex').slice(0, 16);

function scheduleText(api: PipelineApi, s: Schedule): string {
  return canonical({ name: s.name, stages: s.stages, parts: s.parts, microBatches: s.microBatches, pipelines: s.pipelines, params: s.params }) + api.formatSchedule(s);
}

function simulationText(r: SimulationResult): string {
  return canonical({
    timeline: r.timeline.map((row) => row.map((t) => [t.start, t.end, t.index])),
    makespan: r.makespan,
    busy: r.busy,
    bubbleFraction: r.bubbleFraction,
    throughput: r.throughput,
    peakActivationBytes: r.peakActivationBytes,
    peakMemoryBytes: r.peakMemoryBytes,
  });
}

const costModels: Record<string, unknown>[] = [
  {},
  { forward: 1, backward: 2, p2pLatency: 1 },
  { forward: 1, backward: 1, p2pLatency: 1, allReduce: 2.5, optimizerStep: 0.3 },
  { forward: 0.7, backward: 1.9, weightGrad: 0.6, p2pLatency: 0.25, p2pBandwidth: 3, activationBytes: 5, storedActivationBytes: 7, weightBytes: 11, optimizerStateBytes: 13 },
  { forward: 1.1, backward: 2.3, predict: 0.1, stash: 0.2, restore: 0.15, elastic: 0.4, allReduce: 0.9, optimizerStep: 0.05 },
];

/** Per-part costs for a schedule's parts, uneven so that a wrong part index shows. */
function perPartCosts(parts: number): Record<string, unknown> {
  const of = (f: (j: number) => number): number[] => Array.from({ length: parts }, (_, j) => f(j));
  return {
    forward: of((j) => 1 + ((j * 7) % 5) / 4),
    backward: of((j) => 2 + ((j * 3) % 4) / 3),
    weightGrad: of((j) => 0.5 + (j % 3) / 10),
    activationBytes: of((j) => 100 * (j + 1)),
    weightBytes: of((j) => 1000 + j),
    optimizerStateBytes: of((j) => 2000 - j),
    allReduce: of((j) => 0.5 + j / 8),
    p2pLatency: 0.375,
    p2pBandwidth: 400,
  };
}

/** Generator options: every generator over shapes from trivial to a few hundred actions. */
function generatedCases(): [string, Record<string, unknown>][] {
  const shapes: [number, number][] = [
    [1, 1],
    [1, 4],
    [2, 1],
    [2, 3],
    [3, 5],
    [4, 2],
    [4, 8],
    [5, 7],
    [6, 13],
    [8, 8],
  ];
  const cases: [string, Record<string, unknown>][] = [];
  for (const [S, M] of shapes) {
    for (const name of ['gpipe', '1f1b', 'pipedream', 'pipeoptim', 'spectrain', 'pipelined-backprop', 'sapipe', 'zb-h1']) cases.push([name, { stages: S, microBatches: M }]);
    cases.push(['wavelet', { stages: S, microBatches: M }]);
    cases.push(['wavelet', { stages: S, microBatches: M, form: 'model-parallel' }]);
    for (const iterations of [1, 2, 3]) cases.push(['pipedream-2bw', { stages: S, microBatches: M, iterations }]);
    for (const pipelines of [1, 2, 3]) {
      for (const advance of new Set([0, 1, S - 1, S + 1, M + S])) cases.push(['avgpipe', { stages: S, microBatches: M, pipelines, advance }]);
    }
  }
  for (const [S, k] of [[1, 3], [2, 2], [3, 2], [4, 2], [4, 3], [5, 1]] as const) {
    for (const virtualStages of [1, 2, 3]) cases.push(['interleaved-1f1b', { stages: S, microBatches: S * k, virtualStages }]);
  }
  cases.push(['avgpipe', { stages: 4, microBatches: 8 }]);
  cases.push(['zb-h1', { stages: 12, microBatches: 20 }]);
  cases.push(['avgpipe', { stages: 7, microBatches: 11, pipelines: 4, advance: 3 }]);
  cases.push(['1f1b', { stages: 16, microBatches: 40 }]);
  cases.push(['wavelet', { stages: 7, microBatches: 23, form: 'model-parallel' }]);
  return cases;
}

/** Hand-written schedules (valid and not) of the kind test/pipeline/schedule.test.ts uses. */
const handWritten: [string[], Record<string, unknown>][] = [
  [['0F0 0sa0>1 0F1 0sa1>1 0rg0<1 0B0 0rg1<1 0B1 0U', '1ra0<0 1F0 1B0 1ra1<0 1sg0>0 1F1 1B1 1sg1>0 1U'], { microBatches: 2 }],
  [['0B0 0F0 0U'], { microBatches: 1 }],
  [['0F0 0sa0>1 0rg0<1 0B0', '1F0 1B0 1sg0>0'], { microBatches: 1 }],
  [['0F0 0sa0>1 0B0', '1ra0<0 1F0 1B0'], { microBatches: 1 }],
  [['0F0 0F0 0B0'], { microBatches: 1 }],
  [['0F0 0F1 0B0'], { microBatches: 2 }],
  [['0F0@1 0B0 0U'], { microBatches: 1 }],
  [['0F0 0sa0>1 0B1', '1ra0<0 1F0 1B0 1F1 1sg0>0'], { microBatches: 2 }],
  [['0F0 0rg0<1 0B0', '1F0 1B0'], { microBatches: 1 }],
  [['0F0 0R0 0B0'], { microBatches: 1 }],
  [['0F0 0sa0>1 0F1 0sa1>1 0rg0<1 0B0 0rg1<1 0B1', '1ra0<0 1F0 1B0 1sg0>0 1ra1<0 1F1 1B1 1sg1>0'], { microBatches: 2 }],
  [['0F0/0 0B0/0 0A0/0 0U0/0', '1F0/0p1 1B0/0p1 1U0/0p1'], { microBatches: 1, parts: 1, pipelines: 2 }],
  [['0F0/0 0B0/0 0F1/0 0B1/0 0A0/0 0U0/0 0A1/0 0U1/0', '1F0/0p1 1B0/0p1 1F1/0p1 1B1/0p1 1A1/0 1U1/0p1 1A0/0 1U/0p1'], { microBatches: 2, parts: 1, pipelines: 2 }],
  [['0F0 0S0 0F1 0S1 0U 0R0 0B0@0 0U 0R1 0B1@0 0U'], { microBatches: 2 }],
  [['0F0 0W0 0B0 0U'], { microBatches: 1 }],
  [['0F0 0B0 0W0 0F1 0B1 0U0 0W1 0U'], { microBatches: 2 }],
  [['0F0 0sa0>1 0sa0>1 0B0', '1ra0<0 1F0 1B0'], { microBatches: 1 }],
  [['0F0 0sa0>1 0B0', '1ra0<0 1ra0<0 1F0 1B0'], { microBatches: 1 }],
  [['0F0 0sg0>1 0B0', '1F0 1B0'], { microBatches: 1 }],
  [['0F0 0A0 0B0 0A0 0U', '1F0p1 1A0 1B0p1 1U'], { microBatches: 1, parts: 1, pipelines: 2 }],
];

/** Ways to break a schedule: each keeps its shape valid, so that the validator has to find the fault. */
function mutate(s: Schedule, random: () => number): Action[][] {
  const rows = s.actions.map((row) => [...row]);
  const nonEmpty = rows.map((row, i) => [row, i] as const).filter(([row]) => row.length > 0);
  const [row] = nonEmpty[Math.floor(random() * nonEmpty.length)]!;
  const i = Math.floor(random() * row.length);
  const a = row[i]!;
  switch (Math.floor(random() * 6)) {
    case 0: // swap with the next action
      if (i + 1 < row.length) [row[i], row[i + 1]] = [row[i + 1]!, a];
      break;
    case 1: // drop it
      row.splice(i, 1);
      break;
    case 2: // run it twice
      row.splice(i, 0, a);
      break;
    case 3: // move it to the end of its row
      row.splice(i, 1);
      row.push(a);
      break;
    case 4: // read another weight version
      row[i] = { ...a, version: a.version < 0 ? 1 : a.version + 1 };
      break;
    default: // move it a few places earlier
      row.splice(i, 1);
      row.splice(Math.max(0, i - 1 - Math.floor(random() * 4)), 0, a);
      break;
  }
  return rows;
}

/** Runs one case: its digests, or the error it throws. */
function outcome(api: PipelineApi, build: () => Schedule, costs: Record<string, unknown>[], pictures = false): Record<string, string> {
  let schedule: Schedule;
  try {
    schedule = build();
  } catch (e) {
    return { error: `${(e as { code?: string }).code ?? 'untyped'}: ${(e as Error).message}` };
  }
  const out: Record<string, string> = { schedule: digest(scheduleText(api, schedule)) };
  try {
    out.analysis = digest(canonical(api.validateSchedule(schedule)));
  } catch (e) {
    out.error = `${(e as { code?: string }).code ?? 'untyped'}: ${(e as Error).message}`;
    return out;
  }
  costs.forEach((c, k) => {
    try {
      const r = api.simulateSchedule(schedule, c);
      out[`simulation${k}`] = digest(simulationText(r));
      if (pictures && k === 1) {
        out.ascii = digest(api.renderAscii(r));
        out.svg = digest(api.renderSvg(r));
      }
    } catch (e) {
      out[`simulation${k}`] = `${(e as { code?: string }).code ?? 'untyped'}: ${(e as Error).message}`;
    }
  });
  return out;
}

/** Every case's outcome, keyed by a readable case name. */
export function equivalenceDigests(api: PipelineApi): Record<string, Record<string, string>> {
  const out: Record<string, Record<string, string>> = {};
  for (const [name, options] of generatedCases()) {
    const id = `${name} ${canonical(options)}`;
    out[id] = outcome(api, () => api.generateSchedule(name, options), costModels, (options.stages as number) <= 4 && (options.microBatches as number) <= 8);
    const parts = (() => {
      try {
        return api.generateSchedule(name, options).parts;
      } catch {
        return 0;
      }
    })();
    if (parts > 0) out[`${id} per-part`] = outcome(api, () => api.generateSchedule(name, options), [perPartCosts(parts)]);
  }
  handWritten.forEach(([lines, shape], k) => {
    out[`hand-written ${k}`] = outcome(api, () => api.parseSchedule(lines, shape), costModels.slice(0, 3), true);
    out[`hand-written ${k} withCommunication`] = outcome(api, () => api.withCommunication(api.parseSchedule(lines, shape)), costModels.slice(0, 2));
  });
  const random = prng(20250101);
  const bases: [string, Record<string, unknown>][] = [
    ['gpipe', { stages: 3, microBatches: 4 }],
    ['1f1b', { stages: 4, microBatches: 6 }],
    ['interleaved-1f1b', { stages: 2, microBatches: 4, virtualStages: 2 }],
    ['pipedream', { stages: 3, microBatches: 5 }],
    ['pipedream-2bw', { stages: 3, microBatches: 2, iterations: 3 }],
    ['pipeoptim', { stages: 3, microBatches: 4 }],
    ['spectrain', { stages: 3, microBatches: 4 }],
    ['avgpipe', { stages: 3, microBatches: 4, pipelines: 2, advance: 2 }],
    ['wavelet', { stages: 2, microBatches: 3 }],
    ['wavelet', { stages: 3, microBatches: 5, form: 'model-parallel' }],
    ['pipelined-backprop', { stages: 3, microBatches: 4 }],
    ['sapipe', { stages: 3, microBatches: 3 }],
    ['zb-h1', { stages: 3, microBatches: 4 }],
  ];
  for (let k = 0; k < 400; k++) {
    const [name, options] = bases[k % bases.length]!;
    const base = api.generateSchedule(name, options);
    const rows = mutate(base, random);
    const init = { name: base.name, stages: base.stages, parts: base.parts, microBatches: base.microBatches, pipelines: base.pipelines, actions: rows };
    out[`broken ${k} ${name}`] = outcome(api, () => api.createSchedule(init), costModels.slice(2, 3));
    if (k % 4 === 0) {
      const computeOnly = rows.map((row) => row.filter((a) => !['sendActivation', 'recvActivation', 'sendGradient', 'recvGradient'].includes(a.kind)));
      out[`reordered ${k} ${name} withCommunication`] = outcome(api, () => api.withCommunication(api.createSchedule({ ...init, actions: computeOnly })), costModels.slice(1, 2));
    }
  }
  return out;
}
