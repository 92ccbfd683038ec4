/**
 * The schedule registry (lib/pipeline/schedules/registry.ts) covers every schedule, and what each
 * entry says is what the generator and the runtime do: the options it reads and the ones it
 * ignores, the costs its simulation reads, what its rows are, which weights its passes read, and,
 * for the runtime, the default pipelines, the options only it takes, how its pipelines couple, the
 * prediction and spike compensation its optimizers get and the optimizers it refuses. Driven by
 * the entries, so a new schedule is checked by adding it.
 */
import t from 'tap';

import {
  DATA_PARALLEL_SCHEDULES,
  InvalidArgumentError,
  OPTIMIZERS,
  RUNTIME_SCHEDULES,
  SCHEDULES,
  SGD,
  ParamSet,
  formatSchedule,
  generateSchedule,
  scheduleEntry,
  scheduleNames,
  validateSchedule,
  type PipelineOptimizerSpec,
  type RuntimeSchedule,
  type ScheduleDescriptor,
  type ScheduleName,
  type ScheduleOptionName,
  type ScheduleOptions,
} from '../../dist/index.js';
import { pipelineDefaults } from '../../dist/apps/demo/pipeline-run.js';
import { pipelinedBackpropScaling } from '../../dist/optim/options.js';
import { rowName } from '../../dist/pipeline/render.js';
import { planPipeline, TRAINER_OPTION_KEYS, type PipelineTrainerOptions } from '../../dist/pipeline/runtime/plan.js';
import { backwardPredictionRatio, predictionFor, runtimeSchedule, spikeDelayFor } from '../../dist/pipeline/runtime/weights.js';
import { FEATURES, LAYERS, SEED, dataset, evenBoundaries } from './runtime-helpers.js';

const entries = Object.entries(SCHEDULES) as [ScheduleName, ScheduleDescriptor][];
const S = 2;
const M = 4;
const base: ScheduleOptions = { stages: S, microBatches: M };
const runtimeOf = (name: ScheduleName): RuntimeSchedule | undefined => {
  const runtime = SCHEDULES[name].runtime;
  return 'planned' in runtime ? undefined : runtime;
};

t.test('the registry is the one list of schedules, and each entry builds its own', async (t) => {
  t.same(scheduleNames, Object.keys(SCHEDULES), 'scheduleNames are the registry keys, in order');
  t.ok(scheduleNames.length >= 12, `${scheduleNames.length} schedules`);
  for (const [name, entry] of entries) {
    const schedule = entry.generate(base);
    t.equal(schedule.name, name, `${name}: its generator names the schedule as the registry does`);
    t.equal(formatSchedule(generateSchedule(name, base)), formatSchedule(schedule), `${name}: generateSchedule runs the entry's generator`);
    t.equal(scheduleEntry(name), entry);
    t.ok(entry.title.length > 0 && entry.summary.length > 0, `${name}: title and summary`);
  }
  for (const other of ['custom', 'toString', '__proto__', 42, null]) t.equal(scheduleEntry(other), undefined, `no entry for ${String(other)}`);
  t.throws(() => generateSchedule('nope' as ScheduleName, base), InvalidArgumentError);
});

t.test('each entry lists exactly the generator options its generator reads', async (t) => {
  // A value of each option that differs from the generator's default (AvgPipe: N = 2, A = S-1;
  // interleaved: V = 2; 2BW: 3 iterations; Wavelet: data-parallel).
  const different: Record<ScheduleOptionName, ScheduleOptions[ScheduleOptionName]> = { pipelines: 3, advance: 0, virtualStages: 4, iterations: 2, form: 'model-parallel' };
  for (const [name, entry] of entries) {
    const plain = formatSchedule(entry.generate(base));
    for (const [option, value] of Object.entries(different) as [ScheduleOptionName, never][]) {
      const changed = formatSchedule(entry.generate({ ...base, [option]: value }));
      if (entry.options.includes(option)) t.not(changed, plain, `${name} reads ${option}`);
      else t.equal(changed, plain, `${name} ignores ${option}`);
    }
  }
});

