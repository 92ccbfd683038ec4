/**
 * Faults and bad input of the pipeline runtime: a configuration that cannot run is a typed error
 * before any worker starts; a stage that throws or dies fails the whole job with an error naming
 * it, within the timeout; the trainer can be disposed and created again in the same process.
 */
import { fileURLToPath } from 'node:url';
import t from 'tap';

import {
  BusyError,
  DisposedError,
  InvalidArgumentError,
  InvalidScheduleError,
  PipelineTrainer,
  RankFailedError,
  SizeMismatchError,
  mlpLayers,
  type PipelineTrainerOptions,
} from '../../dist/index.js';
import { FEATURES, LAYERS, dataset } from './runtime-helpers.js';

const { inputs, labels } = dataset(96);
const faulty = fileURLToPath(new URL('../fixtures/pipeline/faulty-stage.mjs', import.meta.url));
const base = (): PipelineTrainerOptions => ({
  schedule: '1f1b',
  stages: 3,
  microBatches: 4,
  microBatchSize: 4,
  model: { layers: LAYERS, boundaries: 'params' },
  optimizer: { kind: 'sgd', lr: 0.05, momentum: 0.9 },
  data: { inputs, labels, features: FEATURES },
  timeoutMs: 5000,
});

t.test('configurations that cannot run are typed errors before any worker starts', async (t) => {
  const bad: [string, Partial<PipelineTrainerOptions> | ((o: PipelineTrainerOptions) => unknown), new (...a: never[]) => Error, RegExp][] = [
    ['more stages than layers', { stages: 12 }, InvalidArgumentError, /9 layers for 12 parts/],
    ['M < 1', { microBatches: 0 }, InvalidArgumentError, /microBatches/],
    ['an unknown schedule', { schedule: 'pipe-dreams' as never }, InvalidArgumentError, /did you mean|one of/],
    ['sapipe in a staleness-0 mode', { schedule: 'sapipe', dataParallel: { mode: 'sync' } }, InvalidArgumentError, /staleness 1/],
    ['interleaving that does not fit', { schedule: 'interleaved-1f1b', microBatches: 4 }, InvalidArgumentError, /multiple of stages/],
    ['boundaries of the wrong count', { model: { layers: LAYERS, boundaries: [3] } }, InvalidArgumentError, /2 layer indices/],
    ['boundaries out of order', { model: { layers: LAYERS, boundaries: [5, 3] } }, InvalidArgumentError, /greater than the previous/],
    ['layers that do not chain', { model: { layers: [{ kind: 'linear', in: 12, out: 8 }, { kind: 'linear', in: 9, out: 5 }, { kind: 'linear', in: 5, out: 5 }] } }, SizeMismatchError, /make them agree/],
    ['data of another width', { model: { layers: mlpLayers([10, 16, 16, 5]) } }, SizeMismatchError, /takes 10 features, the data has 12/],
    ['a label outside the classes', (o) => ({ ...o, data: { ...o.data, labels: Int32Array.from(labels, (l, i) => (i === 7 ? 9 : l)) } }), InvalidArgumentError, /labels\[7\]/],
    ['too little data for a round', { microBatches: 30 }, InvalidArgumentError, /one round needs/],
    ['an unknown option', { microbatches: 4 } as never, InvalidArgumentError, /microBatches/],
    ['prediction set by hand', { optimizer: { kind: 'sgd', lr: 0.1, prediction: { kind: 'linear', steps: 1 } } as never }, InvalidArgumentError, /set by the runtime/],
    ['PipeOptim without momentum', { schedule: 'pipeoptim', optimizer: { kind: 'sgd', lr: 0.1 } }, InvalidArgumentError, /momentum/],
    ['Pipelined Backpropagation with Adam', { schedule: 'pipelined-backprop', optimizer: { kind: 'adam', lr: 0.001 } }, InvalidArgumentError, /spike compensation/],
    ['Pipelined Backpropagation with a spike delay of its own', { schedule: 'pipelined-backprop', optimizer: { kind: 'sgd', lr: 0.1, momentum: 0.9, spikeCompensation: { delay: 2 } } }, InvalidArgumentError, /set by the runtime/],
    ['user stages whose widths do not chain', { model: { module: faulty, options: { fail: { part: 0, how: 'widths' } } } }, SizeMismatchError, /part 0 outputs 17 features but part 1 takes 16/],
    ['a module without createStage', { model: { module: fileURLToPath(new URL('./runtime-helpers.ts', import.meta.url)) } }, InvalidArgumentError, /createStage/],
  ];
  for (const [what, change, Type, message] of bad) {
    const options = typeof change === 'function' ? (change(base()) as PipelineTrainerOptions) : { ...base(), ...change };
    await t.rejects(PipelineTrainer.create(options), Type, what);
    await t.rejects(PipelineTrainer.create(options), { message }, `${what}: the message says what`);
  }
});

