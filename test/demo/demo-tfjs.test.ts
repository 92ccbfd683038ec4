/**
 * `sapipe demo --tfjs` as a user runs it (a real `node bin/sapipe.js` process on the built dist/):
 * the TensorFlow.js CNN trained by tfjs alone, data-parallel in `sync` through sapipe/tfjs, and
 * cut into 2 pipeline stages under 1F1B. Both sapipe runs see the global batch tfjs alone sees;
 * `sync` walks the same seeded sample order, so it computes tfjs alone's training up to rounding
 * and its test accuracy equals tfjs alone's to a few test samples. Bad options fail with a message.
 */
import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import t from 'tap';

import type { TfjsDemoResult } from '../../dist/apps/demo/tfjs-run.js';

const run = promisify(execFile);
const bin = fileURLToPath(new URL('../../bin/sapipe.js', import.meta.url));
const sapipe = (...args: string[]) => run(process.execPath, [bin, ...args], { maxBuffer: 1 << 22, timeout: 420_000 });

t.test('demo --tfjs --json: tfjs alone, sync through the adapter and a 2-stage 1F1B pipeline', async (t) => {
  // 2 workers x batch 8 over 192 samples, 2 epochs: 24 updates (about 30 s here).
  const { stdout } = await sapipe('demo', '--tfjs', '--workers', '2', '--batch', '8', '--train-samples', '192', '--epochs', '2', '--modes', 'sync', '--schedules', '1f1b', '--json');
  const result = JSON.parse(stdout) as TfjsDemoResult;
  t.same(result.runs.map((r) => r.run), ['tfjs alone', 'sync', '1f1b x2 stages']);
  t.equal(result.config.backend, 'cpu', 'the plain JavaScript backend ran (tfjs-node is not installed here)');
  const [alone, sync, pipe] = result.runs;
  const testSamples = result.config.testSamples;
  t.ok(alone!.accuracy > 0.3, `tfjs alone learns (${alone!.accuracy}; chance 0.1)`);
  t.ok(Math.abs(sync!.accuracy - alone!.accuracy) * testSamples <= 4, `sync through sapipe/tfjs equals tfjs alone to 4 of ${testSamples} test samples (${sync!.accuracy} vs ${alone!.accuracy})`);
  t.ok(pipe!.accuracy > 0.3, `the 2-stage pipeline of TfjsStage parts learns (${pipe!.accuracy})`);
  for (const r of result.runs) {
    t.ok(r.wallMs > 0 && r.samplesPerSec > 0, `${r.run}: timed`);
    t.ok(Math.abs(r.speedup! - alone!.wallMs / r.wallMs) < 1e-9, `${r.run}: speedup is tfjs alone's wall time over this run's`);
  }
  t.ok(sync!.stepMs!.tfjs > 0 && sync!.stepMs!.adapter > 0 && Number.isFinite(sync!.adapterShare), 'sync: the adapter and tfjs times per step are reported');
  t.equal(alone!.adapterShare, undefined);
});

t.test('demo --tfjs: bad options fail with a message naming them', async (t) => {
  for (const [args, message] of [
    [['--tfjs', '--stages', '5'], /--stages: the demo's CNN cuts into 2 to 3/],
    [['--tfjs', '--schedules', '1f1b,nope'], /--schedules: unknown schedule "nope"/],
    [['--tfjs', '--report', 'x.html'], /--report is not offered with --tfjs/],
    [['--stages', '2'], /--stages belongs to --tfjs/],
    [['--tfjs', '--train-samples', '8'], /less than one global batch/],
  ] as const) {
    const failed = await sapipe('demo', ...args).then(
      () => undefined,
      (e: { code: number; stderr: string }) => e,
    );
    t.ok(failed && failed.code !== 0, `${args.join(' ')}: exits non-zero`);
    t.match(failed?.stderr ?? '', message, `${args.join(' ')}: says why`);
  }
});
