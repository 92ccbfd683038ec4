/**
 * `sapipe bench allreduce`: all-reduce time per size on N local ranks (worker threads), as
 * nccl-tests reports it: algbw = bytes / time, busbw = algbw x 2(n-1)/n (the bytes each rank's
 * links must carry in a ring, so busbw is comparable across world sizes). The limit it is compared
 * with is a single-thread memcpy measured in the same run (bytes copied per second): a rank of the
 * local backend is one thread. Also the fused all-reduce + update of one ParamSet against the
 * all-reduce alone.
 */
import { InvalidArgumentError } from '../errors.js';
import { spawnLocalRanks } from '../comm/local.js';
import type { AllreduceWorkerData } from './allreduce-worker.js';

export interface AllreduceBenchOptions {
  nproc: number;
  minBytes: number;
  maxBytes: number;
  reps: number;
  warmup: number;
  fusedBytes: number;
  optimizers: AllreduceWorkerData['optimizers'];
  algorithm: 'direct' | 'ring';
}

export interface AllreduceBenchResult {
  backend: 'local';
  nproc: number;
  algorithm: 'direct' | 'ring';
  rows: { bytes: number; ms: number; algbwGBps: number; busbwGBps: number; ratioToCopy: number }[];
  copy: { bytes: number; ms: number; GBps: number };
  /** ratio: replicated fused step / all-reduce; shardedRatio: sharded fused step / all-reduce. */
  fused: { optimizer: string; bytes: number; allreduceMs: number; fusedMs: number; ratio: number; shardedMs: number; shardedRatio: number }[];
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
  const sizes = allreduceSizes(o.minBytes, o.maxBytes);
  const ext = import.meta.url.endsWith('.ts') ? 'ts' : 'js';
  const workerData: Omit<AllreduceWorkerData, 'sapipeLocal'> = {
    sizes,
    reps: o.reps,
    warmup: o.warmup,
    fusedBytes: o.fusedBytes,
    optimizers: o.optimizers,
    algorithm: o.algorithm,
  };
  const workers = spawnLocalRanks(new URL(`./allreduce-worker.${ext}`, import.meta.url), o.nproc, { workerData });
  try {
    const report = await new Promise<{ rows: { bytes: number; ms: number }[]; fused: { optimizer: string; allreduceMs: number; fusedMs: number; shardedMs: number }[]; copy: { bytes: number; ms: number } }>((resolve, reject) => {
      workers.forEach((w, rank) => {
        w.on('error', reject);
        w.on('message', (m: { error?: string; rows?: unknown }) => {
          if (m.error) reject(new Error(`rank ${rank}: ${m.error}`));
          else if (rank === 0 && m.rows) resolve(m as never);
        });
      });
    });
    const n = o.nproc;
    const copyGBps = report.copy.bytes / (report.copy.ms * 1e6);
    return {
      backend: 'local',
      nproc: n,
      algorithm: o.algorithm,
      copy: { ...report.copy, GBps: copyGBps },
      rows: report.rows.map((r) => {
        const algbw = r.bytes / (r.ms * 1e6);
        const busbw = n > 1 ? (algbw * 2 * (n - 1)) / n : algbw;
        return { ...r, algbwGBps: algbw, busbwGBps: busbw, ratioToCopy: busbw / copyGBps };
      }),
      fused: report.fused.map((f) => ({ ...f, bytes: o.fusedBytes, ratio: f.fusedMs / f.allreduceMs, shardedRatio: f.shardedMs / f.allreduceMs })),
    };
  } finally {
    await Promise.all(workers.map((w) => w.terminate()));
  }
}
