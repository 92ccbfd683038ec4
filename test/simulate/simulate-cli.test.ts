/**
 * `sapipe simulate dataparallel` as a user runs it (a real `node bin/sapipe.js` process on the
 * built dist/): the sweep table is labelled a model and its figures match the hand-computed
 * ones, --json and --profile work, and bad input fails with a message and a non-zero exit.
 */
import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import t from 'tap';

import { projectionFromCli, type SimulateDataParallelCliOptions } from '../../dist/apps/cli/commands/simulate.js';
import { InvalidArgumentError } from '../../dist/errors.js';

const run = promisify(execFile);
const bin = fileURLToPath(new URL('../../bin/sapipe.js', import.meta.url));
const sapipe = (...args: string[]) => run(process.execPath, [bin, 'simulate', 'dataparallel', ...args], { maxBuffer: 1 << 22, timeout: 60_000 });

interface ProjectionJson {
  model: boolean;
  gradientBytes: number;
  network: { gbps: number; latencyUs: number };
  profile: { computeMs: number; samplesPerStep: number; params?: number; modelBytes?: number };
  rows: { workers: number; allreduceMs: number; syncStepMs: number; sapipeStepMs: number; speedup: number; sapipeSamplesPerSec: number; commComputeRatio: number }[];
}

t.test('a sweep over worker counts prints a table labelled as a model', async (t) => {
  // 10 ms compute, 5 MB gradient, 10 Gbit/s: all-reduce 4 ms on 2 workers, 7 ms on 8.
  const { stdout } = await sapipe('--workers', '2,8', '--gbps', '10', '--compute-ms', '10', '--params', '1250000', '--samples-per-step', '32');
  t.match(stdout, /MODELLED projection/);
  t.match(stdout, /MODEL, not a measurement/);
  for (const head of ['workers', 'all-reduce ms', 'comm/compute', 'sync step ms', 'SAPipe step ms', 'sync samples/s', 'SAPipe samples/s', 'SAPipe speedup']) t.match(stdout, head);
  const row = (w: number): string[] => {
    const line = stdout.split('\n').find((l) => new RegExp(`^│\\s*${w}\\s*│`).test(l));
    t.ok(line, `a row for ${w} workers`);
    return (line ?? '').split('│').map((c) => c.trim()).filter(Boolean);
  };
  t.same(row(2).slice(0, 8), ['2', '4.000', '0.40', '14.000', '10.000', '4571', '6400', '1.40x']);
  t.same(row(8).slice(0, 8), ['8', '7.000', '0.70', '17.000', '10.000', '15059', '25600', '1.70x']);
  t.match(stdout, /SAPipe hides the whole all-reduce behind compute at 2, 8 workers/);
  t.notMatch(stdout, /the network sets the pace/);
  const bound = await sapipe('--workers', '1,2,16', '--gbps', '1', '--compute-ms', '2', '--model-mb', '1');
  t.match(bound.stdout, /at 2, 16 workers the network sets the pace/, 'network-bound rows are named');
});

t.test('--json, and a profile file with a flag overriding it', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'sapipe-sim-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const file = join(dir, 'p.json');
  writeFileSync(file, JSON.stringify({ computeMs: 2, modelBytes: 1e6, samplesPerStep: 4, source: 'hand-written' }));
  const a = JSON.parse((await sapipe('--profile', file, '--gbps', '1', '--workers', '8', '--json')).stdout) as ProjectionJson;
  t.equal(a.model, true);
  t.equal(a.gradientBytes, 1e6);
  t.equal(a.rows.length, 1);
  const near = (x: number, y: number): boolean => Math.abs(x - y) < 1e-9;
  t.ok(near(a.rows[0]!.allreduceMs, 14), `all-reduce ${a.rows[0]!.allreduceMs} = 2*7/8 * 1e6 B * 8e-6 ms/B`);
  t.ok(near(a.rows[0]!.sapipeStepMs, 14), 'SAPipe step = all-reduce');
  t.ok(near(a.rows[0]!.syncStepMs, 16), 'sync step = 2 + 14');
  // --compute-ms overrides the profile's; --latency-us adds 2(W-1) messages of 100 us.
  const b = JSON.parse((await sapipe('--profile', file, '--gbps', '1', '--workers', '8', '--compute-ms', '20', '--latency-us', '100', '--json')).stdout) as ProjectionJson;
  t.equal(b.profile.computeMs, 20);
  t.ok(near(b.rows[0]!.allreduceMs, 15.4), `all-reduce ${b.rows[0]!.allreduceMs} = 14 + 1.4 ms`);
  t.equal(b.rows[0]!.sapipeStepMs, 20, 'compute-bound now');
  // --model-mb replaces the profile's size.
  const c = JSON.parse((await sapipe('--profile', file, '--gbps', '1', '--workers', '2', '--model-mb', '2', '--json')).stdout) as ProjectionJson;
  t.equal(c.gradientBytes, 2e6);
  t.equal(c.profile.modelBytes, 2e6);
});

