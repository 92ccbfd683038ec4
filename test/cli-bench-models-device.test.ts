/**
 * `sapipe bench models --device`: the sapipe side on a CUDA device, here the CUDA plugin over host
 * memory (build/Release/test-fakes/sapipe_test_plugin_host_memory.so, as test/cuda/emulated.test.ts
 * runs the device tests), named by SAPIPE_CUDA_PLUGIN; `--device auto`'s choice and reason; the
 * typed errors for a device no plugin can serve, a device that does not exist, a bad device
 * string, and a PyTorch that cannot use CUDA (a stand-in torch package whose CUDA is absent). The
 * PyTorch side on a GPU needs a GPU and a CUDA build of torch: docs/cuda.md, "GPU checks still
 * owed", item 8.
 */
import { execFile } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import t from 'tap';

const root = fileURLToPath(new URL('..', import.meta.url));
const bin = path.join(root, 'bin/sapipe.js');
const hostMemory = path.join(root, 'build/Release/test-fakes/sapipe_test_plugin_host_memory.so');
const missing = path.join(root, 'no/such/dir/sapipe_cuda.so');
const finitePositive = (x: unknown): boolean => typeof x === 'number' && Number.isFinite(x) && x > 0;

function sapipe(args: string[], env: NodeJS.ProcessEnv): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(process.execPath, [bin, ...args], { env: { ...process.env, ...env }, maxBuffer: 1 << 24 }, (error, stdout, stderr) => {
      const code = error ? (typeof error.code === 'number' ? error.code : -1) : 0;
      resolve({ code, stdout, stderr });
    });
  });
}

/** A tiny run: 1 step, 1 repeat, no warm-up, batch 2. */
const tiny = ['--steps', '1', '--reps', '1', '--warmup', '0', '--batch', '2'];

interface Result {
  device: string;
  deviceReason: string;
  deviceName?: string;
  gemm: { sapipe: { gflops: number; medianMs: number } };
  torch?: unknown;
  rows: { model: string; batch: number; sapipe: { medianMs: number; samples: number[] } }[];
}

