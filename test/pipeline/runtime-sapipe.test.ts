/**
 * SAPipe as a runtime schedule: its rows are data-parallel workers, each holding the whole model,
 * whose all-reduce of iteration t overlaps the compute of iteration t+1 and whose update is the
 * DataParallelTrainer's staleness-1 step (sapipe-wp: weight prediction; sapipe-dc: delay
 * compensation). PipelineTrainer running the sapipe schedule ends with the weights of
 * DataParallelTrainers in the same mode on the same shards (runtime-sapipe-helpers.ts; tolerance
 * 1e-6 absolute, measured 0): here SGD-momentum on 2 workers and Adam on 3 in sapipe-wp;
 * runtime-sapipe-modes.test.ts (a slow test) runs sapipe-dc, pipe-sgd and the other combinations.
 * Its measured timeline has the simulated one's rows and actions, and bad options are typed errors.
 */
import t from 'tap';

import { InvalidArgumentError, PipelineTrainer, simulateSchedule, type PipelineDataParallelOptions, type PipelineOptimizerSpec } from '../../dist/index.js';
import { FEATURES, LAYERS, SEED } from './runtime-helpers.js';
import { B, caseName, checkCase, inputs, labels, type SapipeCase } from './runtime-sapipe-helpers.js';

const cases: SapipeCase[] = [
  { workers: 2, optimizer: { kind: 'sgd', lr: 0.1, momentum: 0.9 }, dataParallel: { mode: 'sapipe-wp' } },
  { workers: 3, optimizer: { kind: 'adam', lr: 0.01 }, dataParallel: { mode: 'sapipe-wp', estimate: 'local', compensation: {} } },
];
for (const c of cases) t.test(caseName(c), (t) => checkCase(t, c));

t.test('the measured timeline compares with the simulated one', async (t) => {
  const trainer = await PipelineTrainer.create({
    schedule: 'sapipe',
    stages: 2,
    microBatches: 4,
    microBatchSize: B,
    model: { layers: LAYERS, seed: SEED, boundaries: [] },
    optimizer: { kind: 'sgd', lr: 0.1, momentum: 0.9 },
    data: { inputs, labels, features: FEATURES },
  });
  try {
    const report = await trainer.trainRound();
    const simulated = simulateSchedule(trainer.schedule, { forward: 1, backward: 2, allReduce: 1 });
    t.same(
      report.timeline.map((row) => row.map((a) => a.action.kind)),
      simulated.timeline.map((row) => row.map((a) => a.action.kind)),
      'the same actions per row, in the same order',
    );
    t.ok(report.timeline.every((row) => row.every((a) => a.end >= a.start && a.start >= 0)), 'times are ordered');
    t.ok(report.modelBytes.every((b) => b > 0));
    const state = await trainer.exportState();
    t.same([state.coupling, state.pipelines, state.parts.map((p) => p.dataParallel?.mode)], ['workers', trainer.schedule.stages, state.parts.map(() => 'sapipe-wp')], "checkpoints: every worker's replica with its data-parallel state (test/checkpoint/pipeline-parallel.test.ts resumes them)");
    t.ok(report.versions.every((row) => row.filter((v) => v.kind === 'forward').slice(2).every((v) => v.predicted)), 'sapipe-wp: forwards read predicted weights once an update is in flight');
  } finally {
    await trainer.dispose();
  }
});

t.test('bad options are typed errors', async (t) => {
  const base = {
    schedule: 'sapipe' as const,
    stages: 2,
    microBatches: 2,
    microBatchSize: B,
    model: { layers: LAYERS, seed: SEED },
    optimizer: { kind: 'sgd', lr: 0.1, momentum: 0.9 } as PipelineOptimizerSpec,
    data: { inputs, labels, features: FEATURES },
  };
  await t.rejects(PipelineTrainer.create({ ...base, dataParallel: { mode: 'sync' } }), InvalidArgumentError, 'mode sync (staleness 0)');
  await t.rejects(PipelineTrainer.create({ ...base, dataParallel: { mode: 'nope' as 'sync' } }), InvalidArgumentError, 'an unknown mode');
  await t.rejects(PipelineTrainer.create({ ...base, dataParallel: { mode: 'sapipe-dc', estimate: 'local' } }), InvalidArgumentError, 'an estimate outside sapipe-wp');
  await t.rejects(PipelineTrainer.create({ ...base, dataParallel: { mode: 'sapipe-wp', bucket: 1 } as PipelineDataParallelOptions }), InvalidArgumentError, 'an unknown key');
  await t.rejects(PipelineTrainer.create({ ...base, pipelines: 3 }), InvalidArgumentError, 'pipelines other than the workers');
  await t.rejects(PipelineTrainer.create({ ...base, dataParallel: { mode: 'sapipe-wp', estimate: 'local', overlapUpdate: true } }), InvalidArgumentError, 'an overlapped update that cannot apply');
  await t.rejects(PipelineTrainer.create({ ...base, advance: 1 }), InvalidArgumentError, "AvgPipe's option");
  await t.rejects(PipelineTrainer.create({ ...base, optimizer: { kind: 'sgd', lr: 0.1, momentum: 0.9, compensation: {} } as PipelineOptimizerSpec }), InvalidArgumentError, 'optimizer.compensation');
  await t.rejects(PipelineTrainer.create({ ...base, microBatches: 1000 }), InvalidArgumentError, 'more samples per round than the data set');
});
