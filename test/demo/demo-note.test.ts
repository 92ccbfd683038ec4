/**
 * The demo says what it measured: its note follows the speedups of the run (it used to say the
 * pipelined modes "need not be faster" beside a 1.72x speedup), and its help states the defaults
 * the demo really uses (it used to call elementwise the default form while the trainer's is adaptive).
 */
import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import t from 'tap';

import { DEFAULT_ADAPTIVE_DC_LAMBDA, DEFAULT_DC_KIND, DEFAULT_ELEMENTWISE_DC_LAMBDA } from '../../dist/dataparallel/mode.js';
import { renderDemoReport } from '../../dist/apps/demo/report.js';
import { speedupNote, type DemoResult } from '../../dist/apps/demo/run-demo.js';

function resultWith(speedups: Record<string, number>, emulate = false, gpus: string[] = []): DemoResult {
  const modes = Object.entries({ sync: 1, ...speedups }).map(([mode, speedup]) => ({
    mode,
    speedup: mode === 'sync' ? 1 : speedup,
    epochAccuracy: [0.9],
    finalAccuracy: 0.9,
    wallMs: 1000 / speedup,
    samplesPerSec: 100,
    exposedCommMs: 10,
    stepMs: { compute: 1, comm: 0.1 },
    loopStepMs: 1,
    steps: 10,
  }));
  return {
    config: { workers: 2, epochs: 1, batch: 32, lr: 0.05, momentum: 0.9, seed: 1, layers: [784, 128, 10], trainSamples: 100, testSamples: 10, modes: Object.keys(speedups), ...(emulate ? { emulate: { gbps: 1 } } : {}),
      device: gpus.length === 0 ? { kind: 'cpu', ranks: [], reason: 'the default --device' } : { kind: 'cuda', ranks: gpus, reason: 'asked for' } },
    modes,
  } as unknown as DemoResult;
}

t.test('the note follows the measured speedups', async (t) => {
  t.match(speedupNote(resultWith({ 'pipe-sgd': 1.2, 'sapipe-wp': 1.72 })), /fastest staleness-1 mode \(sapipe-wp\) ran 1\.72x as fast as sync/);
  t.notMatch(speedupNote(resultWith({ 'sapipe-wp': 1.72 })), /need not be faster|little communication/);
  t.match(speedupNote(resultWith({ 'pipe-sgd': 1.02, 'sapipe-dc': 0.97 })), /about as fast as sync here \(best pipe-sgd, 1\.02x\).*--gbps 1/);
  t.match(speedupNote(resultWith({ 'pipe-sgd': 0.7 })), /slower than sync here \(best pipe-sgd, 0\.70x\)/);
  t.notMatch(speedupNote(resultWith({ 'pipe-sgd': 1.0 }, true)), /--gbps/, 'no advice to emulate a network when one was emulated');
  t.match(renderDemoReport(resultWith({ 'sapipe-wp': 1.72 })), /ran 1\.72x as fast as sync/, 'the report carries the same note');
  const gpu = speedupNote(resultWith({ 'pipe-sgd': 1.0 }, false, ['cuda:0', 'cuda:1']));
  t.match(gpu, /with NCCL on cuda:0, cuda:1 there was little/, 'on GPUs the note names NCCL and the GPUs');
  t.notMatch(gpu, /--gbps/, 'and does not advise an emulated network, which the GPU path does not offer');
});

t.test('the report says where the workers ran', async (t) => {
  const cpu = renderDemoReport(resultWith({ 'sapipe-wp': 1.2 }));
  t.match(cpu, /<th>device<\/th><td>cpu \(every worker a thread\) \(the default --device\)<\/td>/);
  t.match(cpu, /Device: cpu\. Communication: local shared memory/);
  const gpu = renderDemoReport(resultWith({ 'sapipe-wp': 1.2 }, false, ['cuda:0', 'cuda:1']));
  t.match(gpu, /<th>device<\/th><td>worker 0 on cuda:0, worker 1 on cuda:1 \(asked for\)<\/td>/);
  t.match(gpu, /Device: cuda:0, cuda:1\. Communication: NCCL between cuda:0, cuda:1\./);
  t.match(gpu, /On a GPU the forward and backward are enqueued without waiting .*can hold some of their compute as well\./, 'how to read the exposed communication on a GPU');
  t.notMatch(cpu, /On a GPU/, 'not on the CPU');
});

t.test('demo --help states the defaults the demo uses', async (t) => {
  const bin = fileURLToPath(new URL('../../bin/sapipe.js', import.meta.url));
  const { stdout } = await promisify(execFile)(process.execPath, [bin, 'demo', '--help']);
  const help = stdout.replace(/\s+/g, ' ');
  t.match(help, new RegExp(`--dc-kind <kind> delay-compensation form: ${DEFAULT_DC_KIND} \\(default`));
  t.notMatch(help, /elementwise \(default\)/);
  t.match(help, new RegExp(`default: ${DEFAULT_ADAPTIVE_DC_LAMBDA} for adaptive, ${DEFAULT_ELEMENTWISE_DC_LAMBDA} for elementwise`));
});

t.test("the step chart's legend: the second swatch starts after the first label (it ran into it)", async (t) => {
  const html = renderDemoReport(resultWith({ 'sapipe-wp': 1.2 }));
  const legend = /<rect x="(\d+)" y="\d+" width="12" height="12" fill="#4c78a8"\/><text x="(\d+)" y="\d+">compute \(forward, backward, update\)<\/text><rect x="(\d+)"/.exec(html);
  t.ok(legend, 'the legend is drawn');
  const labelEnd = Number(legend![2]) + 'compute (forward, backward, update)'.length * 7; // 12 px sans-serif: at most ~7 px a character
  t.ok(Number(legend![3]) > labelEnd, `the second swatch at x=${legend![3]} starts after the first label ends (about x=${labelEnd})`);
});

t.test('demo --help says which options --tfjs does not take', async (t) => {
  const bin = fileURLToPath(new URL('../../bin/sapipe.js', import.meta.url));
  const { stdout } = await promisify(execFile)(process.execPath, [bin, 'demo', '--help']);
  const flat = stdout.replace(/\s+/g, ' ');
  t.match(flat, /--report <file> where to write the HTML report \(not with --tfjs/);
  t.match(flat, /--profile-out <file> .*\(not with --tfjs\)/);
  t.match(flat, /--device <where> where the workers compute, one of cpu, cuda:N, cuda or auto/);
  t.match(flat, /A GPU run trains every --model with the dense exchange \(not --topk, --gbps, --no-overlap, the local sapipe-wp estimates, --profile-out or --tfjs\)/);
});