t.test('--help explains the model', async (t) => {
  const { stdout } = await sapipe('--help');
  t.match(stdout, /--workers <list>/);
  t.match(stdout, /--profile <file>/);
  t.match(stdout, /MODEL/);
});

t.test('bad input: typed errors naming the flag', (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'sapipe-sim-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const broken = join(dir, 'broken.json');
  writeFileSync(broken, '{"computeMs": 1,');
  const o = (extra: Partial<SimulateDataParallelCliOptions>): SimulateDataParallelCliOptions => ({ workers: '2,4', latencyUs: '0', ...extra });
  const base = { computeMs: '10', params: '1000' };
  const cases: [Partial<SimulateDataParallelCliOptions>, RegExp][] = [
    [{ ...base }, /--gbps is required/],
    [{ ...base, gbps: '0' }, /--gbps must be a number > 0/],
    [{ ...base, gbps: 'fast' }, /--gbps must be a number/],
    [{ ...base, gbps: '1', workers: '2,0' }, /--workers: each count must be an integer/],
    [{ ...base, gbps: '1', workers: '2,,4' }, /--workers: expected a count or a list/],
    [{ ...base, gbps: '1', workers: '1.5' }, /--workers: each count must be an integer/],
    [{ ...base, gbps: '1', workers: '4,4' }, /each count at most once/],
    [{ ...base, gbps: '1', latencyUs: '-1' }, /--latency-us must be a number >= 0/],
    [{ gbps: '1', params: '1000' }, /--compute-ms/],
    [{ gbps: '1', computeMs: '10' }, /--params or --model-mb/],
    [{ gbps: '1', computeMs: '-3', params: '1000' }, /--compute-ms must be a number > 0/],
    [{ gbps: '1', computeMs: '3', params: '10.5' }, /--params must be a whole number/],
    [{ gbps: '1', computeMs: '3', params: '10', modelMb: '1' }, /not both/],
    [{ gbps: '1', computeMs: '3', modelMb: '0' }, /--model-mb must be a number > 0/],
    [{ gbps: '1', computeMs: '3', params: '10', samplesPerStep: 'x' }, /--samples-per-step must be a number/],
    [{ gbps: '1', profile: join(dir, 'missing.json') }, /cannot read the profile/],
    [{ gbps: '1', profile: broken }, /not valid JSON/],
  ];
  for (const [extra, message] of cases) {
    const what = JSON.stringify(extra);
    t.throws(() => projectionFromCli(o(extra)), { name: 'InvalidArgumentError', code: 'ERR_INVALID_ARGUMENT', message }, what);
    t.throws(() => projectionFromCli(o(extra)), InvalidArgumentError, what);
  }
  t.end();
});

t.test('bad input fails with a message and a non-zero exit', async (t) => {
  const failure = async (...args: string[]): Promise<{ code?: number; stderr?: string }> => {
    try {
      await sapipe(...args);
    } catch (error) {
      return error as { code?: number; stderr?: string };
    }
    throw new Error(`sapipe simulate dataparallel ${args.join(' ')} succeeded`);
  };
  const cases: [string[], RegExp][] = [
    [['--compute-ms', '10', '--params', '1000'], /--gbps is required/],
    [['--gbps', '1', '--compute-ms', '10', '--params', '1000', '--workers', '2,0'], /--workers: each count must be an integer/],
  ];
  for (const [args, message] of cases) {
    const e = await failure(...args);
    t.not(e.code, 0, args.join(' '));
    t.match(e.stderr, message, args.join(' '));
  }
});
