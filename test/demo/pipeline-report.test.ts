/**
 * The pipeline report agrees with itself: the measured weight versions count what the schedule
 * analysis counts (the weights, stashed copies and a predicted copy: PipeOptim's once read
 * "1 / 1" beside the analysis' "2 / 2"), and AvgPipe's pipelines are said to be coupled by elastic
 * averaging, not by a data-parallel mode.
 */
import t from 'tap';

import { pipelineComparison } from '../../dist/apps/demo/pipeline-report.js';
import { MNIST_PIPELINE_DEFAULTS, pipelinesCoupling, runMnistPipeline, type MnistPipelineConfig } from '../../dist/apps/demo/pipeline-run.js';

const quick = (schedule: MnistPipelineConfig['schedule']): MnistPipelineConfig => ({
  ...MNIST_PIPELINE_DEFAULTS,
  schedule,
  stages: 2,
  microBatches: 4,
  microBatchSize: 8,
  epochs: 1,
  lr: 0.02,
  trainSamples: 256,
  boundaries: 'params',
  sizes: [784, 32, 10],
});

for (const schedule of ['pipeoptim', 'pipedream', '1f1b'] as const) {
  t.test(`${schedule}: measured weight versions equal the analysis'`, async (t) => {
    const result = await runMnistPipeline(quick(schedule));
    const row = pipelineComparison(result).find(([name]) => name.startsWith('weight versions'));
    t.ok(row, 'the report has the row');
    t.equal(row![1], row![2], `measured ${row![1]}, analysis ${row![2]}`);
  });
}

t.test("AvgPipe's pipelines are coupled by elastic averaging; the others' by their data-parallel mode", async (t) => {
  t.match(pipelinesCoupling({ ...quick('avgpipe'), pipelines: 4 }), /4 parallel pipelines coupled by elastic averaging/);
  t.notMatch(pipelinesCoupling({ ...quick('avgpipe'), pipelines: 4 }) ?? '', /sync/);
  t.match(pipelinesCoupling({ ...quick('1f1b'), pipelines: 2, dataParallel: 'sapipe-wp' }), /data-parallel mode sapipe-wp/);
  t.equal(pipelinesCoupling(quick('1f1b')), undefined, 'one pipeline: nothing to say');
});
