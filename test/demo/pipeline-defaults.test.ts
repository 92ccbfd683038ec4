/**
 * `sapipe train pipeline` without --lr and --momentum trains every schedule with hyperparameters
 * measured to work for it (bench/RESULTS.md, "learning rates per schedule"), and says which;
 * Pipelined Backpropagation gets the small-batch rule of ALGORITHMS.md section 4 for its
 * micro-batch size instead of a rate that diverges.
 */
import t from 'tap';

import { pipelineConfigFromCli } from '../../dist/apps/cli/commands/train.js';
import { checkMnistPipelineConfig, pipelineDefaults, PIPELINED_BACKPROP_REFERENCE, wavePeaks } from '../../dist/apps/demo/pipeline-run.js';
import type { RoundReport } from '../../dist/index.js';
import { pipelinedBackpropScaling } from '../../dist/optim/options.js';
import { RUNTIME_SCHEDULES } from '../../dist/pipeline/runtime/weights.js';

const cli = (extra: Record<string, string | undefined>) =>
  pipelineConfigFromCli({
    schedule: '1f1b',
    stages: '4',
    microbatches: '8',
    microbatchSize: '16',
    epochs: '1',
    optimizer: 'sgd',
    seed: '1',
    spikeCompensation: true,
    weightPrediction: true,
    boundaries: 'params',
    layers: '784,256,10',
    report: 'r.html',
    ...extra,
  } as Parameters<typeof pipelineConfigFromCli>[0]);

t.test('each schedule has a default that trains; the run says which', async (t) => {
  for (const schedule of RUNTIME_SCHEDULES) {
    const c = cli({ schedule });
    t.ok(c.defaultsNote && c.defaultsNote.includes(schedule === 'pipelined-backprop' ? 'small-batch rule' : String(c.lr)), `${schedule}: ${c.defaultsNote}`);
  }
  for (const schedule of ['pipeoptim', 'pipedream', 'pipedream-2bw', 'spectrain'] as const) t.equal(cli({ schedule }).lr, 0.02, `${schedule}: lr 0.02 (0.05 lags or diverges)`);
  for (const schedule of ['gpipe', '1f1b', 'wavelet'] as const) t.equal(cli({ schedule }).lr, 0.05, `${schedule}: lr 0.05`);
  t.equal(cli({ optimizer: 'adamw' }).lr, 0.001, 'AdamW: 0.001');
});

t.test('Pipelined Backpropagation takes the small-batch rule at its micro-batch size', async (t) => {
  for (const b of [1, 16]) {
    const c = cli({ schedule: 'pipelined-backprop', microbatchSize: String(b) });
    const rule = pipelinedBackpropScaling(PIPELINED_BACKPROP_REFERENCE, b);
    t.equal(c.lr, rule.lr, `batch ${b}: lr ${rule.lr}`);
    t.equal(c.momentum, rule.momentum, `batch ${b}: momentum ${rule.momentum}`);
    t.match(c.defaultsNote, /small-batch rule .* to the micro-batch of/);
  }
  t.ok(pipelineDefaults('pipelined-backprop', 'sgd', 1).lr < 1e-5, 'batch 1: a per-sample step, not 0.05');
});

t.test('an explicit --lr or --momentum wins, with no defaults note', async (t) => {
  const c = cli({ schedule: 'pipeoptim', lr: '0.05' });
  t.equal(c.lr, 0.05);
  t.equal(c.momentum, 0.9);
  t.equal(c.defaultsNote, undefined);
  const m = cli({ schedule: 'pipelined-backprop', momentum: '0.5' });
  t.equal(m.momentum, 0.5);
  t.equal(m.defaultsNote, undefined);
  t.throws(() => cli({ lr: 'fast' }), { code: 'ERR_INVALID_ARGUMENT' }, 'a bad --lr is a typed error');
  t.throws(() => cli({ schedule: 'nope' }), { code: 'ERR_INVALID_ARGUMENT' }, 'an unknown schedule too');
});

t.test('the GPT size options: the pipeline GPT by default, refused without --model gpt (as sapipe demo refuses them)', async (t) => {
  t.equal(cli({}).gpt, undefined, 'no size for the MLP');
  t.same(cli({ model: 'gpt' }).gpt, { blocks: 4, dim: 128, heads: 4, context: 128 });
  t.same(cli({ model: 'gpt', blocks: '1', context: '32' }).gpt, { blocks: 1, dim: 128, heads: 4, context: 32 });
  t.throws(() => cli({ heads: '2' }), { code: 'ERR_INVALID_ARGUMENT', message: /^--heads sets the GPT's size; use it with --model gpt$/ });
  t.throws(() => cli({ model: 'gpt', dim: 'wide' }), { code: 'ERR_INVALID_ARGUMENT', message: /--dim must be a number, got "wide"/ });
  // Refused while parsing the command line, before the run prints or loads anything.
  t.throws(() => cli({ model: 'gpt', dim: '30', heads: '4' }), { code: 'ERR_INVALID_ARGUMENT', message: /^--dim 30 must be a multiple of --heads 4/ });
  t.throws(() => cli({ model: 'gpt', blocks: '0' }), { code: 'ERR_INVALID_ARGUMENT', message: /--blocks/ });
});

t.test('--form: Wavelet\'s form reaches the run, checked; the waves\' peaks in the report', async (t) => {
  t.equal(checkMnistPipelineConfig(cli({ schedule: 'wavelet', form: 'data-parallel' })).form, 'data-parallel');
  t.equal(cli({ schedule: 'wavelet' }).form, undefined, 'none given: the trainer\'s default');
  t.throws(() => checkMnistPipelineConfig(cli({ schedule: 'wavelet', form: 'tick-tock' })), { code: 'ERR_INVALID_ARGUMENT', message: /--form must be one of 'data-parallel', 'model-parallel'/ });
  t.throws(() => checkMnistPipelineConfig(cli({ schedule: 'gpipe', form: 'data-parallel' })), { code: 'ERR_INVALID_ARGUMENT', message: /--form picks wavelet's form; use it with --schedule wavelet/ });
  // A round of 2 workers as the runtime measures it at b = 16 (sapipe train pipeline --schedule wavelet --form data-parallel --microbatch-size 16).
  const peaks = (p: number) => [{ pipeline: 2 * p, peakActivations: 1, peakActivationBytes: 181888 }, { pipeline: 2 * p + 1, peakActivations: 1, peakActivationBytes: 181888 }];
  const report = { peakActivations: [1, 1], peakActivationBytes: [181888, 181888], replicaPeaks: [peaks(0), peaks(1)] } as unknown as RoundReport;
  const waves = wavePeaks(report, 16);
  t.same(waves[1]!.tick, { peakActivations: 1, peakActivationBytes: 181888 });
  t.same(waves[1]!.worker, { peakActivations: 1, peakActivationBytes: 181888 });
  t.same([waves[0]!.comparison!.ratio, waves[0]!.comparison!.sameMemoryMicroBatch], [1, 16], 'plain data parallelism\'s memory; a wave of the whole 16 in it');
  // A worker holding both waves' micro-batches at once (a row running a forward before the other wave's backward).
  const both = wavePeaks({ ...report, peakActivations: [2, 2], peakActivationBytes: [363776, 363776] } as unknown as RoundReport, 16);
  t.same([both[0]!.comparison!.ratio, both[0]!.comparison!.sameMemoryMicroBatch], [2, 8], 'twice plain data parallelism; a wave of 8 in its memory');
});
