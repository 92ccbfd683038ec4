import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { Command } from 'commander';
import t from 'tap';

import { registerScheduleCommand } from '../../dist/apps/cli/commands/schedule.js';
import { registerTuneCommand } from '../../dist/apps/cli/commands/tune.js';

async function run(args: string[]): Promise<string> {
  const program = new Command().exitOverride();
  registerScheduleCommand(program);
  registerTuneCommand(program);
  const lines: string[] = [];
  const log = console.log;
  console.log = (...parts: unknown[]) => lines.push(parts.join(' '));
  try {
    await program.parseAsync(['node', 'sapipe', ...args]);
  } finally {
    console.log = log;
  }
  return lines.join('\n');
}

t.test('sapipe schedule prints the timeline and figures, and writes pictures', async (t) => {
  const text = await run(['schedule', '1f1b', '--stages', '4', '--microbatches', '8', '--ascii']);
  t.match(text, /^1f1b \(S=4 M=8\)/);
  t.match(text, /bubble fraction: 0\.2727/);
  const dir = mkdtempSync(join(tmpdir(), 'sapipe-schedule-'));
  const out = await run(['schedule', 'avgpipe', '-s', '4', '-m', '8', '-n', '2', '-a', '3', '--latency', '1', '--svg', join(dir, 'a.svg'), '--html', join(dir, 'a.html')]);
  t.match(out, /wrote .*a\.svg/);
  t.notMatch(out, /stage  0 \|/, 'no text picture unless asked');
  t.match(readFileSync(join(dir, 'a.svg'), 'utf8'), /^<svg/);
  t.match(readFileSync(join(dir, 'a.html'), 'utf8'), /^<!doctype html>/);
  const json = JSON.parse(await run(['schedule', 'pipedream', '-s', '3', '-m', '6', '--json']));
  t.same(json.maxStaleness, [2, 1, 0]);
  t.match(await run(['schedule', 'gpipe', '-s', '2', '-m', '1', '--actions']), /0: 0F0 0sa0>1/);
  await t.rejects(run(['schedule', 'nope']), /unknown schedule "nope"/);
  await t.rejects(run(['schedule', 'gpipe', '--stages', 'x']), /--stages must be an integer/);
  await t.rejects(run(['schedule', 'gpipe', '--latency', '-1']), { code: 'ERR_INVALID_ARGUMENT' });
});

t.test('sapipe tune explains its choice', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'sapipe-tune-'));
  const file = join(dir, 'profile.json');
  writeFileSync(
    file,
    JSON.stringify({
      stages: [1, 2, 3].map(() => ({ forwardMs: 2, backwardMs: 4, activationBytes: 2 ** 26, weightBytes: 2 ** 30 })),
      microBatchSize: 4,
      batchSize: 16,
      p2pLatencyMs: 1,
    }),
  );
  const text = await run(['tune', '--profile', file, '--memory-gb', '8', '--max-pipelines', '2', '--top', '3']);
  t.match(text, /chosen: N=\d/);
  t.match(text, /fastest 3 settings/);
  const json = JSON.parse(await run(['tune', '--profile', file, '--memory-gb', '8', '--max-pipelines', '2', '--json']));
  t.ok(json.best.fits);
  await t.rejects(run(['tune', '--profile', join(dir, 'missing.json'), '--memory-gb', '8']), /cannot read the profile/);
  await t.rejects(run(['tune', '--profile', file, '--memory-gb', 'lots']), /--memory-gb must be a number/);
});

