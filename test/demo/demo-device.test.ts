/**
 * `sapipe demo --device`: the workers as NCCL ranks on GPUs, here on the CUDA plugin over host
 * memory (build/Release/test-fakes/sapipe_test_plugin_host_memory.so, named by SAPIPE_CUDA_PLUGIN,
 * as test/cuda/emulated.test.ts runs the device tests). That fake's NCCL has one rank, so the run
 * end to end is `--device cuda:0 --workers 1`, in every mode, against the same run on the CPU (the
 * GPT and the CNN: test/demo/demo-device-models.test.ts); the
 * refusals (more workers than GPUs, options the GPU path does not offer, bad device strings) are
 * checked with their codes, and `sapipe info` says where the demo would run. Several GPUs need a
 * machine with them: docs/cuda.md, "GPU checks still owed", item 9.
 */
import { execFile } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import t from 'tap';

const root = fileURLToPath(new URL('../..', import.meta.url));
const bin = join(root, 'bin/sapipe.js');
const hostMemory = join(root, 'build/Release/test-fakes/sapipe_test_plugin_host_memory.so');
const missing = join(root, 'no/such/dir/sapipe_cuda.so');
const skip = !existsSync(hostMemory) && `${hostMemory} is missing (npm run build:native)`;
// The in-process checks below resolve devices through this plugin (read when the addon first opens it).
process.env.SAPIPE_CUDA_PLUGIN = hostMemory;

function sapipe(args: string[], plugin = hostMemory): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(process.execPath, [bin, ...args], { env: { ...process.env, SAPIPE_CUDA_PLUGIN: plugin }, maxBuffer: 1 << 24, timeout: 60_000 }, (error, stdout, stderr) => {
      resolve({ code: error ? (typeof error.code === 'number' ? error.code : -1) : 0, stdout, stderr });
    });
  });
}

interface DemoJson {
  config: { workers: number; device: { kind: string; ranks: string[]; reason: string } };
  modes: { mode: string; epochAccuracy: number[]; finalAccuracy: number; steps: number; samplesPerSec: number; exposedCommMs: number }[];
  report: string;
}

// Every mode the GPU path runs, sapipe-wp with delay compensation among them; small enough for a
// few seconds: 2 epochs of 128 samples, batches of 32 (4 steps an epoch).
const MODES = 'sync,pipe-sgd,sapipe-dc,sapipe-wp,sapipe-wp:prev-sync+dc';
const small = ['--workers', '1', '--modes', MODES, '--epochs', '2', '--train-samples', '128', '--seed', '3', '--json'];

t.test('--device cuda:0 --workers 1 trains every mode as the CPU does, and says where it ran', { skip }, async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'sapipe-demo-device-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const [gpuRun, cpuRun, text] = await Promise.all([
    sapipe(['demo', '--device', 'cuda:0', ...small, '--report', join(dir, 'gpu.html')]),
    sapipe(['demo', '--device', 'cpu', ...small, '--report', join(dir, 'cpu.html')]),
    sapipe(['demo', '--device', 'cuda', '--modes', 'sync', '--epochs', '1', '--train-samples', '64', '--report', join(dir, 'text.html')]),
  ]);
  t.equal(gpuRun.code, 0, gpuRun.stderr);
  t.equal(cpuRun.code, 0, cpuRun.stderr);
  const gpu = JSON.parse(gpuRun.stdout) as DemoJson;
  const cpu = JSON.parse(cpuRun.stdout) as DemoJson;
  t.same(gpu.config.device, { kind: 'cuda', ranks: ['cuda:0'], reason: 'asked for' }, 'the JSON names the GPU and why');
  t.same(cpu.config.device, { kind: 'cpu', ranks: [], reason: 'asked for' });
  t.same(gpu.modes.map((m) => m.mode), MODES.split(','));
  for (const [i, g] of gpu.modes.entries()) {
    const c = cpu.modes[i]!;
    // On this plugin device memory is host memory and its kernels compute as the CPU's do, the
    // one rank's all-reduce is the identity, and the seed fixes the weights and the shuffles:
    // the two runs take the same steps to the same weights, so their accuracies agree exactly.
    // (On a GPU, cuBLAS's order of summation differs by a few ulps per operation.)
    t.same(g.epochAccuracy, c.epochAccuracy, `${g.mode}: the same accuracy after every epoch on cuda:0 as on the CPU (${g.epochAccuracy.join(', ')})`);
    t.equal(g.steps, c.steps, `${g.mode}: the same steps`);
    t.ok(g.samplesPerSec > 0 && g.exposedCommMs >= 0, `${g.mode}: timed`);
  }
  // 8 steps of 32 digits: far above the 10 % of guessing, short of a trained model.
  t.ok(gpu.modes[0]!.finalAccuracy > 0.3, `sync learns on the device (${gpu.modes[0]!.finalAccuracy})`);
  const html = readFileSync(gpu.report, 'utf8');
  t.match(html, /<th>device<\/th><td>worker 0 on cuda:0 \(asked for\)<\/td>/, 'the report says where the worker ran');
  t.match(html, /Communication: NCCL between cuda:0/);

  t.equal(text.code, 0, text.stderr);
  t.match(text.stdout, /^device: worker 0 on cuda:0 \(asked for; --workers not given: one worker per usable GPU \(1\)\)$/m, '--workers not given: one per usable GPU, and the output says so');
  t.match(text.stdout, /1 workers x batch 32, .*communication: NCCL/);
  t.match(text.stdout, /On a GPU the forward and backward are enqueued without waiting/, 'the footnote says how to read the exposed communication there');
});

