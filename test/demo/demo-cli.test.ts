/**
 * `sapipe demo` as a user runs it (a real `node bin/sapipe.js` process on the built dist/): a
 * short two-mode run must train to a useful accuracy, report its rows as JSON and write the HTML
 * report; bad options must fail with a message.
 */
import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import t from 'tap';

import { demoConfigFromCli, demoProfile } from '../../dist/apps/cli/commands/demo.js';
import { parseModes } from '../../dist/apps/demo/config.js';
import { describeDemoModel } from '../../dist/apps/demo/models.js';
import { gptLayers, layerParams } from '../../dist/index.js';
import type { DemoResult } from '../../dist/apps/demo/run-demo.js';
import { parseDataParallelProfile } from '../../dist/dataparallel/projection.js';

const run = promisify(execFile);
const bin = fileURLToPath(new URL('../../bin/sapipe.js', import.meta.url));
const sapipe = (...args: string[]) => run(process.execPath, [bin, ...args], { maxBuffer: 1 << 22, timeout: 120_000 });

interface DemoJson {
  config: { workers: number; epochs: number; trainSamples: number; modes: string[] };
  modes: { mode: string; epochAccuracy: number[]; finalAccuracy: number; wallMs: number; samplesPerSec: number; speedup?: number; exposedCommMs: number; steps: number }[];
  report: string;
}

// One epoch on 4000 samples with 2 workers: sync reaches about 0.86 here; 0.8 leaves room for
// platform differences while still failing if the gradients were not averaged or applied.
const SYNC_FLOOR = 0.8;

t.test('demo --json: two modes train, report rows and write the HTML report', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'sapipe-demo-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const report = join(dir, 'report.html');
  const { stdout } = await sapipe('demo', '--workers', '2', '--epochs', '1', '--modes', 'sync,sapipe-dc', '--train-samples', '4000', '--json', '--report', report);
  const result = JSON.parse(stdout) as DemoJson;
  t.equal(result.config.workers, 2);
  t.equal(result.config.trainSamples, 4000);
  t.same(result.modes.map((m) => m.mode), ['sync', 'sapipe-dc']);
  const [sync, dc] = result.modes;
  t.ok(sync!.finalAccuracy > SYNC_FLOOR, `sync accuracy ${sync!.finalAccuracy} > ${SYNC_FLOOR}`);
  t.ok(dc!.finalAccuracy > 0.5, `sapipe-dc learns too (${dc!.finalAccuracy})`);
  for (const m of result.modes) {
    t.equal(m.epochAccuracy.length, 1, `${m.mode}: one accuracy per epoch`);
    t.equal(m.finalAccuracy, m.epochAccuracy[0]);
    // 4000 samples / 2 workers / batch 32 = 62 steps per worker.
    t.equal(m.steps, 62, `${m.mode}: steps`);
    t.ok(m.wallMs > 0 && m.samplesPerSec > 0, `${m.mode}: timed`);
    t.ok(m.exposedCommMs >= 0 && m.exposedCommMs <= m.wallMs, `${m.mode}: exposed communication within the wall time`);
  }
  t.equal(sync!.speedup, 1);
  t.ok(Math.abs(dc!.speedup! - sync!.wallMs / dc!.wallMs) < 1e-9, 'speedup is sync wall time over the mode wall time');
  t.equal(result.report, report);
  const html = readFileSync(report, 'utf8');
  t.match(html, /^<!doctype html>/);
  for (const id of ['configuration', 'results', 'accuracy', 'step-time']) t.match(html, new RegExp(`id="${id}"`), `section ${id}`);
  t.match(html, /<svg class="accuracy"/);
  t.equal((html.match(/<rect class="compute"/g) ?? []).length, 2, 'a compute bar per mode');
  t.equal((html.match(/<rect class="comm"/g) ?? []).length, 2, 'an exposed-communication bar per mode');
  t.match(html, /sapipe-dc/);
  t.notMatch(html, /<script|<link|src="http/, 'self-contained: no scripts or external assets');
});

