import { SingleBar } from 'cli-progress';
import Table from 'cli-table3';
import type { Command } from 'commander';

import { benchKernels } from '../../bench/kernels.js';
import { benchStepOverhead } from '../../bench/step-overhead.js';
import { formatCount, parseCount, parsePositiveInt } from '../parse.js';

interface KernelsOptions {
  size: number;
  threads?: number;
  reps: number;
  warmup: number;
  filter?: string;
  json?: boolean;
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

function runKernels(options: KernelsOptions): void {
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
