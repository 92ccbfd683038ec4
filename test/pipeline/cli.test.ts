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