t.test("each entry's costs, rows and weights are what its schedule shows", async (t) => {
  for (const [name, entry] of entries) {
    const forms = entry.options.includes('form') ? [base, { ...base, form: 'model-parallel' as const }] : [base];
    for (const options of forms) {
      const schedule = entry.generate(options);
      const what = `${name} ${JSON.stringify(schedule.params)}`;
      const kinds = new Set(schedule.actions.flat().map((a) => a.kind));
      t.equal(entry.costs.includes('weightGrad'), kinds.has('weightGrad'), `${what}: reads weightGrad iff it splits backwards`);
      t.equal(entry.costs.includes('allReduce'), kinds.has('allReduce'), `${what}: reads allReduce iff it all-reduces`);
      const row = entry.rowName(schedule.params);
      t.equal(rowName(schedule), row, `${what}: rowName reads the entry`);
      t.equal(row === 'worker', schedule.parts === 1, `${what}: a row is a worker iff it holds the whole model as one part`);
      const analysis = validateSchedule(schedule);
      const versions = analysis.weightVersions;
      switch (entry.weights) {
        case 'current':
          t.ok(versions.every((v) => v === 1) && analysis.maxStaleness.every((s) => s === 0), `${what}: one version, no staleness`);
          t.notOk(kinds.has('stashWeights') || kinds.has('predictWeights'), `${what}: no stash, no prediction`);
          break;
        case 'stashed':
          t.ok(kinds.has('stashWeights') && kinds.has('restoreWeights') && versions.some((v) => v > 1), `${what}: stashes versions`);
          break;
        case 'double-buffered':
          t.ok(versions.every((v) => v === 2) && !kinds.has('predictWeights') && !kinds.has('stashWeights'), `${what}: two versions, read one update old`);
          break;
        case 'predicted':
          t.ok(kinds.has('predictWeights'), `${what}: passes read predicted weights`);
          break;
      }
    }
  }
});

const samples = dataset(64);
const trainerOptions = (schedule: ScheduleName, extra: Partial<PipelineTrainerOptions> = {}): PipelineTrainerOptions =>
  ({
    schedule,
    stages: S,
    microBatches: M,
    microBatchSize: 2,
    model: { layers: LAYERS, seed: SEED, boundaries: evenBoundaries(LAYERS.length, generateSchedule(schedule, { ...base, ...runtimeOf(schedule)?.generatorOptions, ...(extra.form ? { form: extra.form } : {}) }).parts) },
    optimizer: { kind: 'sgd', lr: 0.05, momentum: 0.9 },
    data: { inputs: samples.inputs, labels: samples.labels, features: FEATURES },
    shuffle: false,
    ...extra,
  }) as PipelineTrainerOptions;
const plan = (schedule: ScheduleName, extra: Partial<PipelineTrainerOptions> = {}) => planPipeline(trainerOptions(schedule, extra), 'test', TRAINER_OPTION_KEYS);

