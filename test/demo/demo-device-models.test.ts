/**
 * `sapipe demo --device cuda:0 --model gpt|cnn`: the GPT and the CNN trained by a worker on the
 * CUDA plugin over host memory (as test/demo/demo-device.test.ts runs the MLP), against the same
 * runs on the CPU. Slow (test/slow-tests.txt): four demo runs, and the CNN's evaluation covers
 * Fashion-MNIST's 10 000 test images after every epoch.
 */
import { execFile } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import t from 'tap';

const root = fileURLToPath(new URL('../..', import.meta.url));
const bin = join(root, 'bin/sapipe.js');
const hostMemory = join(root, 'build/Release/test-fakes/sapipe_test_plugin_host_memory.so');
const skip = !existsSync(hostMemory) && `${hostMemory} is missing (npm run build:native)`;

function sapipe(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(process.execPath, [bin, ...args], { env: { ...process.env, SAPIPE_CUDA_PLUGIN: hostMemory }, maxBuffer: 1 << 24, timeout: 120_000 }, (error, stdout, stderr) => {
      resolve({ code: error ? (typeof error.code === 'number' ? error.code : -1) : 0, stdout, stderr });
    });
  });
}

interface DemoJson {
  config: { device: { ranks: string[] } };
  modes: { mode: string; epochAccuracy: number[]; epochLoss: number[] }[];
}

t.test('--model gpt and --model cnn on cuda:0: the same accuracies as on the CPU, the losses within float rounding', { skip }, async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'sapipe-demo-device-models-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const runs = ['gpt', 'cnn'].flatMap((model) =>
    ['cuda:0', 'cpu'].map((device) =>
      sapipe(['demo', '--device', device, '--model', model, '--workers', '1', '--modes', 'sync,sapipe-wp', '--epochs', '1', '--train-samples', '64', '--json', '--report', join(dir, `${model}-${device}.html`)]),
    ),
  );
  const [gptGpu, gptCpu, cnnGpu, cnnCpu] = await Promise.all(runs);
  for (const [model, gpuRun, cpuRun] of [['gpt', gptGpu!, gptCpu!], ['cnn', cnnGpu!, cnnCpu!]] as const) {
    t.equal(gpuRun.code, 0, gpuRun.stderr);
    t.equal(cpuRun.code, 0, cpuRun.stderr);
    const gpu = JSON.parse(gpuRun.stdout) as DemoJson;
    const cpu = JSON.parse(cpuRun.stdout) as DemoJson;
    t.same(gpu.config.device.ranks, ['cuda:0'], `${model}: on the device`);
    for (const [i, g] of gpu.modes.entries()) {
      const c = cpu.modes[i]!;
      // Training takes the same steps as on the CPU (the plugin's arithmetic is the CPU's, and
      // the device's softmax cross-entropy gradient rounds as the host's does), so the accuracies
      // agree exactly; the test loss is summed in float on the device and in double on the host,
      // so it agrees to float rounding (1e-6 relative).
      t.same(g.epochAccuracy, c.epochAccuracy, `${model} ${g.mode}: the same test accuracy (${g.epochAccuracy.join(', ')})`);
      const worst = Math.max(...g.epochLoss.map((l, e) => Math.abs(l - c.epochLoss[e]!) / Math.abs(c.epochLoss[e]!)));
      t.ok(worst < 1e-6, `${model} ${g.mode}: test loss within 1e-6 relative (${worst.toExponential(2)})`);
    }
  }
});