t.test('demo --model cnn trains the CNN on Fashion-MNIST in each mode and names it in the output and report', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'sapipe-demo-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const report = join(dir, 'r.html');
  const { stdout } = await sapipe('demo', '--model', 'cnn', '--workers', '2', '--epochs', '1', '--modes', 'sync,sapipe-wp', '--train-samples', '4000', '--json', '--report', report);
  const result = JSON.parse(stdout) as DemoJson & { config: { model: string; description: string; params: number; testSamples: number } };
  t.equal(result.config.model, 'cnn');
  t.equal(result.config.testSamples, 10_000, "Fashion-MNIST's own test set");
  // conv(1->8, 3x3) 80, conv(8->16, 3x3) 1168, linear(16*7*7 -> 10) 7850.
  t.equal(result.config.params, 80 + 1168 + 7850);
  // One epoch on 4000 images with 2 workers: about 0.75 here (chance: 0.1).
  for (const m of result.modes) t.ok(m.finalAccuracy > 0.6, `${m.mode}: ${m.finalAccuracy}`);
  t.match(readFileSync(report, 'utf8'), /CNN \(conv 8,16/);
  await t.rejects(sapipe('demo', '--model', 'resnet'), /--model must be one of 'mlp', 'cnn', 'gpt', got the string "resnet"/);
  await t.rejects(sapipe('demo', '--tfjs', '--model', 'cnn'), /--model picks sapipe's own model/);
});

t.test('demo --model gpt trains the byte-level GPT on text windows in each mode and reports next-byte accuracy and test loss', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'sapipe-demo-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const { stdout } = await sapipe('demo', '--model', 'gpt', '--workers', '2', '--epochs', '2', '--modes', 'sync,pipe-sgd', '--train-samples', '512', '--json', '--report', join(dir, 'r.html'));
  const result = JSON.parse(stdout) as DemoJson & { config: { model: string; testSamples: number }; modes: { epochLoss: number[]; finalLoss: number }[] };
  t.equal(result.config.model, 'gpt');
  t.equal(result.config.testSamples, 256, '256 windows of the held-out text');
  for (const m of result.modes) {
    t.equal(m.epochLoss.length, 2, 'a test loss per epoch');
    // Uniform over the bytes is ln 256 = 5.55 nats.
    t.ok(m.finalLoss < Math.log(256), `${m.mode}: test loss ${m.epochLoss.map((l) => l.toFixed(3)).join(' -> ')}`);
    t.ok(m.finalAccuracy > 0.05, `${m.mode}: next-byte accuracy ${m.finalAccuracy}`);
  }
  // sync: 3.67 -> 3.49 here (pipe-sgd's one-step-late gradient at this lr rises: 4.25 -> 4.74).
  const sync = result.modes[0]!;
  t.ok(sync.finalLoss < sync.epochLoss[0]! && sync.finalLoss < 4, `sync learns: ${sync.epochLoss.map((l) => l.toFixed(3)).join(' -> ')}`);
});

t.test('demo --model gpt --blocks --dim --heads --context trains a GPT of that size and states it', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'sapipe-demo-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const report = join(dir, 'r.html');
  const size = { blocks: 1, dim: 32, heads: 2, context: 16 };
  const { stdout } = await sapipe(
    'demo', '--model', 'gpt', '--blocks', '1', '--dim', '32', '--heads', '2', '--context', '16',
    '--workers', '2', '--epochs', '1', '--modes', 'sync', '--train-samples', '64', '--json', '--report', report,
  );
  const result = JSON.parse(stdout) as DemoJson & { config: { gpt: typeof size; description: string; params: number }; modes: { epochLoss: number[] }[] };
  t.same(result.config.gpt, size);
  const description = 'byte-level GPT (1 blocks, width 32, 2 heads, context 16) on the fortunes text';
  t.equal(result.config.description, description);
  const params = layerParams(gptLayers({ vocab: 256, context: 16, dim: 32, heads: 2, layers: 1 })).reduce((a, b) => a + b, 0);
  t.equal(result.config.params, params, `${params} parameters`);
  // 64 windows of 16 bytes, 2 workers of batch 32: one step each; the test loss is measured once.
  t.equal(result.modes[0]!.steps, 1);
  t.equal(result.modes[0]!.epochLoss.length, 1);
  t.ok(readFileSync(report, 'utf8').includes(description), 'the report names the size');
  t.match(readFileSync(report, 'utf8'), /<h1>sapipe demo: data-parallel the fortunes text<\/h1>/, 'the report is titled by its data set');
});