t.test('the runtime runs the schedules whose entry has a runtime, as the entry says', async (t) => {
  t.same(RUNTIME_SCHEDULES, scheduleNames.filter((n) => runtimeOf(n) !== undefined), 'RUNTIME_SCHEDULES');
  t.same(DATA_PARALLEL_SCHEDULES, scheduleNames.filter((n) => runtimeOf(n)?.coupling === 'data-parallel'), 'DATA_PARALLEL_SCHEDULES');
  for (const [name, entry] of entries) {
    const runtime = runtimeOf(name);
    if (runtime === undefined) {
      await t.rejects(plan(name), { message: new RegExp(`does not run '${name}' yet \\(${(entry.runtime as { planned: string }).planned.replace(/[.*+?^${}()|[\]\\']/g, '\\$&')}\\)`) }, `${name}: refused, saying why`);
      continue;
    }
    const p = await plan(name);
    if (runtime.coupling === 'workers') {
      t.equal(p.pipelines, S, `${name}: a data-parallel worker per row`);
      t.equal(p.schedule.pipelines, S, `${name}: each row its worker's pipeline`);
      t.ok(p.rowsAreWorkers && p.schedule.parts === 1, `${name}: every worker holds the whole model`);
      t.equal(p.dataParallel?.mode, 'sapipe-wp', `${name}: its workers in mode sapipe-wp by default`);
      t.ok(validateSchedule(p.schedule).maxStaleness.every((s) => s === 1), `${name}: staleness 1`);
      await t.rejects(plan(name, { dataParallel: { mode: 'sync' } }), InvalidArgumentError, `${name}: no staleness-0 mode`);
      await t.rejects(plan(name, { pipelines: S + 1 }), InvalidArgumentError, `${name}: its workers are its rows`);
      continue;
    }
    t.ok(!p.rowsAreWorkers, `${name}: rows are stages`);
    t.equal(p.pipelines, runtime.defaultPipelines, `${name}: ${runtime.defaultPipelines} pipeline(s) by default`);
    t.equal(p.schedule.pipelines, runtime.coupling === 'elastic-averaging' ? runtime.defaultPipelines : 1, `${name}: pipelines in its action lists only when averaged`);
    const analysis = validateSchedule(p.schedule);
    if (runtime.coupling === 'data-parallel') t.ok(analysis.maxStaleness.every((s) => s === 0), `${name}: coupled by data parallelism, so synchronous`);
    if (runtime.coupling === 'elastic-averaging') t.ok(p.schedule.actions.flat().some((a) => a.kind === 'elasticAverage'), `${name}: averages`);
    for (const [key, value] of Object.entries(runtime.generatorOptions ?? {})) t.equal(p.schedule.params[key], value, `${name}: runs with ${key} ${String(value)}`);
    t.equal(p.averaging !== undefined, runtime.coupling === 'elastic-averaging', `${name}: averaging options iff averaged`);
    t.equal(p.descriptions[0]!.pipelinedBackprop !== undefined, runtime.trainerOptions.includes('pipelinedBackprop'), `${name}: pipelinedBackprop switches iff it owns them`);
    if (runtime.coupling !== 'data-parallel')
      await t.rejects(plan(name, { pipelines: 2, dataParallel: { mode: 'sync' } }), InvalidArgumentError, `${name}: no data-parallel pipelines`);
    else t.equal((await plan(name, { pipelines: 2 })).dataParallel?.mode, 'sync', `${name}: data-parallel pipelines`);
  }
});

t.test("Wavelet's data-parallel form: its rows are workers, two waves each, no DataParallelTrainer", async (t) => {
  const p = await plan('wavelet', { form: 'data-parallel' });
  t.ok(p.rowsAreWorkers && p.schedule.parts === 1, 'a worker per row, the whole model on each');
  t.equal(p.schedule.pipelines, 2 * p.schedule.stages, 'a tick and a tock pipeline per worker');
  t.equal(p.schedule.params.form, 'data-parallel');
  t.equal(p.dataParallel, undefined, 'its waves all-reduce themselves');
  t.ok(p.descriptions.every((d) => d.waves === true && d.parts.length === 1), 'every worker holds the two replicas of part 0');
});

t.test('a trainer option of one schedule is refused by the others, naming its schedule', async (t) => {
  const given: Record<string, Partial<PipelineTrainerOptions>> = { advance: { advance: 0 }, averaging: { averaging: { every: 2 } }, pipelinedBackprop: { pipelinedBackprop: { weightPrediction: false } }, form: { form: 'data-parallel' } };
  const owners = new Map(RUNTIME_SCHEDULES.flatMap((n) => runtimeOf(n)!.trainerOptions.map((k) => [k, n] as const)));
  t.same([...owners.keys()].sort(), Object.keys(given).sort(), 'every schedule-owned trainer option is tried');
  for (const name of RUNTIME_SCHEDULES) {
    for (const [key, extra] of Object.entries(given)) {
      if (runtimeOf(name)!.trainerOptions.includes(key as never)) t.ok(await plan(name, extra), `${name} takes ${key}`);
      else await t.rejects(plan(name, extra), { message: new RegExp(`${key} is an option of the ${owners.get(key as never)} schedule, not of '${name}'`) }, `${name} refuses ${key}`);
    }
  }
});