t.test('--device cuda:0 --sapipe-only on the CUDA plugin over host memory: the device and positive times', { skip: !existsSync(hostMemory) && `${hostMemory} is missing (npm run build:native)` }, async (t) => {
  const r = await sapipe(['bench', 'models', '--device', 'cuda:0', '--sapipe-only', '--models', 'mlp,gpt', ...tiny, '--json'], { SAPIPE_CUDA_PLUGIN: hostMemory });
  t.equal(r.code, 0, r.stderr);
  const result = JSON.parse(r.stdout) as Result;
  t.equal(result.device, 'cuda:0', 'the JSON names the device');
  t.equal(result.deviceReason, 'asked for');
  t.match(result.deviceName, /host memory/, "the device's name, as the plugin gives it");
  t.equal(result.torch, undefined, 'no PyTorch side');
  t.same(result.rows.map((x) => x.model), ['mlp', 'gpt']);
  for (const row of result.rows) {
    t.equal(row.batch, 2);
    t.ok(finitePositive(row.sapipe.medianMs), `${row.model}: ms/step on the device`);
    t.equal(row.sapipe.samples.length, 1);
  }
  t.ok(finitePositive(result.gemm.sapipe.gflops), "sgemm's rate on the device");

  const text = await sapipe(['bench', 'models', '--device', 'cuda:0', '--sapipe-only', '--models', 'cnn', ...tiny], { SAPIPE_CUDA_PLUGIN: hostMemory });
  t.equal(text.code, 0, text.stderr);
  t.match(text.stdout, /^one training step .* on cuda:0 \(host memory/, 'the header says where it ran');
  t.match(text.stdout, /^sapipe on cuda:0: .*DeviceParamSet/m, "sapipe's side says it ran on the device");
  t.match(text.stdout, /^PyTorch: not run \(--sapipe-only\)/m);
});

t.test('--device auto: cuda:0 where the plugin can run models, else the CPU, with the reason', { skip: !existsSync(hostMemory) && `${hostMemory} is missing` }, async (t) => {
  const args = ['bench', 'models', '--device', 'auto', '--sapipe-only', '--models', 'mlp', ...tiny, '--json'];
  const gpu = JSON.parse((await sapipe(args, { SAPIPE_CUDA_PLUGIN: hostMemory })).stdout) as Result;
  t.equal(gpu.device, 'cuda:0');
  t.match(gpu.deviceReason, /^cuda:0 \(host memory .*\) is usable/);
  const cpu = JSON.parse((await sapipe(args, { SAPIPE_CUDA_PLUGIN: missing })).stdout) as Result;
  t.equal(cpu.device, 'cpu');
  t.match(cpu.deviceReason, /^no usable CUDA: .*no\/such\/dir\/sapipe_cuda\.so/);
  t.equal(cpu.deviceName, undefined);
});

t.test('an unusable device is a typed error that says what to do', async (t) => {
  const r = await sapipe(['bench', 'models', '--device', 'cuda:0', '--sapipe-only', '--models', 'mlp', ...tiny], { SAPIPE_CUDA_PLUGIN: missing });
  t.equal(r.code, 1, 'exit code 1, not a crash');
  t.match(r.stderr, /^ERR_BACKEND_UNAVAILABLE: bench models: cuda:0 is unavailable: .*looked for .*no\/such\/dir\/sapipe_cuda\.so/);
  t.match(r.stderr, /npx sapipe info/, 'where to look');
  t.match(r.stderr, /--device cpu/, 'how to time the CPU instead');
  if (existsSync(hostMemory)) {
    const absent = await sapipe(['bench', 'models', '--device', 'cuda:3', '--sapipe-only', '--models', 'mlp', ...tiny], { SAPIPE_CUDA_PLUGIN: hostMemory });
    t.equal(absent.code, 1);
    t.match(absent.stderr, /^ERR_BACKEND_UNAVAILABLE: bench models: cuda:3 does not exist: 1 CUDA device\(s\) visible/);
  }
});

t.test('a bad device string is a typed invalid argument', async (t) => {
  const r = await sapipe(['bench', 'models', '--device', 'gpu', '--sapipe-only', '--models', 'mlp', ...tiny], {});
  t.equal(r.code, 1);
  t.match(r.stderr, /^ERR_INVALID_ARGUMENT: device must be "cpu" or "cuda:N"/);
});

t.test('a PyTorch without CUDA is refused for a device run, saying what to install', { skip: !existsSync(hostMemory) && `${hostMemory} is missing` }, async (t) => {
  // A stand-in torch package, first on the path: it imports, but sees no CUDA device.
  const dir = mkdtempSync(path.join(tmpdir(), 'sapipe-cpu-torch-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  mkdirSync(path.join(dir, 'torch'));
  writeFileSync(
    path.join(dir, 'torch', '__init__.py'),
    [
      '__version__ = "0.0-cpu-stand-in"',
      'class version:',
      '    cuda = None',
      'class cuda:',
      '    is_available = staticmethod(lambda: False)',
      '    device_count = staticmethod(lambda: 0)',
      'class device:',
      '    def __init__(self, name, index=None):',
      '        self.type, _, i = name.partition(":")',
      '        self.index = int(i) if i else index',
      'set_num_threads = lambda n: None',
      '',
    ].join('\n'),
  );
  const r = await sapipe(['bench', 'models', '--device', 'cuda:0', '--models', 'mlp', ...tiny, '--python', 'python3'], { SAPIPE_CUDA_PLUGIN: hostMemory, PYTHONPATH: dir });
  t.equal(r.code, 1, r.stdout);
  t.match(r.stderr, /^ERR_BACKEND_UNAVAILABLE: bench models: PyTorch with CUDA is not available for cuda:0; tried python3 \(cuda:0: torch 0\.0-cpu-stand-in cannot use CUDA/);
  t.match(r.stderr, /CUDA build of torch/, 'what to install');
  t.match(r.stderr, /--sapipe-only/, 'how to time sapipe alone');
});