t.test('a stage that throws fails the job with its error, and the trainer can be created again', async (t) => {
  for (const how of ['throw', 'exit'] as const) {
    const trainer = await PipelineTrainer.create({ ...base(), model: { module: faulty, options: { fail: { part: 1, microBatch: 2, how } } } });
    const started = Date.now();
    const error = (await trainer.trainRound().catch((e: unknown) => e)) as RankFailedError;
    t.ok(error instanceof RankFailedError, `${how}: a RankFailedError`);
    t.equal(error.rank, 1, `${how}: it names stage 1`);
    if (how === 'throw') t.match(error.message, /stage model failure at micro-batch 2/, 'with the stage\'s own message');
    t.ok(Date.now() - started < 5000, `${how}: within the timeout (${Date.now() - started} ms)`);
    await t.rejects(trainer.trainRound(), RankFailedError, `${how}: the trainer stays failed`);
    await trainer.dispose();
    await t.rejects(trainer.trainRound(), DisposedError);
  }
  const again = await PipelineTrainer.create(base());
  const report = await again.trainRound();
  t.equal(report.losses.length, 4, 'a new trainer in the same process trains');
  t.ok(Number.isFinite(report.loss));
  await again.dispose();
});

t.test('one call at a time; dispose is idempotent', async (t) => {
  const trainer = await PipelineTrainer.create(base());
  const first = trainer.trainRound();
  await t.rejects(async () => trainer.trainRound(), BusyError);
  await first;
  t.equal(trainer.rounds, 1);
  t.throws(() => trainer.setLr(-1), InvalidArgumentError);
  await t.rejects(trainer.evaluate(new Float32Array(3), [0]), SizeMismatchError);
  await trainer.dispose();
  await trainer.dispose();
  t.ok(trainer.disposed);
});

t.test('an epoch is the data set in rounds; reports carry timelines and memory', async (t) => {
  const trainer = await PipelineTrainer.create({ ...base(), schedule: 'pipedream' });
  try {
    t.equal(trainer.roundsPerEpoch, 6);
    const rounds: number[] = [];
    const epoch = await trainer.trainEpoch((r) => rounds.push(r.round));
    t.same(rounds, [0, 1, 2, 3, 4, 5]);
    t.ok(Number.isFinite(epoch.loss));
    const report = await trainer.trainRound();
    t.equal(report.timeline.length, 3, 'a timeline per stage');
    for (const row of report.timeline) {
      for (let i = 1; i < row.length; i++) t.ok(row[i]!.start >= row[i - 1]!.start, 'actions in order');
      t.ok(row.every((x) => x.end >= x.start));
    }
    t.same(report.peakActivations, trainer.analysis.peakActivations, 'measured peak activations equal the analysis');
    t.same(report.peakStashed.map((n) => n + 1), trainer.analysis.weightVersions, 'stashed copies + the current weights equal the versions the analysis counts');
  } finally {
    await trainer.dispose();
  }
});

t.test('a schedule with all-reduces is refused by the stage interpreter', async (t) => {
  const { StageRunner, generateSchedule } = await import('../../dist/index.js');
  t.throws(() => new StageRunner(0, generateSchedule('sapipe', { stages: 2, microBatches: 2 }), undefined, []), InvalidScheduleError);
  // Nor AvgPipe's lists, whose elastic averaging needs the parts' replicas a bare runner is not given.
  t.throws(() => new StageRunner(0, generateSchedule('avgpipe', { stages: 1, microBatches: 2, pipelines: 2 }), undefined, []), InvalidScheduleError);
});
