// How long the schedule generators, the validator and the simulator take at the largest sizes
// the generators accept (lib/pipeline/schedules/options.ts, `limits`). Each (schedule, run) is a
// fresh child process, so one measurement's garbage does not land in the next; each phase is
// timed on its own: generateSchedule, validateSchedule of that schedule, simulateSchedule of it
// (which validates again, as a caller's call does), and the first read of the result's timeline
// (its per-action objects are made then). bench/RESULTS.md, "Schedules at their largest sizes",
// quotes it.
//   node scripts/experiments/schedule-scale.mjs [--schedules gpipe,1f1b] [--runs 3]
//     [--stages 256] [--microbatches 4096] [--dist dist] [--timeout 600]
// --dist takes another build of lib/ (an older commit's `tsc --outDir`) to compare against.
import { spawnSync } from 'node:child_process';
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';

const { values: a } = parseArgs({
  options: {
    schedules: { type: 'string' },
    runs: { type: 'string', default: '3' },
    stages: { type: 'string' },
    microbatches: { type: 'string' },
    dist: { type: 'string', default: new URL('../../dist', import.meta.url).pathname },
    timeout: { type: 'string', default: '600' },
    child: { type: 'string' },
  },
});
const pipeline = await import(pathToFileURL(resolve(a.dist, 'pipeline/index.js')).href);
const { limits } = await import(pathToFileURL(resolve(a.dist, 'pipeline/schedules/options.js')).href);

/**
 * The largest options each schedule accepts (its documented maximum: S and M at their limits, the
 * other options at their defaults, M lowered where `limits.units`, or `limits.listScheduledUnits`
 * for ZB-H1 and AvgPipe, caps S x M x the default's factor), or the sizes asked for.
 */
function optionsFor(name) {
  const stages = Number(a.stages ?? limits.stages);
  let microBatches = Number(a.microbatches ?? limits.microBatches);
  const options = { stages, microBatches };
  if (name === 'wavelet-model-parallel') options.form = 'model-parallel';
  if (limits.units !== undefined && a.microbatches === undefined) {
    // the defaults V = 2, iterations = 3, N = 2 and Wavelet's two replicas count against the cap
    const factor = { 'interleaved-1f1b': 2, 'pipedream-2bw': 3, avgpipe: 2, wavelet: 2 }[name] ?? 1;
    const units = name === 'avgpipe' || name === 'zb-h1' ? limits.listScheduledUnits : limits.units;
    microBatches = Math.min(microBatches, Math.floor(units / (stages * factor)));
    if (name === 'interleaved-1f1b') microBatches -= microBatches % stages;
    options.microBatches = microBatches;
  }
  return options;
}

if (a.child !== undefined) {
  const name = a.child;
  const options = optionsFor(name);
  const generatorName = name === 'wavelet-model-parallel' ? 'wavelet' : name;
  const time = (fn) => {
    const start = performance.now();
    const value = fn();
    return [value, (performance.now() - start) / 1000];
  };
  const [schedule, generate] = time(() => pipeline.generateSchedule(generatorName, options));
  const actions = schedule.actions.reduce((n, row) => n + row.length, 0);
  const [, validate] = time(() => pipeline.validateSchedule(schedule));
  const [result, simulate] = time(() => pipeline.simulateSchedule(schedule, { p2pLatency: 0.5, allReduce: 1 }));
  // the per-action objects of result.timeline, made on first read (no cost before the rewrite)
  const [, timeline] = time(() => result.timeline.length);
  process.stdout.write(`${JSON.stringify({ options, actions, generate, validate, simulate, timeline, makespan: result.makespan })}\n`);
  process.exit(0);
}

const names = a.schedules?.split(',') ?? [...pipeline.scheduleNames.filter((n) => n !== 'wavelet'), 'wavelet', 'wavelet-model-parallel'];
const runs = Number(a.runs);
const spread = (xs) => (xs.length === 0 ? '-' : `${Math.min(...xs).toFixed(2)}-${Math.max(...xs).toFixed(2)}`);
console.log(`dist: ${a.dist}; ${runs} runs per schedule, seconds (min-max)`);
console.log(['schedule', 'options', 'actions', 'generate', 'validate', 'simulate', 'timeline'].join(' | '));
for (const name of names) {
  const got = [];
  let failure;
  for (let r = 0; r < runs && failure === undefined; r++) {
    const args = [new URL(import.meta.url).pathname, '--child', name, '--dist', a.dist];
    if (a.stages) args.push('--stages', a.stages);
    if (a.microbatches) args.push('--microbatches', a.microbatches);
    const child = spawnSync(process.execPath, args, { encoding: 'utf8', timeout: Number(a.timeout) * 1000 });
    if (child.status !== 0) {
      if (child.error?.code === 'ETIMEDOUT') failure = `over ${a.timeout} s`;
      else if (/heap out of memory/.test(child.stderr)) failure = 'out of memory (the default heap)';
      else failure = child.stderr.trim().split('\n').at(-1) ?? `exit ${child.status}`;
    }
    else got.push(JSON.parse(child.stdout));
  }
  const first = got[0];
  console.log(
    [
      name,
      first ? JSON.stringify(first.options) : '',
      first ? first.actions : '',
      spread(got.map((g) => g.generate)),
      spread(got.map((g) => g.validate)),
      spread(got.map((g) => g.simulate)),
      spread(got.map((g) => g.timeline)),
      failure ? `failed: ${failure}` : '',
    ].join(' | '),
  );
}