t.test("the optimizers each runtime schedule refuses are those lacking a property it needs", async (t) => {
  const specs: PipelineOptimizerSpec[] = [
    { kind: 'sgd', lr: 0.05 },
    { kind: 'sgd', lr: 0.05, momentum: 0.9 },
    { kind: 'sgd', lr: 0.05, momentum: 0.9, nesterov: true },
    { kind: 'sgd', lr: 0.05, momentum: 0.9, dampening: 0.5 },
    { kind: 'adam', lr: 0.001 },
    { kind: 'adamw', lr: 0.001 },
    { kind: 'adamw', lr: 0.001, weightDecay: 0 },
  ];
  for (const name of RUNTIME_SCHEDULES) {
    const runtime = runtimeOf(name)!;
    for (const optimizer of specs) {
      const entry = OPTIMIZERS[optimizer.kind];
      const lacking = runtime.optimizerNeeds.find((need) => !(entry[need.property] as (o: object) => boolean)(optimizer));
      const what = `${name} with ${JSON.stringify(optimizer)}`;
      if (lacking === undefined) t.ok(await plan(name, { optimizer }), `${what}: accepted`);
      else await t.rejects(plan(name, { optimizer }), { message: `test: ${lacking.refusal(entry.className)}` }, `${what}: refused (${lacking.property})`);
    }
    if (runtime.spikeDelay !== undefined)
      await t.rejects(plan(name, { optimizer: { kind: 'sgd', lr: 0.05, momentum: 0.9, spikeCompensation: { delay: 1 } } }), /spikeCompensation is set by the runtime/, `${name}: sets spike compensation itself`);
  }
});

t.test("each runtime schedule's prediction and spike compensation match its staleness", async (t) => {
  const stages = 4;
  const params = new ParamSet({ w: [3] });
  t.teardown(() => params.dispose());
  for (const name of RUNTIME_SCHEDULES) {
    const runtime = runtimeOf(name)!;
    // A schedule of data-parallel workers reads the prediction of its data-parallel mode (sapipe-wp).
    if (runtime.coupling === 'workers') t.equal(runtime.prediction, undefined, `${name}: the prediction is its data-parallel mode's`);
    else t.equal(runtime.prediction !== undefined, SCHEDULES[name].weights === 'predicted', `${name}: a prediction iff its passes read predicted weights`);
    const staleness = validateSchedule(generateSchedule(name, { stages, microBatches: 8 })).maxStaleness;
    for (let k = 0; k < stages; k++) {
      t.same(predictionFor(name, k, stages), runtime.prediction?.(k, stages), `${name}: the stages read the entry's prediction`);
      t.equal(spikeDelayFor(name, k, stages), runtime.spikeDelay?.(k, stages), `${name}: and its spike delay`);
      t.equal(backwardPredictionRatio(name, k, stages), runtime.backwardPredictionRatio?.(k, stages) ?? 0, `${name}: and its backward ratio`);
      const prediction = runtime.prediction?.(k, stages);
      if (prediction === undefined) continue;
      const optimizer = new SGD(params, { lr: 0.1, momentum: 0.9, prediction });
      const steps = optimizer.prediction?.kind === 'linear' ? optimizer.prediction.steps : NaN;
      optimizer.dispose();
      // SpecTrain's forward looks floor(k/2) further than the staleness, and its backward that far.
      const further = runtime.backwardPredictionRatio === undefined ? 0 : Math.floor(k / 2);
      t.equal(steps, staleness[k]! + further, `${name} stage ${k}: predicts ${steps} updates ahead, the staleness ${staleness[k]} + ${further}`);
      if (further > 0) t.equal(runtime.backwardPredictionRatio!(k, stages) * steps, further, `${name} stage ${k}: the backward predicts ${further} ahead`);
      if (runtime.spikeDelay !== undefined) t.equal(runtime.spikeDelay(k, stages), staleness[k], `${name} stage ${k}: spike compensation for the staleness`);
    }
  }
  for (const name of scheduleNames) if ('planned' in SCHEDULES[name].runtime) t.equal(runtimeSchedule(name), undefined, `${name}: no runtime policy for a planned schedule`);
  t.equal(predictionFor('custom', 0, 2), undefined, 'nor for a custom schedule');
});

t.test("each runtime schedule's default SGD rate is the demo's (until the demo reads the registry)", async (t) => {
  for (const name of RUNTIME_SCHEDULES) {
    const d = runtimeOf(name)!.defaultSgd;
    const demo = pipelineDefaults(name, 'sgd', 16);
    if ('smallBatchRule' in d) t.equal(demo.lr, pipelinedBackpropScaling(d.smallBatchRule, 16).lr, `${name}: the small-batch rule`);
    else t.equal(demo.lr, d.lr, `${name}: lr ${d.lr}`);
  }
});
