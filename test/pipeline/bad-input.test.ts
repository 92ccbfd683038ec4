/**
 * Odd input to the schedule functions is a typed error naming the field, never a TypeError or
 * RangeError, a hang or an exhausted heap. Each case here was found by calling createSchedule,
 * validateSchedule, withCommunication, simulateSchedule and the renderers with non-objects, NaN,
 * Infinity, huge and negative numbers, wrong types in nested fields and arrays for objects; the
 * comment on each says what it did before.
 */
import t from 'tap';

import { InvalidArgumentError, SapipeError } from '../../lib/errors.js';
import {
  type Action,
  type SimulationResult,
  createSchedule,
  generateSchedule,
  gpipe,
  oneFOneB,
  renderAscii,
  renderHtml,
  renderSvg,
  sapipe,
  scheduleTitle,
  simulateSchedule,
  summarize,
  validateSchedule,
  withCommunication,
} from '../../lib/pipeline/index.js';

const typed = (code: string, message: RegExp) => ({ code, message });

t.test('createSchedule and validateSchedule: malformed actions and fields are named', async (t) => {
  const forward = { kind: 'forward', stage: 0, part: 0, microBatch: 0, pipeline: 0, version: -1, peer: -1 };
  const one = (a: unknown) => ({ stages: 1, microBatches: 1, actions: [[a as Action]] });
  // was: TypeError "Cannot convert object to primitive value" (the kind used as a property key)
  t.throws(() => createSchedule(one({ ...forward, kind: Object.create(null) })), typed('ERR_INVALID_SCHEDULE', /action #0 is not an action \(unknown kind/));
  t.throws(() => validateSchedule(one({ ...forward, kind: Object.create(null) }) as never), typed('ERR_INVALID_SCHEDULE', /unknown kind/));
  t.throws(() => createSchedule(one({ ...forward, kind: Symbol('forward') })), typed('ERR_INVALID_SCHEDULE', /unknown kind a Symbol/));
  // was: an error from inside formatAction ("formatAction: action.microBatch ...") describing the action
  t.throws(() => createSchedule(one({ ...forward, microBatch: 1e300 })), typed('ERR_INVALID_SCHEDULE', /stage 0, action #0 \(forward with .*\): microBatch must be -1 or in \[0, 0\]/));
  t.throws(() => createSchedule(one({ ...forward, part: '0' })), typed('ERR_INVALID_SCHEDULE', /part must be in \[0, 0\], got the string "0"/));
  t.throws(() => createSchedule(one({ ...forward, stage: Number.NaN })), typed('ERR_INVALID_SCHEDULE', /stage must be 0/));
  t.throws(() => createSchedule(one({ ...forward, version: -2 })), typed('ERR_INVALID_SCHEDULE', /version must be -1/));
  t.throws(() => createSchedule(one(null)), typed('ERR_INVALID_SCHEDULE', /action #0 is not an action \(null\)/));
  // fields of the schedule itself: InvalidArgumentError naming the field
  t.throws(() => createSchedule([] as never), typed('ERR_INVALID_ARGUMENT', /createSchedule expects an object/));
  t.throws(() => createSchedule({ ...one(forward), stages: Infinity }), typed('ERR_INVALID_ARGUMENT', /createSchedule: stages must be an integer/));
  t.throws(() => createSchedule({ ...one(forward), microBatches: 2 ** 53 }), typed('ERR_INVALID_ARGUMENT', /createSchedule: microBatches must be an integer in \[1, 1048576\]/));
  t.throws(() => createSchedule({ ...one(forward), parts: -1 }), typed('ERR_INVALID_ARGUMENT', /createSchedule: parts/));
  t.throws(() => createSchedule({ ...one(forward), pipelines: Number.NaN }), typed('ERR_INVALID_ARGUMENT', /createSchedule: pipelines/));
  // was: accepted, and a number as the name reached the pictures
  t.throws(() => createSchedule({ ...one(forward), name: 5 as never }), typed('ERR_INVALID_ARGUMENT', /createSchedule: name must be a string, got 5/));
  t.throws(() => createSchedule({ ...one(forward), params: [] as never }), typed('ERR_INVALID_ARGUMENT', /createSchedule: params must be an object/));
  t.throws(() => createSchedule({ ...one(forward), params: { S: Symbol('s') } as never }), typed('ERR_INVALID_ARGUMENT', /createSchedule: params.S must be a number or a string/));
  t.throws(() => createSchedule({ stages: 1, microBatches: 1, actions: [null as never] }), typed('ERR_INVALID_ARGUMENT', /createSchedule: actions\[0\] must be an array of actions, got null/));
  t.throws(() => createSchedule({ stages: 1, microBatches: 1, actions: {} as never }), typed('ERR_INVALID_ARGUMENT', /createSchedule: actions must be an array with one list per stage/));
});

t.test('withCommunication: a list that is not an array is named', async (t) => {
  const valid = oneFOneB({ stages: 2, microBatches: 2 });
  // was: TypeError "row.filter is not a function"
  t.throws(() => withCommunication({ ...valid, actions: [1, 2] as never }), typed('ERR_INVALID_ARGUMENT', /withCommunication: schedule.actions\[0\] must be an array/));
  t.throws(() => withCommunication({ ...valid, actions: [[null], []] as never }), typed('ERR_INVALID_SCHEDULE', /stage 0, action #0 is not an action/));
});

t.test('simulateSchedule: costs that are not an object, misspelled, or overflow', async (t) => {
  const s = gpipe({ stages: 2, microBatches: 2 });
  // was: an array was taken as no costs at all, and a misspelled cost silently left at its default
  t.throws(() => simulateSchedule(s, [] as never), typed('ERR_INVALID_ARGUMENT', /costs must be an object .*, got an array/));
  t.throws(() => simulateSchedule(s, { fowrard: 1 } as never), typed('ERR_INVALID_ARGUMENT', /unknown option 'fowrard'; did you mean 'forward'/));
  // was: a result with an infinite makespan and a NaN bubble fraction, which the pictures then drew forever
  t.throws(() => simulateSchedule(s, { forward: 1e308 }), typed('ERR_INVALID_ARGUMENT', /costs: the simulated times overflow/));
  t.throws(() => simulateSchedule(s, { activationBytes: 1e308, p2pBandwidth: 1e-300 }), typed('ERR_INVALID_ARGUMENT', /overflow/));
  t.throws(() => simulateSchedule(s, { p2pLatency: '1' as never }), typed('ERR_INVALID_ARGUMENT', /costs.p2pLatency must be a finite number >= 0, got the string "1"/));
});

t.test('renderAscii scales a timeline whose costs differ by many orders of magnitude', async (t) => {
  // was: RangeError "Invalid array length" (the shortest action gets 3 columns: 1e15 / 2 * 3 of
  // them), or an exhausted heap when the width was merely huge
  for (const costs of [{ forward: 1e15 }, { forward: 1e9 }, { optimizerStep: 1e-12 }, { forward: 5e-324, backward: 1 }]) {
    const result = simulateSchedule(sapipe({ stages: 2, microBatches: 2 }), { ...costs, allReduce: 1 });
    const text = renderAscii(result);
    const lines = text.split('\n');
    t.match(lines[1], /^\(scaled to \d+ columns/, `${JSON.stringify(costs)}: says it is scaled`);
    t.ok(text.length < 10_000, `${JSON.stringify(costs)}: ${text.length} characters`);
    t.match(lines[2], /^worker  0 \|[FB]0/, 'still draws the actions');
  }
  // costs so large that the short actions round away draw as they are
  t.match(renderAscii(simulateSchedule(sapipe({ stages: 2, microBatches: 2 }), { forward: 1e300 })), /worker  0 \|F0 F1 \|/);
  // an ordinary one is not scaled
  t.notMatch(renderAscii(simulateSchedule(gpipe({ stages: 2, microBatches: 2 }))), /scaled/);
});

t.test('renderSvg fits a huge makespan and refuses a scale that cannot be drawn', async (t) => {
  const huge = simulateSchedule(gpipe({ stages: 2, microBatches: 3 }), { forward: 1e300, backward: 2e300 });
  // was: a tick loop that never ended (2 px per time unit, a tick every 20 units)
  const svg = renderSvg(huge);
  const width = Number(/^<svg [^>]*width="(\d+)"/.exec(svg)?.[1]);
  t.ok(width > 0 && width <= 1300, `fitted to about 1100 px: ${width} px`);
  t.ok(svg.split('\n').length < 200, 'a handful of ticks, not 1e300 of them');
  t.ok(renderHtml(huge).includes('<svg'), 'renderHtml too');
  const normal = simulateSchedule(gpipe({ stages: 2, microBatches: 3 }));
  t.throws(() => renderSvg(normal, { scale: 1e9 }), typed('ERR_INVALID_ARGUMENT', /options.scale 1000000000 makes the chart .* pass a scale of at most/));
  t.throws(() => renderSvg(normal, { scale: Number.NaN }), typed('ERR_INVALID_ARGUMENT', /options.scale must be a number > 0, got NaN/));
});

t.test('the pictures name the field of a malformed result instead of failing inside the drawing', async (t) => {
  const result = simulateSchedule(oneFOneB({ stages: 2, microBatches: 2 }));
  const first = result.timeline[0]!;
  const cases: [string, Partial<Record<keyof SimulationResult, unknown>>, RegExp][] = [
    // was: an exhausted heap (a row of Infinity or 1e9 cells), a loop from -Infinity that never ended
    ['makespan Infinity', { makespan: Infinity }, /result.makespan must be a finite number >= 0, got Infinity/],
    ['makespan 1e9 with a unit action', { makespan: -1 }, /result.makespan must be a finite number >= 0, got -1/],
    ['a start of -Infinity', { timeline: [first.map((x) => ({ ...x, start: -Infinity })), result.timeline[1]] }, /result.timeline\[0\]\[0\].start must be a finite number/],
    ['a stage count of 1e300', { schedule: { ...result.schedule, stages: 1e300 } }, /result.schedule.stages must be an integer in \[1, 4096\]/],
    // was: TypeErrors ("x.toFixed is not a function", "... reading 'some'", "row is not iterable", ...)
    ['bubbleFraction missing', { bubbleFraction: undefined }, /result.bubbleFraction must be a number, got undefined/],
    ['throughput a string', { throughput: 'x' }, /result.throughput must be a number/],
    ['peakMemoryBytes null', { peakMemoryBytes: null }, /result.peakMemoryBytes must be an array, got null/],
    ['schedule.actions a number', { schedule: { ...result.schedule, actions: 4 } }, /result.schedule.actions must hold one list per stage/],
    ['schedule.params null', { schedule: { ...result.schedule, params: null } }, /result.schedule.params must be an object, got null/],
    ['a timeline row that is a number', { timeline: [4, result.timeline[1]] }, /result.timeline\[0\] must be an array, got 4/],
    ['a timed action that is null', { timeline: [[null], result.timeline[1]] }, /result.timeline\[0\]\[0\] must be \{ action, start, end, index \}, got null/],
    ['a timed action without an action', { timeline: [first.map((x) => ({ ...x, action: null })), result.timeline[1]] }, /result.timeline\[0\]\[0\].action must be an action, got null/],
    ['a micro-batch that is a Symbol', { timeline: [first.map((x) => ({ ...x, action: { ...x.action, microBatch: Symbol('m') } })), result.timeline[1]] }, /\.action.microBatch must be an integer >= -1, got a Symbol/],
    ['analysis without its arrays', { analysis: {} }, /result.analysis.forwardsBeforeFirstBackward must be an array/],
  ];
  for (const [name, change, message] of cases) {
    const bad = { ...result, ...change } as SimulationResult;
    for (const [fn, draw] of [['renderAscii', renderAscii], ['renderSvg', renderSvg], ['renderHtml', renderHtml], ['summarize', summarize], ['scheduleTitle', scheduleTitle]] as const) {
      t.throws(() => draw(bad), typed('ERR_INVALID_ARGUMENT', message), `${fn}: ${name}`);
    }
  }
  // was: TypeError "text.replace is not a function" (the SVG title is escaped as text)
  for (const draw of [renderAscii, renderSvg, renderHtml]) t.throws(() => draw(result, { title: 5 as never }), typed('ERR_INVALID_ARGUMENT', /options.title must be a string, got 5/));
});

t.test('sizes past what generates and simulates in seconds are refused up front, naming what to lower', async (t) => {
  const cases: [string, Record<string, unknown>, RegExp][] = [
    ['avgpipe', { stages: 256, microBatches: 4096 }, /avgpipe: stages x microBatches x pipelines = 256 x 4096 x 2 = 2097152 exceeds 524288 \(2\^19\), the most a schedule built by list scheduling .* lower microBatches to 1024 or fewer, or lower stages or pipelines/],
    ['zb-h1', { stages: 256, microBatches: 4096 }, /zb-h1: stages x microBatches = 256 x 4096 = 1048576 exceeds 524288 \(2\^19\).* lower microBatches to 2048 or fewer, or lower stages$/],
    ['interleaved-1f1b', { stages: 256, microBatches: 4096, virtualStages: 64 }, /interleaved-1f1b: .* x virtualStages = .* exceeds 1048576 \(2\^20\), the most one schedule holds .* lower microBatches to 64 or fewer/],
    ['pipedream-2bw', { stages: 256, microBatches: 4096 }, /pipedream-2bw: .* x iterations = 256 x 4096 x 3 = 3145728 .* lower microBatches to 1365 or fewer/],
    ['wavelet', { stages: 256, microBatches: 4096 }, /wavelet \(data-parallel\): stages x microBatches x replicas .* lower microBatches to 2048 or fewer, or lower stages$/],
    ['avgpipe', { stages: 256, microBatches: 4096, pipelines: 64 }, /lower microBatches to 32 or fewer/],
    ['gpipe', { stages: 257, microBatches: 4096 }, /stages must be an integer in \[1, 256\]/],
  ];
  for (const [name, options, message] of cases) {
    t.throws(() => generateSchedule(name as never, options as never), typed('ERR_INVALID_ARGUMENT', message), `${name} ${JSON.stringify(options)}`);
  }
  const error = (() => {
    try {
      generateSchedule('avgpipe', { stages: 256, microBatches: 4096 });
    } catch (e) {
      return e;
    }
    return undefined;
  })();
  t.ok(error instanceof InvalidArgumentError && error instanceof SapipeError, 'an InvalidArgumentError');
});