t.test('the GPT size options: defaults, and typed errors as train pipeline gives them', async (t) => {
  const options = { model: 'gpt', workers: '2', modes: 'sync', epochs: '1', batch: '32', lr: '0.05', momentum: '0.9', seed: '1', report: 'r.html', schedules: '', stages: '2' };
  const cli = (extra: Record<string, string>) => demoConfigFromCli({ ...options, ...extra } as Parameters<typeof demoConfigFromCli>[0]);
  t.same(cli({}).gpt, { blocks: 2, dim: 64, heads: 4, context: 64 }, "the demo's small GPT by default");
  t.same(cli({ dim: '96', heads: '3' }).gpt, { blocks: 2, dim: 96, heads: 3, context: 64 }, 'the others keep their defaults');
  t.equal(cli({ model: 'mlp' }).gpt, undefined, 'no size for the MLP');
  t.equal(describeDemoModel('gpt'), 'byte-level GPT (2 blocks, width 64, 4 heads, context 64) on the fortunes text');
  const bad: [Record<string, string>, RegExp][] = [
    [{ model: 'mlp', dim: '32' }, /^--dim sets the GPT's size; use it with --model gpt$/],
    [{ model: 'cnn', context: '16' }, /^--context sets the GPT's size; use it with --model gpt$/],
    [{ dim: '30', heads: '4' }, /--dim 30 must be a multiple of --heads 4/],
    [{ blocks: '0' }, /--blocks/],
    [{ context: 'long' }, /--context must be a number, got "long"/],
    [{ heads: '2.5' }, /--heads/],
  ];
  for (const [extra, message] of bad) t.throws(() => cli(extra), { code: 'ERR_INVALID_ARGUMENT', message }, JSON.stringify(extra));
  // The same refusals from the command as a user runs it.
  for (const [args, message] of [
    [['--dim', '32'], /--dim sets the GPT's size; use it with --model gpt/],
    [['--model', 'gpt', '--dim', '30', '--heads', '4'], /--dim 30 must be a multiple of --heads 4/],
  ] as [string[], RegExp][])
    await t.rejects(sapipe('demo', ...args), message, args.join(' '));
});

t.test('demo with --gbps labels the emulated network in the report', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'sapipe-demo-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const report = join(dir, 'r.html');
  const { stdout } = await sapipe('demo', '--workers', '2', '--epochs', '1', '--modes', 'pipe-sgd', '--train-samples', '640', '--gbps', '5', '--report', report);
  t.match(stdout, /emulated network 5 Gbit\/s/);
  // 101 770 fp32 parameters, 2 workers, 5 Gbit/s: 2*1/2 * 407 080 B * 8 / 5e9 s = 0.65 ms.
  t.match(stdout, /Modelled ring all-reduce of the gradient on the emulated network: 0\.65 ms per step/);
  t.match(stdout, /step ms/);
  t.match(stdout, /pipe-sgd/);
  t.match(readFileSync(report, 'utf8'), /emulated network: 5 Gbit\/s/);
});

t.test('demo --topk: the compressed exchange trains in sync and a staleness-1 mode and is named in the output and report', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'sapipe-demo-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const report = join(dir, 'r.html');
  const { stdout } = await sapipe('demo', '--workers', '2', '--epochs', '1', '--modes', 'sync,sapipe-wp', '--train-samples', '4000', '--topk', '0.05', '--json', '--report', report);
  const result = JSON.parse(stdout) as DemoJson;
  // 5 % of the gradient per worker, with error feedback, still learns (about 0.85 here).
  for (const m of result.modes) t.ok(m.finalAccuracy >= SYNC_FLOOR - 0.05, `${m.mode}: ${m.finalAccuracy}`);
  t.match(readFileSync(report, 'utf8'), /top-k, density 0\.05, with error feedback/);
  await t.rejects(sapipe('demo', '--topk', '0'), /--topk must be a density in \(0, 1\]/);
});

t.test('--modes variants: sapipe-wp estimates and +dc', (t) => {
  t.same(parseModes('sync, sapipe-wp,sapipe-wp:local+dc,sapipe-wp:local-prev-sync'), [
    { label: 'sync', mode: 'sync', estimate: undefined, compensate: false },
    { label: 'sapipe-wp', mode: 'sapipe-wp', estimate: 'prev-sync', compensate: false },
    { label: 'sapipe-wp:local+dc', mode: 'sapipe-wp', estimate: 'local', compensate: true },
    { label: 'sapipe-wp:local-prev-sync', mode: 'sapipe-wp', estimate: 'local-prev-sync', compensate: false },
  ]);
  t.same(parseModes('sapipe-wp+dc')[0], { label: 'sapipe-wp+dc', mode: 'sapipe-wp', estimate: 'prev-sync', compensate: true }, 'the default estimate with +dc');
  const bad: [string, RegExp][] = [
    ['sync:local', /only sapipe-wp takes an estimate/],
    ['sapipe-dc+dc', /only sapipe-wp takes/],
    ['sapipe-wp:psychic', /unknown estimate "psychic"/],
    ['sapipe-wp:local,sapipe-wp:local', /at most once/],
    ['sapipe-wp,sapipe-wp:prev-sync', /at most once/],
    ['SYNC', /unknown mode/],
    [',', /at least one/],
  ];
  for (const [list, message] of bad) t.throws(() => parseModes(list), { code: 'ERR_INVALID_ARGUMENT', message }, list);
  t.end();
});

t.test('a sapipe-wp variant with --lambda, and --profile-out feeding simulate', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'sapipe-demo-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const profile = join(dir, 'profile.json');
  const { stdout } = await sapipe(
    'demo', '--workers', '2', '--epochs', '1', '--modes', 'sync,sapipe-wp:local+dc', '--lambda', '0.5', '--dc-kind', 'adaptive', '--train-samples', '640',
    '--profile-out', profile, '--json', '--report', join(dir, 'r.html'),
  );
  const result = JSON.parse(stdout) as DemoJson & { config: { lambda: number; dcKind: string }; modes: { variant: { estimate?: string; compensate: boolean }; loopStepMs: number }[] };
  t.equal(result.config.lambda, 0.5);
  t.equal(result.config.dcKind, 'adaptive');
  t.same(result.modes.map((m) => m.mode), ['sync', 'sapipe-wp:local+dc']);
  t.same(result.modes[1]!.variant, { label: 'sapipe-wp:local+dc', mode: 'sapipe-wp', estimate: 'local', compensate: true });
  for (const m of result.modes) t.ok(m.loopStepMs > 0 && m.loopStepMs * m.steps <= m.wallMs, `${m.mode}: steady-state step time within the wall time`);
  t.ok(result.modes[1]!.finalAccuracy > 0.3, `sapipe-wp:local+dc with adaptive DC learns (${result.modes[1]!.finalAccuracy})`);
  const p = parseDataParallelProfile(readFileSync(profile, 'utf8'));
  t.equal(p.params, 784 * 128 + 128 + 128 * 10 + 10, 'the MLP\'s parameter count');
  t.equal(p.samplesPerStep, 32);
  t.ok(p.computeMs > 0, `computeMs ${p.computeMs}`);
  t.match(p.source, /sapipe demo: MLP 784-128-10 on MNIST, mode sync, 2 workers/);
  const sim = await run(process.execPath, [bin, 'simulate', 'dataparallel', '--profile', profile, '--gbps', '1', '--workers', '2,16']);
  t.match(sim.stdout, /MODELLED projection: compute [\d.]+ ms per step per worker, 32 samples per step per worker, gradient 0\.407 MB/);
});

