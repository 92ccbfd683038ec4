import { SingleBar } from 'cli-progress';
import { cliTable } from '../table.js';
import type { Command } from 'commander';

import { benchAllreduce } from '../../bench/allreduce.js';
import { benchCheckpoint } from '../../bench/checkpoint.js';
import { benchCpr } from '../../bench/cpr.js';
import { RECOVERY_POLICIES, type RecoveryPolicy } from '../../recsys/cpr.js';
import { benchCudaKernels } from '../../bench/cuda-kernels.js';
import { benchGemm } from '../../bench/gemm.js';
import { benchKernels } from '../../bench/kernels.js';
import { BENCH_MODEL_NAMES, benchModels, type ModelsBenchResult } from '../../bench/models.js';
import { benchOverlap } from '../../bench/overlap.js';
import { benchPipeline } from '../../bench/pipeline.js';
import { benchStepOverhead } from '../../bench/step-overhead.js';
import { benchTopk } from '../../bench/topk.js';
import { PIPELINE_DEMO_SIZES } from '../../demo/pipeline-run.js';
import { AVERAGING_LAYOUTS, RUNTIME_SCHEDULES, SapipeError, WAVELET_FORMS } from 'sapipe';
import { checkOneOf } from 'sapipe/validate';
import { availableParallelism } from 'node:os';
import { InvalidArgumentError } from 'commander';

import { formatCount, kernelThreadsOption, numberOption, parseCount, parseNonNegativeInt, parsePositiveInt } from '../parse.js';

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
  const table = cliTable(['kernel', 'B/elem', 'median ms', 'GB/s', 'x copy', 'with guard ms', 'x copy']);
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
  const table = cliTable(['kernel', 'B/elem', 'median ms', 'GB/s', 'x triad', 'with guard ms', 'x triad'], plain);
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

interface ModelsOptions {
  models: string;
  steps: number;
  reps: number;
  warmup: number;
  batch?: number;
  threads?: number;
  python?: string;
  torchScript?: string;
  openblasCoretype?: string;
  sapipeOnly?: boolean;
  device: string;
  quick?: boolean;
  json?: boolean;
}

const span = (s: { medianMs: number; minMs: number; maxMs: number }, digits = 2): string => `${s.medianMs.toFixed(digits)} (${s.minMs.toFixed(digits)}-${s.maxMs.toFixed(digits)})`;

