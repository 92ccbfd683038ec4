/**
 * `sapipe bench allreduce`: all-reduce time per size on N ranks (worker threads of the local
 * backend, or processes of the ucx backend started as `sapipe launch` starts them), as
 * nccl-tests reports it: algbw = bytes / time, busbw = algbw x 2(n-1)/n (the bytes each rank's
 * links must carry in a ring, so busbw is comparable across world sizes). The limit it is compared
 * with is a single-thread memcpy measured in the same run (bytes copied per second): a rank is one
 * thread (the ucx backend's ranks each drive their transfers and reductions from one thread too). Also the fused all-reduce + update of one ParamSet against the
 * all-reduce alone.
 */
import { BackendUnavailableError, InvalidArgumentError, spawnLocalRanks } from 'sapipe';
import { describeValue } from 'sapipe/validate';
import type { AllreduceMeasureOptions, AllreduceRankReport } from './allreduce-measure.js';
import { REPORT_PREFIX, type UcxRankData } from './allreduce-ucx-rank.js';
import type { AllreduceWorkerData } from './allreduce-worker.js';
import { launchRankScript } from './rank-script.js';

export interface AllreduceBenchOptions {
  /** `local` (worker threads, default) or `ucx` (processes). */
  backend?: 'local' | 'ucx';
  nproc: number;
  minBytes: number;
  maxBytes: number;
  reps: number;
  warmup: number;
  fusedBytes: number;
  optimizers: AllreduceWorkerData['optimizers'];
  algorithm: 'direct' | 'ring';
  /** Also time the top-k exchange (sparseAllreduce) of the fused-size gradient at this density. */
  topkDensity?: number | undefined;
  /** The replicated fused step's guard; the backend's default when unset. */
  guard?: 'prescan' | 'deferred' | undefined;
}

export interface AllreduceBenchResult {
  backend: 'local' | 'ucx';
  nproc: number;
  algorithm: 'direct' | 'ring';
  rows: { bytes: number; ms: number; algbwGBps: number; busbwGBps: number; ratioToCopy: number }[];
  copy: { bytes: number; ms: number; GBps: number };
  /** ratio: replicated fused step / all-reduce; shardedRatio: sharded fused step / all-reduce. */
  fused: {
    optimizer: string;
    bytes: number;
    allreduceMs: number;
    fusedMs: number;
    ratio: number;
    shardedMs: number;
    shardedRatio: number;
    /**
     * The same work as separate calls, and the fused step's time over it (goal: at most 0.9): the
     * median over iterations of the ratio within each iteration (each iteration times the fused
     * step and its unfused sequence a few milliseconds apart), not unfusedMs over fusedMs.
     */
    unfusedMs: number;
    unfusedRatio: number;
    unfusedShardedMs: number;
    unfusedShardedRatio: number;
  }[];
  topk?: { density: number; bytes: number; allreduceMs: number; topkMs: number; ratio: number };
}

export function allreduceSizes(min: number, max: number): number[] {
  if (!Number.isInteger(min) || !Number.isInteger(max) || min < 4 || max < min)
    throw new InvalidArgumentError(`--min and --max must be byte counts with 4 <= min <= max, got ${min} and ${max}`);
  const sizes: number[] = [];
  for (let b = min; b <= max; b *= 2) sizes.push(b);
  return sizes;
}

export async function benchAllreduce(o: AllreduceBenchOptions): Promise<AllreduceBenchResult> {
  if (!Number.isInteger(o.nproc) || o.nproc < 1) throw new InvalidArgumentError('--nproc must be a positive integer');
  const backend = o.backend ?? 'local';
  if (backend !== 'local' && backend !== 'ucx') throw new InvalidArgumentError(`--backend must be local or ucx, got ${describeValue(backend)}`);
  const sizes = allreduceSizes(o.minBytes, o.maxBytes);
  if (o.topkDensity !== undefined && !(o.topkDensity > 0 && o.topkDensity <= 1)) throw new InvalidArgumentError(`--topk must be a density in (0, 1], got ${describeValue(o.topkDensity)}`);
  const measure: AllreduceMeasureOptions = { sizes, reps: o.reps, warmup: o.warmup, fusedBytes: o.fusedBytes, optimizers: o.optimizers, topkDensity: o.topkDensity, guard: o.guard };
  const report = backend === 'ucx' ? await runUcxRanks(o.nproc, { ...measure, algorithm: o.algorithm }) : await runLocalRanks(o.nproc, measure, o.algorithm);
  const n = o.nproc;
  const copy = report.copy!;
  const copyGBps = copy.bytes / (copy.ms * 1e6);
  return {
    backend,
    nproc: n,
    algorithm: report.algorithm ?? o.algorithm,
    copy: { ...copy, GBps: copyGBps },
    rows: report.rows.map((r) => {
      const algbw = r.bytes / (r.ms * 1e6);
      const busbw = n > 1 ? (algbw * 2 * (n - 1)) / n : algbw;
      return { ...r, algbwGBps: algbw, busbwGBps: busbw, ratioToCopy: busbw / copyGBps };
    }),
    fused: report.fused.map((f) => ({
      ...f,
      bytes: o.fusedBytes,
      ratio: f.fusedMs / f.allreduceMs,
      shardedRatio: f.shardedMs / f.allreduceMs,
      unfusedRatio: f.unfusedPairedRatio,
      unfusedShardedRatio: f.unfusedShardedPairedRatio,
    })),
    ...(report.topk ? { topk: { ...report.topk, bytes: o.fusedBytes, ratio: report.topk.topkMs / report.topk.allreduceMs } } : {}),
  };
}

async function runLocalRanks(nproc: number, measure: AllreduceMeasureOptions, algorithm: 'direct' | 'ring'): Promise<AllreduceRankReport> {
  const ext = import.meta.url.endsWith('.ts') ? 'ts' : 'js';
  const workerData: Omit<AllreduceWorkerData, 'sapipeLocal'> = { ...measure, algorithm };
  const workers = spawnLocalRanks(new URL(`./allreduce-worker.${ext}`, import.meta.url), nproc, { workerData });
  try {
    return await new Promise<AllreduceRankReport>((resolve, reject) => {
      workers.forEach((w, rank) => {
        w.on('error', reject);
        w.on('message', (m: { error?: string; rows?: unknown }) => {
          if (m.error) reject(new Error(`rank ${rank}: ${m.error}`));
          else if (rank === 0 && m.rows) resolve(m as AllreduceRankReport);
        });
      });
    });
  } finally {
    await Promise.all(workers.map((w) => w.terminate()));
  }
}

/** The ucx ranks are processes, started on this machine as `sapipe launch` starts them; rank 0 prints the report. */
async function runUcxRanks(nproc: number, measure: UcxRankData): Promise<AllreduceRankReport> {
  const { ucxStatus } = await import('sapipe/backends');
  const status = ucxStatus();
  if (!status.available) throw new BackendUnavailableError(`the ucx backend is unavailable: ${status.reason ?? 'unknown reason'}`);
  const { result, stdout, stderr } = await launchRankScript('allreduce-ucx-rank', { args: [JSON.stringify(measure)], nproc, forwardSignals: true });
  const line = stdout.split('\n').find((l) => l.startsWith(`[0] ${REPORT_PREFIX}`));
  if (result.exitCode !== 0 || line === undefined)
    throw new Error(`the ucx ranks failed (${result.message ?? `exit code ${result.exitCode}`}): ${stderr.trim().split('\n').slice(-5).join(' | ')}`);
  return JSON.parse(line.slice(`[0] ${REPORT_PREFIX}`.length)) as AllreduceRankReport;
}