t.test('--device auto: the GPUs where the plugin can run models, else the CPU with the reason', { skip }, async (t) => {
  const args = ['demo', '--device', 'auto', '--modes', 'sync', '--epochs', '1', '--train-samples', '64', '--json', '--report', join(tmpdir(), `sapipe-demo-auto-${process.pid}.html`)];
  t.teardown(() => rmSync(join(tmpdir(), `sapipe-demo-auto-${process.pid}.html`), { force: true }));
  const [onGpu, onCpu] = await Promise.all([sapipe(args), sapipe([...args, '--workers', '2'], missing)]);
  t.equal(onGpu.code, 0, onGpu.stderr);
  const gpu = JSON.parse(onGpu.stdout) as DemoJson;
  t.same(gpu.config.device.ranks, ['cuda:0']);
  t.equal(gpu.config.workers, 1);
  t.match(gpu.config.device.reason, /^--device auto: cuda:0 \(host memory .*\) is usable; --workers not given: one worker per usable GPU \(1\)$/);
  t.equal(onCpu.code, 0, onCpu.stderr);
  const cpu = JSON.parse(onCpu.stdout) as DemoJson;
  t.equal(cpu.config.device.kind, 'cpu');
  t.equal(cpu.config.workers, 2, 'on the CPU --workers is threads, as before');
  t.match(cpu.config.device.reason, /^--device auto: no usable CUDA: .*no\/such\/dir\/sapipe_cuda\.so/);
});

