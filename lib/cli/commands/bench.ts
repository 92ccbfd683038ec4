import { SingleBar } from 'cli-progress';
import Table from 'cli-table3';
import type { Command } from 'commander';

import { benchCudaKernels } from '../../bench/cuda-kernels.js';
import { benchKernels } from '../../bench/kernels.js';
import { benchStepOverhead } from '../../bench/step-overhead.js';
import { SapipeError } from '../../errors.js';
import { formatCount, parseCount, parsePositiveInt } from '../parse.js';

interface KernelsOptions {
  size: number;
  threads?: number;
  reps: number;
  warmup: number;
  filter?: string;
  json?: boolean;
  device: string;
}

/** The thread pool reads SAPIPE_NUM_THREADS when the addon first runs a kernel: set it before. */
function applyThreads(threads: number | undefined): void {
  if (threads !== undefined) process.env.SAPIPE_NUM_THREADS = String(threads);
}

function progressBar(enabled: boolean): { update: (done: number, total: number, label: string) => void; stop: () => void } {
  if (!enabled || !process.stderr.isTTY) return { update: () => {}, stop: () => {} };
  const bar = new SingleBar({ format: '{bar} {value}/{total} {label}', stream: process.stderr, hideCursor: true, clearOnComplete: true });
  let started = false;
  return {
    update(done, total, label) {
      if (!started) {
        bar.start(total, done, { label });
        started = true;
      } else bar.update(done, { label });
    },
    stop: () => bar.stop(),
  };
}

/** --device cuda:N: the same variants on the GPU, against a device-to-device copy. */
function runCudaKernels(options: KernelsOptions): void {
  const result = benchCudaKernels({
    device: options.device,
    elements: options.size,
    reps: options.reps,
    warmup: options.warmup,
    ...(options.filter !== undefined ? { filter: options.filter } : {}),
  });
  if (options.json) {
    console.log(JSON.stringify(result, null, 2));
    return;
  }
  console.log(`fused update kernels on ${result.device} (${result.deviceName}): ${formatCount(result.elements)} fp32 elements, median of ${options.reps} runs after ${options.warmup} warm-up`);
  console.log(`device-to-device copy (8 B/element): ${result.copy.gbps.toFixed(1)} GB/s`);
  const table = new Table({
    head: ['kernel', 'B/elem', 'median ms', 'GB/s', 'x copy', 'with guard ms', 'x copy'],
    ...(!process.stdout.isTTY ? { style: { head: [], border: [] } } : {}),
  });
  for (const r of result.rows)
    table.push([r.name, r.bytesPerElement, r.medianMs.toFixed(3), r.gbps.toFixed(1), r.ratioToCopy.toFixed(3), r.guardedMs.toFixed(3), r.guardedRatioToCopy.toFixed(3)]);
  console.log(table.toString());
}

function runKernels(options: KernelsOptions): void {
  if (options.device !== 'cpu') {
    // Unavailable devices fail with the error's code and reason (ERR_BACKEND_UNAVAILABLE: ...).
    try {
      runCudaKernels(options);
    } catch (error) {
      if (!(error instanceof SapipeError)) throw error;
      console.error(`${error.code}: ${error.message}`);
      process.exitCode = 1;
    }
    return;
  }
  applyThreads(options.threads);
  const bar = progressBar(!options.json);
  const benchOptions = {
    elements: options.size,
    reps: options.reps,
    warmup: options.warmup,
    onProgress: bar.update,
    ...(options.filter !== undefined ? { filter: options.filter } : {}),
  };
  let result;
  try {
    result = benchKernels(benchOptions);
  } finally {
    bar.stop();
  }
  if (options.json) {
    console.log(JSON.stringify(result, null, 2));
    return;
  }
  console.log(
    `fused update kernels: ${formatCount(result.elements)} fp32 elements, ${result.threads} thread(s), simd ${result.simd}, ` +
      `median of ${options.reps} runs after ${options.warmup} warm-up`,
  );
  console.log(`triad a[i] = b[i] + s*c[i] on doubles (STREAM, 24 B/element): ${result.triad.medianMs.toFixed(3)} ms, ${result.triad.gbps.toFixed(2)} GB/s`);
  const plain = !process.stdout.isTTY;
  const table = new Table({
    head: ['kernel', 'B/elem', 'median ms', 'GB/s', 'x triad', 'with guard ms', 'x triad'],
    ...(plain ? { style: { head: [], border: [] } } : {}),
  });
  for (const r of result.rows)
    table.push([
      r.name,
      r.bytesPerElement,
      r.medianMs.toFixed(3),
      r.gbps.toFixed(2),
      r.ratioToTriad.toFixed(3),
      r.guardedMs.toFixed(3),
      r.guardedRatioToTriad.toFixed(3),
    ]);
  console.log(table.toString());
  if (result.rows.length) {
    const lowest = (key: 'ratioToTriad' | 'guardedRatioToTriad'): string =>
      result.rows.reduce((a, r) => Math.min(a, r[key]), Infinity).toFixed(3);
    console.log(`lowest ratio to triad: fused kernel ${lowest('ratioToTriad')}, standalone step with the guard's scan ${lowest('guardedRatioToTriad')}`);
    console.log('(the guard reads the gradients once more before writing anything; sapipe\'s reductions count non-finite values as they write, so steps on their output skip that read)');
  }
}

export function registerBenchCommand(program: Command): void {
  const bench = program.command('bench').description('microbenchmarks of the native kernels');
  bench
    .command('kernels')
    .description('time every fused update variant and compare it with a triad kernel measured in the same run')
    .option('--size <n>', 'elements per buffer (e.g. 1M, 16M)', parseCount, 16 << 20)
    .option('--threads <t>', 'worker threads (default: all cores; SAPIPE_NUM_THREADS)', parsePositiveInt)
    .option('--reps <n>', 'measured runs per kernel', parsePositiveInt, 15)
    .option('--warmup <n>', 'unmeasured runs before measuring', parsePositiveInt, 3)
    .option('--filter <text>', 'only variants whose name contains this')
    .option('--json', 'print JSON instead of a table')
    .option('--device <device>', 'cpu, or cuda:N for the GPU kernels of the CUDA plugin', 'cpu')
    .action((options: KernelsOptions) => runKernels(options));
  bench
    .command('step-overhead')
    .description('compare the asynchronous optimizer.step() with stepSync() on one Adam ParamSet')
    .option('--size <n>', 'parameters', parseCount, 1 << 20)
    .option('--threads <t>', 'worker threads', parsePositiveInt)
    .option('--reps <n>', 'measured pairs of steps', parsePositiveInt, 200)
    .option('--json', 'print JSON')
    .action(async (options: { size: number; threads?: number; reps: number; json?: boolean }) => {
      applyThreads(options.threads);
      const r = await benchStepOverhead(options.size, options.reps, 20);
      if (options.json) {
        console.log(JSON.stringify(r, null, 2));
        return;
      }
      console.log(
        `Adam step on ${formatCount(r.elements)} parameters: stepSync ${r.syncMs.toFixed(3)} ms, step() ${r.asyncMs.toFixed(3)} ms, ` +
          `async overhead ${(r.overhead * 100).toFixed(1)}% (median of ${options.reps} interleaved pairs)`,
      );
    });
}