t.test('sapipe tune --measured reports its prediction for a run against what the run measured', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'sapipe-tune-measured-'));
  const profileFile = join(dir, 'profile.json');
  const fit = { forward: { fixedMs: 0.5, perSampleMs: 0.1 }, backward: { fixedMs: 1, perSampleMs: 0.2 } };
  // one core: a 1F1B round of M = 2 micro-batches of 4 on 2 stages is all its work, 2 x 2 x (0.9 + 1.8) + 2 x 0.3 = 11.4 ms
  writeFileSync(profileFile, JSON.stringify({ stages: [0, 1].map(() => ({ forwardMs: 0.9, backwardMs: 1.8, optimizerStepMs: 0.3, fit })), microBatchSize: 4, batchSize: 8, machine: { cores: 1, passCores: 1 } }));
  // what `sapipe train pipeline --schedule 1f1b --stages 2 --microbatches 2 --microbatch-size 4 --json` prints, in part
  const report = { config: { schedule: '1f1b', stages: 2, microBatches: 2, microBatchSize: 4 }, epochs: [{ epoch: 1 }], trainSamples: 100, samplesPerRound: 8, trainMs: 240, measured: { makespanMs: 12 } };
  const reportFile = join(dir, 'run.json');
  writeFileSync(reportFile, JSON.stringify(report));
  const predicted = (8 * 1000) / 11.4;
  const wall = (96 * 1000) / 240; // 12 whole rounds of 8 samples in 240 ms
  const round = (8 * 1000) / 12;
  const json = JSON.parse(await run(['tune', '--profile', profileFile, '--memory-gb', '1', '--max-pipelines', '1', '--json', '--measured', reportFile]));
  t.same(json.measured.setting, { schedule: '1f1b', pipelines: 1, microBatches: 2, advance: 0, microBatchSize: 4 });
  t.ok(Math.abs(json.measured.predicted.samplesPerSecond - predicted) < 1e-6, `predicted ${json.measured.predicted.samplesPerSecond}`);
  t.ok(Math.abs(json.measured.measuredSamplesPerSecond - wall) < 1e-9);
  t.ok(Math.abs(json.measured.measuredRoundSamplesPerSecond - round) < 1e-9);
  t.ok(Math.abs(json.measured.error - (predicted / wall - 1)) < 1e-9);
  t.ok(Math.abs(json.measured.roundError - (predicted / round - 1)) < 1e-9);
  const text = await run(['tune', '--profile', profileFile, '--memory-gb', '1', '--max-pipelines', '1', '--top', '0', '--measured', reportFile]);
  t.match(text, /the measured run, 1f1b N=1 M=2 A=0 micro-batch 4:/);
  t.match(text, new RegExp(`predicted ${predicted.toFixed(1)} samples/s`));
  t.match(text, new RegExp(`measured  ${wall.toFixed(1)} samples/s over training wall time: prediction error \\+75\\.4%`));
  t.match(text, new RegExp(`measured  ${round.toFixed(1)} samples/s over its median round: prediction error \\+5\\.3%`));
  // GPipe is all forwards first; AvgPipe takes its N and A from the run
  writeFileSync(reportFile, JSON.stringify({ ...report, config: { ...report.config, schedule: 'gpipe' } }));
  t.equal(JSON.parse(await run(['tune', '--profile', profileFile, '--memory-gb', '1', '--json', '--measured', reportFile])).measured.setting.advance, 4);
  writeFileSync(reportFile, JSON.stringify({ ...report, config: { ...report.config, schedule: 'avgpipe', pipelines: 2, advance: 1 } }));
  const avg = JSON.parse(await run(['tune', '--profile', profileFile, '--memory-gb', '1', '--json', '--measured', reportFile])).measured.setting;
  t.same([avg.pipelines, avg.layout], [2, 'worker-per-replica'], "a report that names no layout ran each pipeline on its own workers (sapipe's earlier runtime)");
  writeFileSync(reportFile, JSON.stringify({ ...report, averagingLayout: 'shared-stages', config: { ...report.config, schedule: 'avgpipe', pipelines: 2, advance: 1 } }));
  t.equal(JSON.parse(await run(['tune', '--profile', profileFile, '--memory-gb', '1', '--json', '--measured', reportFile])).measured.setting.layout, 'shared-stages', 'the layout the report says ran');
  writeFileSync(reportFile, JSON.stringify({ ...report, averagingLayout: 'shared', config: { ...report.config, schedule: 'avgpipe', pipelines: 2, advance: 1 } }));
  await t.rejects(run(['tune', '--profile', profileFile, '--memory-gb', '1', '--measured', reportFile]), { code: 'ERR_INVALID_ARGUMENT', message: /averagingLayout must be one of/ });
  // runs the tuner does not predict, and reports that are not one
  writeFileSync(reportFile, JSON.stringify({ ...report, config: { ...report.config, schedule: 'pipedream' } }));
  await t.rejects(run(['tune', '--profile', profileFile, '--memory-gb', '1', '--measured', reportFile]), { code: 'ERR_INVALID_ARGUMENT', message: /predicts avgpipe, 1f1b and gpipe runs/ });
  writeFileSync(reportFile, JSON.stringify({ ...report, config: { ...report.config, stages: 3 } }));
  await t.rejects(run(['tune', '--profile', profileFile, '--memory-gb', '1', '--measured', reportFile]), /the run has 3 stages and the profile 2/);
  writeFileSync(reportFile, JSON.stringify({ ...report, trainMs: undefined }));
  await t.rejects(run(['tune', '--profile', profileFile, '--memory-gb', '1', '--measured', reportFile]), /trainMs must be a number > 0/);
  await t.rejects(run(['tune', '--profile', profileFile, '--memory-gb', '1', '--measured', join(dir, 'missing.json')]), /cannot read the run's result/);
});