t.test('refusals: typed errors with their codes, saying what to pass', { skip }, async (t) => {
  const { demoConfigFromCli } = await import('../../dist/apps/cli/commands/demo.js');
  const base = { model: 'mlp', modes: 'sync', epochs: '1', batch: '32', lr: '0.05', momentum: '0.9', seed: '1', report: 'r.html', schedules: '', stages: '2' };
  const cli = (extra: Record<string, unknown>) => demoConfigFromCli({ ...base, ...extra } as Parameters<typeof demoConfigFromCli>[0]);
  const failure = (extra: Record<string, unknown>): { code?: string; message: string } => {
    try {
      cli(extra);
    } catch (error) {
      return error as { code?: string; message: string };
    }
    throw new Error(`${JSON.stringify(extra)} was accepted`);
  };
  t.same(cli({ device: 'cuda:0' }).device?.ranks, ['cuda:0'], '--device cuda:0: one worker on it');
  t.equal(cli({ device: 'cuda:0' }).workers, 1);
  t.equal(cli({ device: 'cuda' }).workers, 1, '--device cuda: one worker per usable GPU (the fake has one)');
  t.equal(cli({}).workers, 4, 'no --device: the CPU and its 4 threads, as before');
  t.equal(cli({ device: 'cpu', workers: '3' }).device?.kind, 'cpu');

  const cases: [Record<string, unknown>, string, RegExp][] = [
    [{ device: 'cuda:0', workers: '2' }, 'ERR_INVALID_ARGUMENT', /NCCL cannot put two ranks on one GPU: pass --workers 1, or --device cuda .*or --device cpu for 2 workers/],
    [{ device: 'cuda', workers: '2' }, 'ERR_INVALID_ARGUMENT', /^--workers 2 needs 2 GPUs .*1 is usable here \(cuda:0\): pass --workers 1, or --device cpu/],
    [{ device: 'auto', workers: '4' }, 'ERR_INVALID_ARGUMENT', /^--workers 4 needs 4 GPUs/],
    [{ device: 'gpu' }, 'ERR_INVALID_ARGUMENT', /^--device must be one of cpu, cuda:N, cuda or auto, got the string "gpu"$/],
    [{ device: 'cuda:x' }, 'ERR_INVALID_ARGUMENT', /^--device must be one of/],
    [{ device: 'CUDA:0' }, 'ERR_INVALID_ARGUMENT', /^--device must be one of/],
    [{ device: '' }, 'ERR_INVALID_ARGUMENT', /^--device must be one of/],
    [{ device: 'cuda:3' }, 'ERR_BACKEND_UNAVAILABLE', /^--device cuda:3: cuda:3 does not exist: 1 CUDA device\(s\) visible; pass --device cuda:0, or --device cpu$/],
    [{ device: 'cuda:0', topk: '0.1' }, 'ERR_INVALID_ARGUMENT', /^--topk is not offered with --device cuda:0: .*leave --topk out, or use --device cpu$/],
    [{ device: 'cuda:0', gbps: '1' }, 'ERR_INVALID_ARGUMENT', /^--gbps and --latency-us are not offered with --device cuda:0/],
    [{ device: 'cuda:0', overlap: false }, 'ERR_INVALID_ARGUMENT', /^--no-overlap is not offered with --device cuda:0/],
    [{ device: 'cuda:0', modes: 'sapipe-wp:local' }, 'ERR_INVALID_ARGUMENT', /^--modes: sapipe-wp:local is not offered with --device cuda:0: .*use sapipe-wp \(estimate prev-sync\)/],
    [{ device: 'cuda:0', modes: 'sync,sapipe-wp:local-prev-sync+dc' }, 'ERR_INVALID_ARGUMENT', /sapipe-wp:local-prev-sync\+dc is not offered .*or sapipe-wp:prev-sync\+dc/],
  ];
  for (const [extra, code, message] of cases) {
    const e = failure(extra);
    t.equal(e.code, code, `${JSON.stringify(extra)}: ${e.message}`);
    t.match(e.message, message, JSON.stringify(extra));
  }

  // runDemo's own check of a device it is handed (the API, not the command line).
  const { checkDemoConfig, parseModes } = await import('../../dist/apps/demo/config.js');
  const config = { workers: 1, modes: parseModes('sync'), epochs: 1, batch: 32, lr: 0.05, momentum: 0.9, seed: 1, trainSamples: undefined, emulate: undefined, lambda: undefined, dcKind: undefined };
  for (const [device, workers, message] of [
    [{ kind: 'cuda', ranks: ['gpu0'], reason: '' }, 1, /"cpu" or "cuda:N"/],
    [{ kind: 'cuda', ranks: ['cuda:0', 'cuda:0'], reason: '' }, 2, /the workers' GPUs must differ/],
    [{ kind: 'cuda', ranks: ['cuda:0'], reason: '' }, 2, /1 GPU\(s\) for 2 workers/],
    [{ kind: 'tpu', ranks: [] }, 1, /a resolved demo device/],
    [null, 1, /a resolved demo device/],
  ] as const) {
    let error: { code?: string; message?: string } | undefined;
    try {
      checkDemoConfig({ ...config, workers, device: device as never });
    } catch (e) {
      error = e as typeof error;
    }
    t.equal(error?.code, 'ERR_INVALID_ARGUMENT', `${JSON.stringify(device)}: ${error?.message}`);
    t.match(error?.message, message);
  }

  // Through the command: the code is printed, the exit code is 1, and nothing trains.
  const command: [string[], RegExp][] = [
    [['--device', 'cuda', '--workers', '2'], /^ERR_INVALID_ARGUMENT: --workers 2 needs 2 GPUs/],
    [['--device', 'cuda:0', '--tfjs'], /^ERR_INVALID_ARGUMENT: --device cuda:0 is not offered with --tfjs: .*leave --device out/],
    [['--device', 'cuda:0', '--profile-out', 'p.json'], /^ERR_INVALID_ARGUMENT: --profile-out is not offered with a GPU --device/],
  ];
  const [absent, ...results] = await Promise.all([sapipe(['demo', '--device', 'cuda:0'], missing), ...command.map(([args]) => sapipe(['demo', ...args]))]);
  for (const [i, [args, message]] of command.entries()) {
    t.equal(results[i]!.code, 1, `${args.join(' ')}: exit code 1`);
    t.match(results[i]!.stderr, message, args.join(' '));
  }
  t.match(absent.stderr, /^ERR_BACKEND_UNAVAILABLE: --device cuda:0: cuda:0 is unavailable: .*no\/such\/dir\/sapipe_cuda\.so; pass --device cpu/, 'no plugin: unavailable, with the reason');
});

t.test('sapipe info says where the demo and train pipeline would run', { skip }, async (t) => {
  const [gpu, text, none] = await Promise.all([sapipe(['info', '--json']), sapipe(['info']), sapipe(['info', '--json'], missing)]);
  t.equal(gpu.code, 0, gpu.stderr);
  const devices = (JSON.parse(gpu.stdout) as { devices: { command: string; device: string; why: string; auto?: string }[] }).devices;
  const demo = devices.find((d) => d.command === 'demo')!;
  t.equal(demo.device, 'cpu', 'the default --device');
  t.match(demo.why, /--device cuda:N, cuda or auto puts each worker on a GPU of its own, over NCCL/);
  t.match(demo.auto, /^cuda:0, one worker each \(cuda:0 \(host memory .*\) is usable; --workers not given: one worker per usable GPU \(1\)\)$/);
  t.match(devices.find((d) => d.command === 'train pipeline')!.auto, /^cuda:0 \(/);
  t.match(text.stdout.replace(/\s+/g, ' '), /demo cpu \(the default --device: .*\); --device auto: cuda:0, one worker each/);
  const without = (JSON.parse(none.stdout) as { devices: { command: string; auto?: string }[] }).devices.find((d) => d.command === 'demo')!;
  t.match(without.auto, /^cpu \(no usable GPU/, 'no plugin: the demo stays on the CPU');
});