t.test('demoProfile: the sync run\'s compute time, scaled when workers shared the cores', (t) => {
  const mode = (label: 'sync' | 'pipe-sgd', compute: number): DemoResult['modes'][number] => ({
    mode: label,
    variant: { label, mode: label, estimate: undefined, compensate: false },
    epochAccuracy: [0.9],
    finalAccuracy: 0.9,
    wallMs: 1000,
    samplesPerSec: 1,
    speedup: 1,
    exposedCommMs: 0,
    stepMs: { compute, comm: 1 },
    loopStepMs: compute + 1,
    steps: 10,
  });
  const result = (workers: number, modes: DemoResult['modes']): DemoResult => ({
    config: {
      workers, modes: modes.map((m) => m.variant), epochs: 1, batch: 16, lr: 0.1, momentum: 0.9, seed: 1, trainSamples: 100,
      emulate: undefined, lambda: undefined, dcKind: undefined, model: 'mlp', description: 'MLP 4-3-2 on MNIST', params: 23, testSamples: 10,
      device: { kind: 'cpu', ranks: [], reason: 'the default --device' },
    },
    modes,
  });
  t.same(demoProfile(result(8, [mode('pipe-sgd', 9), mode('sync', 6)]), 2), {
    computeMs: 1.5,
    params: 23,
    samplesPerStep: 16,
    source: 'sapipe demo: MLP 4-3-2 on MNIST, mode sync, 8 workers on 2 cores, measured 6.000 ms per step outside communication, scaled by 2/8 for one worker per core',
  });
  const alone = demoProfile(result(2, [mode('pipe-sgd', 9)]), 4);
  t.equal(alone.computeMs, 9, 'no sync run: the first mode, unscaled with a core per worker');
  t.notMatch(alone.source, /scaled/);
  t.end();
});

t.test('bad options are rejected with a message and a non-zero exit', async (t) => {
  const failure = async (...args: string[]): Promise<{ code?: number; stderr?: string }> => {
    try {
      await sapipe('demo', ...args);
    } catch (error) {
      return error as { code?: number; stderr?: string };
    }
    throw new Error(`sapipe demo ${args.join(' ')} succeeded`);
  };
  const cases: [string[], RegExp][] = [
    [['--modes', 'sync,turbo'], /unknown mode "turbo"/],
    [['--workers', '0'], /--workers must be an integer/],
    [['--lr', '-0.1'], /--lr must be a positive number/],
    [['--latency-us', '5'], /--latency-us needs --gbps/],
    [['--lambda', '-1'], /--lambda must be a number in \[0, 1e6\]/],
    [['--dc-kind', 'taylor'], /--dc-kind must be elementwise or adaptive/],
    [['--modes', 'sapipe-wp:psychic'], /unknown estimate "psychic"/],
  ];
  for (const [args, message] of cases) {
    const e = await failure(...args);
    t.not(e.code, 0, args.join(' '));
    t.match(e.stderr, message, args.join(' '));
  }
});