function printModels(r: ModelsBenchResult): void {
  const load = (l: number[]): string => l.map((x) => x.toFixed(2)).join(' ');
  const onDevice = r.device !== 'cpu';
  const where = onDevice ? `on ${r.device} (${r.deviceName ?? '?'})` : 'on the CPU';
  console.log(
    `one training step (forward, softmax cross-entropy, backward, SGD momentum ${r.momentum}) ${where}: ${r.steps} steps per repeat, ${r.reps} repeats after ${r.warmup} warm-up step${r.warmup === 1 ? "" : "s"}` +
      (r.torch ? ', the two sides alternating (sapipe first on even repeats, PyTorch first on odd ones)' : ''),
  );
  console.log(`device: ${r.device} (${r.deviceReason})`);
  console.log(`machine: ${r.cpu}, ${r.cores} cores; load average ${load(r.loadAverage.before)} before, ${load(r.loadAverage.after)} after (others' work on a shared machine spreads the figures; the ratios, measured side by side, spread less)`);
  if (onDevice)
    console.log(
      `sapipe on ${r.device}: Sequential on the device, weights, gradients and SGD's momentum in a DeviceParamSet, the batch copied there once; ` +
        'each step waits for the device (the fused update runs to completion) and each timed block ends by reading a loss back',
    );
  else console.log(`sapipe on the CPU: ${r.threads} threads (native pool; SAPIPE_NUM_THREADS or --threads), simd ${r.simd}`);
  if (r.torch && r.torch.device !== undefined && r.torch.device !== 'cpu') {
    const t = r.torch;
    console.log(
      `PyTorch ${t.torch} eager on ${t.device} (${t.gpu ?? '?'}; ${t.python}, Python ${t.pythonVersion}): CUDA ${t.cuda ?? '?'}, ` +
        `TF32 ${t.tf32?.matmul ? 'ALLOWED' : 'off'} for matmuls (torch.backends.cuda.matmul.allow_tf32 = False) and ${t.tf32?.cudnn ? 'ALLOWED' : 'off'} for cuDNN, as sapipe computes in fp32; ` +
        'each timed block ends with torch.cuda.synchronize()',
    );
  } else if (r.torch) {
    const t = r.torch;
    const blas = t.openblas ? `OpenBLAS (${t.openblas.config}; core ${t.openblas.core}, ${t.openblas.threads} threads)` : `BLAS_INFO=${t.blasInfo}${t.mkl ? ', MKL' : ''}`;
    console.log(
      `PyTorch ${t.torch} eager on the CPU (${t.python}, Python ${t.pythonVersion}): ${t.threads} threads (torch.get_num_threads), ${blas}, ` +
        `oneDNN ${t.mkldnn ? 'available' : 'absent'}, ATen CPU capability ${t.cpuCapability}; OPENBLAS_CORETYPE=${t.openblasCoretype ?? '(unset)'} (${t.openblasCoretypeSource}), OMP_WAIT_POLICY=${t.ompWaitPolicy ?? '(unset)'}`,
    );
  } else console.log('PyTorch: not run (--sapipe-only)');
  const g = r.gemm;
  console.log(
    `sgemm ${g.size}x${g.size}x${g.size}${onDevice ? ` on ${r.device} (cuBLAS through sapipe's sgemm on DeviceBuffers${g.torch ? "; PyTorch's torch.mm" : ''})` : ''}: sapipe ${g.sapipe.gflops.toFixed(1)} GFLOP/s (${span(g.sapipe, 3)} ms)` +
      (g.torch ? `, PyTorch ${g.torch.gflops.toFixed(1)} GFLOP/s (${span(g.torch, 3)} ms)` : ''),
  );
  const table = cliTable(['model', 'batch', 'params', 'sapipe ms/step (min-max)', 'PyTorch ms/step (min-max)', 'sapipe / PyTorch', 'per repeat (min-max)'], !process.stdout.isTTY);
  for (const row of r.rows)
    table.push([
      row.model,
      row.batch,
      row.params,
      span(row.sapipe),
      row.torch ? span(row.torch) : '-',
      row.ratio !== undefined ? `${row.ratio.toFixed(3)} ${row.ratio <= 1 ? '(<= 1)' : '(> 1)'}` : '-',
      row.ratioPerRepeat ? `${row.ratioPerRepeat.median.toFixed(3)} (${row.ratioPerRepeat.min.toFixed(3)}-${row.ratioPerRepeat.max.toFixed(3)})` : '-',
    ]);
  console.log(table.toString());
  for (const row of r.rows) console.log(`${row.model}: ${row.description}`);
  if (r.torch) console.log('sapipe / PyTorch: the ratio of the medians (goal: at most 1); per repeat: the median and range of the ratios of the runs timed side by side');
}

async function runModels(options: ModelsOptions): Promise<void> {
  applyThreads(options.threads);
  const quick = options.quick ?? false;
  const bar = progressBar(!options.json);
  let result: ModelsBenchResult;
  try {
    result = await benchModels({
      models: options.models.split(',').map((m) => m.trim()).filter(Boolean),
      steps: quick ? 2 : options.steps,
      reps: quick ? 2 : options.reps,
      warmup: quick ? 1 : options.warmup,
      ...(options.batch !== undefined ? { batch: options.batch } : {}),
      sapipeOnly: options.sapipeOnly ?? false,
      pythons: options.python !== undefined ? [options.python] : [...new Set([process.env.SAPIPE_PYTHON, 'python3', '/usr/bin/python3'].filter((p): p is string => !!p))],
      ...(options.torchScript !== undefined ? { torchScript: options.torchScript } : {}),
      ...(options.openblasCoretype !== undefined ? { openblasCoretype: options.openblasCoretype } : {}),
      device: options.device,
      onProgress: bar.update,
    });
  } catch (error) {
    bar.stop();
    if (!(error instanceof SapipeError)) throw error;
    console.error(`${error.code}: ${error.message}`);
    process.exitCode = 1;
    return;
  }
  bar.stop();
  if (options.json) console.log(JSON.stringify(result, null, 2));
  else printModels(result);
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
    .command('models')
    .description(
      'one training step (forward, softmax cross-entropy, backward, SGD with momentum 0.9) of sapipe against PyTorch eager on the CPU ' +
        "(or, with --device cuda:N, sapipe's device path against PyTorch on the same GPU): " +
        'the same models, batch, initialisation scale and threads, repeats alternating in one run; ms/step, spread and the ratio (goal: at most 1)',
    )
    .option('--models <list>', `comma-separated, of ${BENCH_MODEL_NAMES.join(', ')}`, BENCH_MODEL_NAMES.join(','))
    .option('--steps <n>', 'timed steps per repeat', parsePositiveInt, 20)
    .option('--reps <n>', 'repeats of each side (alternating)', parsePositiveInt, 7)
    .option('--warmup <n>', 'untimed steps of each side first (0 or more)', parseNonNegativeInt, 5)
    .option('--batch <n>', "samples per step for every model (default: each model's: mlp 256, cnn 64)", parsePositiveInt)
    .option('--threads <t>', 'threads of both sides (default: all cores; SAPIPE_NUM_THREADS)', parsePositiveInt)
    .option('--python <exe>', 'the Python interpreter with torch (default: $SAPIPE_PYTHON, then python3, then /usr/bin/python3)')
    .option('--torch-script <path>', 'the PyTorch side (default: apps/bench/torch-models.py of the package)')
    .option('--openblas-coretype <name>', "OpenBLAS's core for the PyTorch process (default: SkylakeX with AVX-512, Haswell with AVX2, from the CPU flags)")
    .option('--sapipe-only', 'time sapipe alone (no Python needed)')
    .option('--device <device>', 'where both sides run: cpu, cuda:N (sapipe through the CUDA plugin, PyTorch with CUDA on the same GPU, TF32 off), or auto (cuda:0 where it can run models, else cpu)', 'cpu')
    .option('--quick', 'a tiny run: 2 steps x 2 repeats after 1 warm-up step (a smoke test, not a measurement)')
    .option('--json', 'print JSON')
    .action((options: ModelsOptions) => runModels(options));
  bench
    .command('allreduce')
    .description('all-reduce time and bus bandwidth per size (like nccl-tests), against a single-thread memcpy of the same run, and the fused all-reduce + update')
    .option('--backend <name>', 'communication backend: local (worker threads) or ucx (processes)', 'local')
    .option('--nproc <n>', 'ranks', parsePositiveInt, 2)
    .option('--min <bytes>', 'smallest size in bytes (e.g. 1K)', parseCount, 1 << 10)
    .option('--max <bytes>', 'largest size in bytes (e.g. 256M)', parseCount, 1 << 26)
    .option('--reps <n>', 'measured runs per size', parsePositiveInt, 20)
    .option('--warmup <n>', 'unmeasured runs per size', parsePositiveInt, 3)
    .option('--fused-size <bytes>', 'ParamSet size of the fused all-reduce + update', parseCount, 1 << 26)
    .option('--optimizers <list>', 'optimizers of the fused comparison: sgd, sgd-momentum, adam', 'sgd,sgd-momentum,adam')
    .option('--algorithm <name>', 'direct (ranks read each other\'s buffers in shared memory; on ucx, buffers from comm.allocate) or ring', 'direct')
    .option('--topk <density>', 'also time the top-k exchange (MSTopK + sparse all-gather, error feedback) of the fused-size gradient at this density against its all-reduce')
    .option('--guard <guard>', "the replicated fused step's non-finite guard: prescan or deferred (default: the backend's)")
    .option('--json', 'print JSON')
    .action(async (options: { backend: string; nproc: number; min: number; max: number; reps: number; warmup: number; fusedSize: number; optimizers: string; algorithm: string; topk?: string; guard?: string; json?: boolean }) => {
      if (options.backend !== 'local' && options.backend !== 'ucx') throw new InvalidArgumentError(`--backend must be local or ucx, got "${options.backend}"`);
      if (options.algorithm !== 'direct' && options.algorithm !== 'ring') throw new InvalidArgumentError('--algorithm must be direct or ring');
      if (options.guard !== undefined && options.guard !== 'prescan' && options.guard !== 'deferred') throw new InvalidArgumentError(`--guard must be prescan or deferred, got "${options.guard}"`);
      const optimizers = options.optimizers.split(',').filter(Boolean);
      for (const o of optimizers)
        if (!['sgd', 'sgd-momentum', 'adam'].includes(o)) throw new InvalidArgumentError(`unknown optimizer "${o}" in --optimizers`);
      const r = await benchAllreduce({
        backend: options.backend,
        nproc: options.nproc,
        minBytes: options.min,
        maxBytes: options.max,
        reps: options.reps,
        warmup: options.warmup,
        fusedBytes: options.fusedSize,
        optimizers: optimizers as ('sgd' | 'sgd-momentum' | 'adam')[],
        algorithm: options.algorithm,
        ...(options.topk !== undefined ? { topkDensity: numberOption(options.topk, '--topk') } : {}),
        ...(options.guard !== undefined ? { guard: options.guard as 'prescan' | 'deferred' } : {}),
      });
      if (options.json) {
        console.log(JSON.stringify(r, null, 2));
        return;
      }
      const ranks = r.backend === 'ucx' ? 'processes' : 'worker threads';
      console.log(`all-reduce (avg, fp32, in place), backend ${r.backend} (${r.algorithm}), ${r.nproc} ranks as ${ranks}; median of repeated runs`);
      console.log(`single-thread memcpy of ${formatCount(r.copy.bytes)}B in the same run: ${r.copy.GBps.toFixed(2)} GB/s (bytes copied per second)`);
      const plain = !process.stdout.isTTY;
      const table = cliTable(['size (B)', 'time (ms)', 'algbw (GB/s)', 'busbw (GB/s)', 'busbw / memcpy'], plain);
      for (const row of r.rows) table.push([formatCount(row.bytes), row.ms.toFixed(3), row.algbwGBps.toFixed(2), row.busbwGBps.toFixed(2), row.ratioToCopy.toFixed(3)]);
      console.log(table.toString());
      const fused = cliTable(['optimizer', 'ParamSet (B)', 'all-reduce ms', 'fused, replicated ms', 'x all-reduce', 'x unfused', 'fused, sharded ms', 'x all-reduce', 'x unfused'], plain);
      for (const f of r.fused)
        fused.push([
          f.optimizer,
          formatCount(f.bytes),
          f.allreduceMs.toFixed(3),
          f.fusedMs.toFixed(3),
          f.ratio.toFixed(3),
          f.unfusedRatio.toFixed(3),
          f.shardedMs.toFixed(3),
          f.shardedRatio.toFixed(3),
          f.unfusedShardedRatio.toFixed(3),
        ]);
      if (r.fused.length) {
        console.log(fused.toString());
        console.log(
          'x all-reduce: the fused step (all-reduce of the gradient and the optimizer update, per bucket or in two native passes: docs/communication.md) over the ' +
            'plain all-reduce of the same gradient; 1.0 means the update costs nothing on top of the communication. ' +
            'x unfused: the fused step over the same work as separate calls, the median of the ratios within each iteration (replicated: all-reduce, then the step; sharded: ' +
            `reduce-scatter, the step of this rank's part, all-gather of the weights: ${r.fused.map((f) => `${f.optimizer} ${f.unfusedMs.toFixed(3)} / ${f.unfusedShardedMs.toFixed(3)} ms`).join(', ')}); goal: at most 0.9.`,
        );
      }
      if (r.topk)
        console.log(
          `top-k exchange at density ${r.topk.density} of the ${formatCount(r.topk.bytes)}B gradient (MSTopK with error feedback, all-gather of the pairs, scatter-add): ` +
            `${r.topk.topkMs.toFixed(3)} ms against its all-reduce's ${r.topk.allreduceMs.toFixed(3)} ms (${r.topk.ratio.toFixed(3)}x)`,
        );
    });
  bench
    .command('gemm')
    .description('SGEMM GFLOP/s (C = A*B, fp32) and its ratio to the modelled peak: threads x FMA units x lanes x 2 x measured clock')
    .option('--m <n>', 'rows of A and C', parsePositiveInt, 256)
    .option('--n <n>', 'columns of B and C', parsePositiveInt, 256)
    .option('--k <n>', 'columns of A, rows of B', parsePositiveInt, 256)
    .option('--trans-a', 'multiply by A^T (A stored k x m)')
    .option('--trans-b', 'multiply by B^T (B stored n x k)')
    .option('--threads <t>', 'worker threads (default: all cores; SAPIPE_NUM_THREADS)', parsePositiveInt)
    .option('--reps <n>', 'measured samples (each a ~5 ms batch of products)', parsePositiveInt, 15)
    .option('--warmup <n>', 'unmeasured samples before measuring', parsePositiveInt, 3)
    .option('--clock-ghz <ghz>', 'core clock of the peak model (default: measured)', Number)
    .option('--fma-units <n>', 'FMA units per core of the peak model', parsePositiveInt, 2)
    .option('--json', 'print JSON')
    .action((options: { m: number; n: number; k: number; transA?: boolean; transB?: boolean; threads?: number; reps: number; warmup: number; clockGhz?: number; fmaUnits: number; json?: boolean }) => {
      applyThreads(options.threads);
      const r = benchGemm({
        m: options.m,
        n: options.n,
        k: options.k,
        transA: options.transA ?? false,
        transB: options.transB ?? false,
        reps: options.reps,
        warmup: options.warmup,
        fmaUnits: options.fmaUnits,
        ...(options.clockGhz !== undefined ? { clockGhz: options.clockGhz } : {}),
      });
      if (options.json) {
        console.log(JSON.stringify(r, null, 2));
        return;
      }
      const op = `${r.transA ? 'A^T' : 'A'}*${r.transB ? 'B^T' : 'B'}`;
      console.log(`sgemm C = ${op}, m=${r.m} n=${r.n} k=${r.k}, ${r.threads} thread(s), simd ${r.simd}: ${r.medianMs.toFixed(4)} ms, ${r.gflops.toFixed(1)} GFLOP/s (median of ${options.reps})`);
      console.log(`assumed peak ${r.peak.gflops.toFixed(1)} GFLOP/s = ${r.peak.formula} (clock ${r.peak.clockSource})`);
      console.log(`ratio to peak: ${(r.ratioToPeak * 100).toFixed(1)}%`);
    });
  bench
    .command('pipeline')
    .description(
      'the pipeline runtime on the demo MLP: per schedule, the measured round against the simulator fed the stage costs measured in the same run ' +
        '(every stage its own device), against the machine-aware simulator (each part timed alone at several micro-batch sizes, the stages sharing the cores, the local link measured), ' +
        'and the runtime\'s overhead (time outside model work on the busiest stage) as a share of the round',
    )
    .option('--schedules <list>', `comma-separated, from ${RUNTIME_SCHEDULES.join(', ')}`, 'gpipe,1f1b')
    .option('--stages <S>', 'stages (worker threads)', parsePositiveInt, 4)
    .option('--microbatches <M>', 'micro-batches per round', parsePositiveInt, 8)
    .option('--microbatch-size <b>', 'samples per micro-batch', parsePositiveInt, 64)
    .option('--layers <sizes>', 'MLP widths', PIPELINE_DEMO_SIZES.join(','))
    .option('--rounds <n>', 'measured rounds', parsePositiveInt, 20)
    .option('--warmup <n>', 'unmeasured rounds first (0 or more)', parseNonNegativeInt, 5)
    .option('--kernel-threads <n>', "each stage worker's native kernel threads: auto (the cores split among the workers), a number, or shared (the process-wide pool)", kernelThreadsOption, 'auto' as const)
    .option('--averaging-layout <layout>', `AvgPipe's layout (${AVERAGING_LAYOUTS.join(', ')}; default the trainer's)`)
    .option('--form <form>', `Wavelet's form (${WAVELET_FORMS.join(', ')}; default the trainer's)`)
    .option('--json', 'print JSON')
    .action(async (options: { schedules: string; stages: number; microbatches: number; microbatchSize: number; layers: string; rounds: number; warmup: number; kernelThreads: number | 'auto' | 'shared'; averagingLayout?: string; form?: string; json?: boolean }) => {
      const schedules = options.schedules.split(',').map((name) => checkOneOf(name.trim(), '--schedules', RUNTIME_SCHEDULES));
      const sizes = options.layers.split(',').map((x) => numberOption(x, '--layers'));
      const kernelThreads = options.kernelThreads;
      const averagingLayout = options.averagingLayout === undefined ? undefined : checkOneOf(options.averagingLayout, '--averaging-layout', AVERAGING_LAYOUTS);
      const form = options.form === undefined ? undefined : checkOneOf(options.form, '--form', WAVELET_FORMS);
      const rows = await benchPipeline({
        schedules,
        stages: options.stages,
        microBatches: options.microbatches,
        microBatchSize: options.microbatchSize,
        sizes,
        rounds: options.rounds,
        warmup: options.warmup,
        kernelThreads,
        ...(averagingLayout ? { averagingLayout } : {}),
        ...(form ? { form } : {}),
      });
      if (options.json) {
        console.log(JSON.stringify(rows, null, 2));
        return;
      }
      console.log(
        `MLP ${sizes.join('-')}, ${options.stages} stages (worker threads, local), M=${options.microbatches} x ${options.microbatchSize} samples, ` +
          `median of ${options.rounds} rounds after ${options.warmup}; ${availableParallelism()} cores, kernel threads per worker: ${rows[0]?.kernelThreads ?? kernelThreads}` +
          (rows[0]?.messageCpuMs.length ? `; a message between stages costs ${Math.max(...rows[0].messageCpuMs.slice(0, -1), 0).toFixed(3)} ms of CPU (the largest, measured between two threads)` : ''),
      );
      const within = (ratio: number): string => `${ratio.toFixed(3)} ${Math.abs(ratio - 1) <= 0.2 ? '(within 20%)' : '(outside 20%)'}`;
      const table = cliTable([
        'schedule',
        'measured ms (min-max)',
        'run costs, a device per stage: simulated ms',
        'measured / simulated',
        'run costs, sharing the cores: simulated ms',
        'measured / simulated',
        'machine profile, sharing the cores: simulated ms',
        'measured / simulated',
        'bubble measured / simulated',
        'overhead per action ms',
        'overhead share',
      ]);
      for (const r of rows)
        table.push([
          r.schedule,
          `${r.measuredMs.toFixed(2)} (${r.measuredMinMs.toFixed(2)}-${r.measuredMaxMs.toFixed(2)})`,
          r.simulatedMs.toFixed(2),
          within(r.ratio),
          r.simulatedSharedMs.toFixed(2),
          within(r.ratioShared),
          r.simulatedMachineMs.toFixed(2),
          within(r.ratioMachine),
          `${(r.bubbleMeasured * 100).toFixed(1)}% / ${(r.bubbleSimulated * 100).toFixed(1)}%`,
          r.overheadPerActionMs.toFixed(4),
          `${(r.overheadShare * 100).toFixed(2)}% ${r.overheadShare <= 0.05 ? '(<= 5%)' : '(> 5%)'}`,
        ]);
      console.log(table.toString());
    });
  bench
    .command('overlap')
    .description(
      'the staleness-1 modes\' step(): the time it blocks with the update applied at step() and with the update overlapped ' +
        '(in the background behind its all-reduce, the default), beside the standalone update and all-reduce measured in the same run',
    )
    .option('--nproc <n>', 'ranks (worker threads, local backend)', parsePositiveInt, 2)
    .option('--size <n>', 'parameters', parseCount, 1 << 24)
    .option('--modes <list>', 'comma-separated staleness-1 modes', 'pipe-sgd,sapipe-dc,sapipe-wp')
    .option('--optimizer <kind>', 'sgd (momentum 0.9) or adam', 'sgd')
    .option('--compute-ms <ms>', "the caller's compute per step (default: 1.25 x (all-reduce + update), measured)", (v) => numberOption(v, '--compute-ms'))
    .option('--compute <how>', "'sleep' (an accelerator's forward/backward: the cores stay free) or 'busy' (spins one core per rank)", 'sleep')
    .option('--steps <n>', 'measured steps per run', parsePositiveInt, 20)
    .option('--warmup <n>', 'unmeasured steps first', parsePositiveInt, 3)
    .option('--clip <norm>', 'both trainers clip the averaged gradient to this global norm (clipGradNorm)', (v) => numberOption(v, '--clip'))
    .option('--guard <kind>', "the overlapped update's guard: 'deferred' (one update behind the last bucket; the default here) or 'prescan' (each bucket updated as it lands)")
    .option('--json', 'print JSON')
    .action(async (options: { nproc: number; size: number; modes: string; optimizer: string; computeMs?: number; compute: string; steps: number; warmup: number; clip?: number; guard?: string; json?: boolean }) => {
      const modes = options.modes.split(',').map((m) => checkOneOf(m.trim(), '--modes', ['pipe-sgd', 'sapipe-dc', 'sapipe-wp'] as const));
      const optimizer = checkOneOf(options.optimizer, '--optimizer', ['sgd', 'adam'] as const);
      const compute = checkOneOf(options.compute, '--compute', ['sleep', 'busy'] as const);
      if (options.clip !== undefined && !(options.clip > 0)) throw new InvalidArgumentError(`--clip must be a positive norm, got ${options.clip}`);
      const guard = options.guard === undefined ? undefined : checkOneOf(options.guard, '--guard', ['prescan', 'deferred'] as const);
      const rows = await benchOverlap({
        nproc: options.nproc,
        elements: options.size,
        modes,
        optimizer,
        ...(options.computeMs !== undefined ? { computeMs: options.computeMs } : {}),
        compute,
        steps: options.steps,
        warmup: options.warmup,
        ...(options.clip !== undefined ? { clipGradNorm: options.clip } : {}),
        ...(guard !== undefined ? { guard } : {}),
      });
      if (options.json) {
        console.log(JSON.stringify(rows, null, 2));
        return;
      }
      console.log(
        `${options.nproc} ranks (worker threads, local), ${formatCount(options.size)} parameters, ${optimizer}, compute '${compute}', ` +
          `median of ${options.steps} steps after ${options.warmup}; ${availableParallelism()} cores` +
          (options.clip !== undefined ? `; clipGradNorm ${options.clip}` : '') +
          (guard !== undefined ? `; guard ${guard}` : ''),
      );
      const table = cliTable(['mode', 'update alone ms', 'all-reduce ms', 'compute ms', 'step() blocks: at step()', 'overlapped', 'overlapped / update', 'iteration ms: at step()', 'overlapped']);
      for (const r of rows)
        table.push([
          r.mode,
          r.updateMs.toFixed(2),
          r.allreduceMs.toFixed(2),
          r.computeMs.toFixed(2),
          r.atStepMs.toFixed(2),
          r.overlappedMs.toFixed(2),
          `${(r.overlappedMs / r.updateMs).toFixed(3)} ${r.overlappedMs <= 0.1 * r.updateMs ? '(<= 0.1)' : '(> 0.1)'}`,
          r.atStepIterationMs.toFixed(2),
          r.overlappedIterationMs.toFixed(2),
        ]);
      console.log(table.toString());
      console.log('overlapped / update: what step() still blocks, over the update alone (goal: at most 0.1 when the compute covers the all-reduce and the update)');
    });
  bench
    .command('checkpoint')
    .description("a checkpoint's cost: the snapshot on the training thread against a copy of the same bytes, and the save's write rate against the disk's, in one run")
    .option('--size <n>', 'parameters (SGD with momentum: the snapshot copies weights and momentum)', parseCount, 16 << 20)
    .option('--reps <n>', 'measured snapshots and saves', parsePositiveInt, 5)
    .option('--dir <path>', 'where to write (default: a temporary directory, removed after)')
    .option('--json', 'print JSON')
    .action(async (options: { size: number; reps: number; dir?: string; json?: boolean }) => {
      const r = await benchCheckpoint({ elements: options.size, reps: options.reps, ...(options.dir !== undefined ? { dir: options.dir } : {}) });
      if (options.json) {
        console.log(JSON.stringify(r, null, 2));
        return;
      }
      const mb = (bytes: number): string => `${(bytes / 1e6).toFixed(0)} MB`;
      console.log(`${formatCount(r.elements)} parameters, SGD-momentum, ${options.reps} reps (medians)${options.dir !== undefined ? `, files in ${r.dir}` : ""}`);
      console.log(`snapshot on the training thread: ${r.snapshotMs.toFixed(2)} ms for ${mb(r.snapshotBytes)}; a copy of the same bytes ${r.memcpyMs.toFixed(2)} ms; ratio ${r.snapshotRatio.toFixed(2)} ${r.snapshotRatio <= 1.2 ? '(<= 1.2)' : '(> 1.2)'}`);
      console.log(`save of a ${mb(r.fileBytes)} file: ${r.saveMBps.toFixed(0)} MB/s; the same bytes written and fsynced alone: ${r.diskMBps.toFixed(0)} MB/s; ratio ${r.saveRatio.toFixed(2)}`);
      console.log(`while a save was written in the background, the training thread's longest stall: ${r.writeStallMs.toFixed(1)} ms (what a step could wait for beyond the snapshot)`);
    });
  bench
    .command('cpr')
    .description(
      'the CPR experiment: a recommendation model (sharded embedding tables + MLP, Zipf click data) trained by ucx processes with ranks SIGKILLed on a fixed schedule, under full recovery, partial recovery, MFU and SSU; time lost and final loss/AUC against a run without failures',
    )
    .option('--ranks <n>', 'processes (each holds one embedding shard)', parsePositiveInt, 4)
    .option('--steps <n>', 'training steps', parsePositiveInt, 3000)
    .option('--failures <n>', 'ranks killed, evenly spaced over the run', (v: string) => Number(parsePositiveInt(String(Number(v) + 1))) - 1, 3)
    .option('--policies <list>', `comma-separated, of ${RECOVERY_POLICIES.join(', ')}`, RECOVERY_POLICIES.join(','))
    .option('--lost-fraction <p>', "CPR's target portion of lost samples (sets the partial policies' interval)", (v: string) => numberOption(v, '--lost-fraction'), 0.02)
    .option('--seed <n>', 'seed of the data and the model', (v: string) => Number(parsePositiveInt(String(Number(v) + 1))) - 1, 3)
    .option('--reps <n>', 'runs of every job (the baseline included); medians and spreads', parsePositiveInt, 1)
    .option('--json', 'print JSON')
    .action(async (options: { ranks: number; steps: number; failures: number; policies: string; lostFraction: number; seed: number; reps: number; json?: boolean }) => {
      const policies = options.policies.split(',').filter((p) => p !== '').map((p) => checkOneOf(p, '--policies', RECOVERY_POLICIES) as RecoveryPolicy);
      const r = await benchCpr({ ranks: options.ranks, steps: options.steps, failures: options.failures, policies, lostFraction: options.lostFraction, seed: options.seed, reps: options.reps });
      if (options.json) {
        console.log(JSON.stringify(r, null, 2));
        return;
      }
      console.log(
        `${r.ranks} ranks, ${r.steps} steps of ${r.stepMs.toFixed(2)} ms (one epoch), ${r.reps} run(s) of every job, failures at steps ${r.failAt.join(', ')} (one every ${r.mtbfSeconds.toFixed(1)} s); ` +
          `a full save stalls the training thread ${r.saveCost.stallMs.toFixed(2)} ms (its file ${r.saveCost.writeMs.toFixed(1)} ms in the background) and costs training ${r.saveCost.costMs.toFixed(1)} ms (the intervals' O_save)`,
      );
      console.log(`intervals: Young's ${r.youngSeconds.toFixed(2)} s (full recovery), CPR's ${r.cprSeconds.toFixed(2)} s (partial policies)`);
      const table = cliTable(['policy', 'save every', 'priority every', 'training s', 'spread', 'overhead', 'restart s (each)', 'recomputed steps', 'lost row updates', 'saves', 'loss', 'AUC']);
      for (const row of r.rows)
        table.push([
          row.policy,
          row.saveEvery || '-',
          row.priorityEvery ?? '-',
          row.trainingSeconds.toFixed(2),
          row.spread.map((x) => x.toFixed(1)).join('-'),
          `${(row.overhead * 100).toFixed(1)} %`,
          row.restartSeconds.map((s) => s.toFixed(2)).join(' ') || '-',
          row.recomputedSteps,
          row.lostUpdates.join(' ') || '-',
          row.saves ? `${row.saves.full}+${row.saves.priority}` : '-',
          row.metrics.loss.toFixed(4),
          row.metrics.auc.toFixed(4),
        ]);
      console.log(table.toString());
      console.log(
        'training s: first step to last, restarts included (median of the runs); overhead: over the run without checkpoints or failures, minus 1; ' +
          'recomputed steps, lost row updates (the lost shard\'s updates no save held), saves (full + priority, last attempt): of the first run; loss and AUC: medians',
      );
    });
  bench
    .command('topk')
    .description('MSTopK selection with error feedback against the exact top-k (nth_element) in one run, and its memory traffic against the copy bandwidth')
    .option('--size <n>', 'elements (Gaussian)', parseCount, 16 << 20)
    .option('--densities <list>', 'k / size, comma-separated', '0.001,0.01,0.05')
    .option('--threads <t>', 'worker threads', parsePositiveInt)
    .option('--reps <n>', 'measured selections per density', parsePositiveInt, 5)
    .option('--json', 'print JSON')
    .action(async (options: { size: number; densities: string; threads?: number; reps: number; json?: boolean }) => {
      applyThreads(options.threads);
      const densities = options.densities.split(',').map((d) => numberOption(d, '--densities'));
      const r = await benchTopk({ elements: options.size, densities, reps: options.reps });
      if (options.json) {
        console.log(JSON.stringify(r, null, 2));
        return;
      }
      console.log(`${formatCount(r.elements)} Gaussian elements, copy bandwidth ${r.copyGbps.toFixed(1)} GB/s (medians of ${options.reps})`);
      const table = cliTable(['density', 'k', 'MSTopK ms', 'exact ms', 'speedup', 'passes', 'recall', 'MSTopK GB/s', 'of copy']);
      for (const row of r.rows)
        table.push([row.density, row.k, row.mstopkMs.toFixed(1), row.exactMs.toFixed(1), `${row.speedup.toFixed(1)}x ${row.speedup >= 5 ? '(>= 5)' : '(< 5)'}`, row.passes, row.recall.toFixed(4), row.gbps.toFixed(1), row.ofCopy.toFixed(2)]);
      console.log(table.toString());
    });
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
