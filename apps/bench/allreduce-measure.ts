/**
 * The measurements of `sapipe bench allreduce`, run by every rank of any backend (a worker thread
 * of the local backend, a process of the ucx backend). Rank 0's report: per size the median time
 * of an all-reduce started after a barrier; the fused all-reduce + update, replicated and sharded,
 * against the all-reduce alone on one ParamSet, interleaved; and a single-thread memcpy of the largest size.
 * Buffers and ParamSets are allocated as a user would for speed: in the communicator's memory.
 */
import { performance } from 'node:perf_hooks';

import { Adam, allreduceAndStep, type Communicator, FlatBuffer, type Optimizer, ParamSet, QueuedCommunicator, SGD, sparseAllreduce, UcxCommunicator } from 'sapipe';
import { commAddon } from 'sapipe/kernels';
import { fillDistinct } from './kernels.js';
import { median } from './timing.js';

export interface AllreduceMeasureOptions {
  sizes: number[];
  reps: number;
  warmup: number;
  fusedBytes: number;
  optimizers: ('sgd' | 'sgd-momentum' | 'adam')[];
  /** Also time the top-k exchange (sparseAllreduce at this density, error feedback) of a fusedBytes gradient. */
  topkDensity?: number | undefined;
  /** The replicated fused step's guard (allreduceAndStep's `guard`); the backend's default when unset. */
  guard?: 'prescan' | 'deferred' | undefined;
}

export interface AllreduceRankReport {
  rows: { bytes: number; ms: number }[];
  /**
   * The fused steps against the same work as separate calls: `unfusedMs` an all-reduce then a
   * whole optimizer step; `unfusedShardedMs` a reduce-scatter, the step of this rank's part, an
   * all-gather of the weights.
   */
  fused: {
    optimizer: string;
    allreduceMs: number;
    fusedMs: number;
    shardedMs: number;
    unfusedMs: number;
    unfusedShardedMs: number;
    /** Medians over iterations of the ratio within each iteration (the fused step against its unfused sequence, timed a few milliseconds apart): steadier than a ratio of medians on a machine whose memory bandwidth drifts. */
    unfusedPairedRatio: number;
    unfusedShardedPairedRatio: number;
  }[];
  /** With topkDensity: the top-k exchange of the fusedBytes gradient against its dense all-reduce. */
  topk?: { density: number; allreduceMs: number; topkMs: number };
  /** Rank 0 only. */
  copy?: { bytes: number; ms: number };
  /** The algorithm the all-reduces took, where the backend tells (ucx: direct only if buffers were read in shared memory). */
  algorithm?: 'direct' | 'ring';
}

/** Runs every measurement on `comm`; `onSize` is told of each size done. The communicator stays open. */
export async function measureAllreduce(comm: Communicator, data: AllreduceMeasureOptions, onSize: (bytes: number) => void = () => {}): Promise<AllreduceRankReport> {
  const { rank } = comm;
  const memory = comm instanceof QueuedCommunicator ? comm : { allocate: (length: number) => FlatBuffer.allocate(length) };
  const rows: { bytes: number; ms: number }[] = [];
  for (const bytes of data.sizes) {
    const buf = memory.allocate(Math.floor(bytes / 4));
    fillDistinct(buf.array, rank + 1, -1, 1);
    const times: number[] = [];
    const reps = bytes >= 1 << 26 ? Math.max(3, Math.ceil(data.reps / 3)) : data.reps;
    for (let i = 0; i < data.warmup + reps; i++) {
      await comm.barrier();
      const start = performance.now();
      await comm.allreduce(buf, { op: 'avg' });
      if (i >= data.warmup) times.push(performance.now() - start);
    }
    rows.push({ bytes, ms: median(times) });
    buf.dispose();
    onSize(bytes);
  }
  const fused: AllreduceRankReport['fused'] = [];
  // A multiple of the ranks, so that the unfused reduce-scatter's parts are equal.
  const fusedLength = Math.max(comm.size, Math.floor(data.fusedBytes / 4 / comm.size) * comm.size);
  const part = fusedLength / comm.size;
  const make = (kind: string, p: ParamSet): Optimizer => (kind === 'adam' ? new Adam(p, { lr: 1e-3 }) : new SGD(p, { lr: 1e-3, momentum: kind === 'sgd-momentum' ? 0.9 : 0 }));
  for (const kind of data.optimizers) {
    const params = new ParamSet({ w: [fusedLength] }, { memory });
    fillDistinct(params.weights.array, 7, -1, 1);
    const opt = make(kind, params);
    // The unfused sharded sequence's own part: its gradient, weights and optimizer state.
    const own = new ParamSet({ w: [part] }, { memory });
    fillDistinct(own.weights.array, 8, -1, 1);
    const ownOpt = make(kind, own);
    const a: number[] = [];
    const f: number[] = [];
    const sh: number[] = [];
    const u: number[] = [];
    const us: number[] = [];
    const pr: number[] = [];
    const psr: number[] = [];
    for (let i = 0; i < data.warmup + Math.max(3, Math.ceil(data.reps / 3)); i++) {
      fillDistinct(params.grads.array, 11 + rank, -1e-3, 1e-3);
      await comm.barrier();
      let start = performance.now();
      await comm.allreduce(params.grads, { op: 'avg' });
      const ta = performance.now() - start;
      await comm.barrier();
      start = performance.now();
      await allreduceAndStep(comm, opt, data.guard ? { guard: data.guard } : {});
      const tf = performance.now() - start;
      await comm.barrier();
      start = performance.now();
      await allreduceAndStep(comm, opt, { update: 'sharded' });
      const ts = performance.now() - start;
      fillDistinct(params.grads.array, 11 + rank, -1e-3, 1e-3);
      await comm.barrier();
      start = performance.now();
      // As a careful user would: the reductions count non-finite values, so the step skips the guard's read.
      const reduced = await comm.allreduce(params.grads, { op: 'avg' });
      await opt.step({ gradChecked: reduced.nonFiniteCount === 0 });
      const tu = performance.now() - start;
      fillDistinct(params.grads.array, 11 + rank, -1e-3, 1e-3);
      await comm.barrier();
      start = performance.now();
      const scattered = await comm.reduceScatter(params.grads, own.grads, { op: 'avg' });
      await ownOpt.step({ gradChecked: scattered.nonFiniteCount === 0 });
      await comm.allgather(own.weights, params.weights);
      const tus = performance.now() - start;
      if (i >= data.warmup) {
        a.push(ta);
        f.push(tf);
        sh.push(ts);
        u.push(tu);
        us.push(tus);
        pr.push(tf / tu);
        psr.push(ts / tus);
      }
    }
    fused.push({ optimizer: kind, allreduceMs: median(a), fusedMs: median(f), shardedMs: median(sh), unfusedMs: median(u), unfusedShardedMs: median(us), unfusedPairedRatio: median(pr), unfusedShardedPairedRatio: median(psr) });
    opt.dispose();
    params.dispose();
    ownOpt.dispose();
    own.dispose();
  }
  let topk: AllreduceRankReport['topk'];
  if (data.topkDensity !== undefined) {
    const grad = memory.allocate(fusedLength);
    const residual = FlatBuffer.allocate(fusedLength);
    const a: number[] = [];
    const k: number[] = [];
    for (let i = 0; i < data.warmup + Math.max(3, Math.ceil(data.reps / 3)); i++) {
      fillDistinct(grad.array, 13 + rank, -1e-3, 1e-3);
      await comm.barrier();
      let start = performance.now();
      await comm.allreduce(grad, { op: 'avg' });
      const ta = performance.now() - start;
      fillDistinct(grad.array, 13 + rank, -1e-3, 1e-3);
      await comm.barrier();
      start = performance.now();
      await sparseAllreduce(comm, grad, { density: data.topkDensity, residual });
      const tk = performance.now() - start;
      if (i >= data.warmup) {
        a.push(ta);
        k.push(tk);
      }
    }
    topk = { density: data.topkDensity, allreduceMs: median(a), topkMs: median(k) };
    grad.dispose();
    residual.dispose();
  }
  await comm.barrier();
  let copy: { bytes: number; ms: number } | undefined;
  if (rank === 0) {
    const bytes = Math.max(...data.sizes, 1 << 20);
    const src = FlatBuffer.allocate(Math.floor(bytes / 4));
    const dst = FlatBuffer.allocate(src.length);
    fillDistinct(src.array, 3, -1, 1);
    fillDistinct(dst.array, 4, -1, 1);
    const times: number[] = [];
    for (let i = 0; i < data.warmup + data.reps; i++) {
      const start = performance.now();
      commAddon().copySingleThread(dst.handle, src.handle);
      if (i >= data.warmup) times.push(performance.now() - start);
    }
    copy = { bytes, ms: median(times) };
  }
  await comm.barrier();
  const report: AllreduceRankReport = { rows, fused, ...(copy ? { copy } : {}), ...(topk ? { topk } : {}) };
  if (comm instanceof UcxCommunicator) report.algorithm = comm.sharedMemoryCollectives > 0 ? 'direct' : 'ring';
  return report;
}

