/**
 * One rank of `sapipe bench overlap` (a worker thread of the local backend); rank 0 posts the rows.
 * Per staleness-1 mode: the standalone update and the all-reduce timed alone, then the training
 * loop (compute, then step()) with the update applied at step() and overlapped, timing what step()
 * blocks.
 */
import { parentPort, workerData } from 'node:worker_threads';
import { performance } from 'node:perf_hooks';

import { Adam, type DataParallelMode, DataParallelTrainer, LocalCommunicator, type LocalRankData, ParamSet, resolveMode, SGD } from 'sapipe';
import { fillDistinct } from './kernels.js';
import { median } from './timing.js';

export interface OverlapWorkerData extends LocalRankData {
  elements: number;
  modes: DataParallelMode[];
  optimizer: 'sgd' | 'adam';
  /** Compute per step in ms; undefined: 1.25 x (all-reduce + update), measured. */
  computeMs: number | undefined;
  /** `sleep`: the compute leaves the cores free (an accelerator's forward/backward); `busy`: it spins one core. */
  compute: 'sleep' | 'busy';
  steps: number;
  warmup: number;
  /** Both trainers clip the averaged gradient to this global norm (DataParallelTrainer's clipGradNorm). */
  clipGradNorm?: number | undefined;
  /** Both trainers' guard (DataParallelTrainer's guard; the update at step() has none to choose). */
  guard?: 'prescan' | 'deferred' | undefined;
}

export interface OverlapRow {
  mode: DataParallelMode;
  updateMs: number;
  allreduceMs: number;
  computeMs: number;
  /** Median time step() blocked, update at step() / overlapped. */
  atStepMs: number;
  overlappedMs: number;
  /** Median time of a whole iteration (compute + step), both ways. */
  atStepIterationMs: number;
  overlappedIterationMs: number;
}

const data = workerData as OverlapWorkerData;
const { group, rank, size } = data.sapipeLocal;
const sleeper = new Int32Array(new SharedArrayBuffer(4));

function compute(ms: number): void {
  if (data.compute === 'sleep') Atomics.wait(sleeper, 0, 0, ms);
  else {
    const end = performance.now() + ms;
    while (performance.now() < end);
  }
}

async function main(): Promise<void> {
  const comm = await LocalCommunicator.create({ group, rank, size });
  const params = new ParamSet({ w: [data.elements] }, { memory: comm });
  fillDistinct(params.weights.array, 1 + rank, -1, 1);
  const optimizer = data.optimizer === 'sgd' ? ({ kind: 'sgd', lr: 1e-6, momentum: 0.9 } as const) : ({ kind: 'adam', lr: 1e-6 } as const);
  const rows: OverlapRow[] = [];
  for (const mode of data.modes) {
    // The update alone: the mode's optimizer (compensation, prediction) on this rank's ParamSet.
    const resolved = resolveMode({ mode }, size);
    const extra = { ...(resolved.compensation ? { compensation: resolved.compensation } : {}), ...(resolved.prediction ? { prediction: resolved.prediction } : {}) };
    const { kind, ...options } = optimizer;
    const alone = kind === 'sgd' ? new SGD(params, { ...options, ...extra }) : new Adam(params, { ...options, ...extra });
    fillDistinct(params.grads.array, 2 + rank, 1e-4, 1e-3);
    const updates: number[] = [];
    const reductions: number[] = [];
    for (let i = 0; i < 3 + data.warmup; i++) {
      await comm.barrier();
      let start = performance.now();
      alone.stepSync();
      if (i >= data.warmup) updates.push(performance.now() - start);
      await comm.barrier();
      start = performance.now();
      await comm.allreduce(params.grads, { op: 'avg' });
      if (i >= data.warmup) reductions.push(performance.now() - start);
    }
    alone.dispose();
    const updateMs = median(updates);
    const allreduceMs = median(reductions);
    const computeMs = data.computeMs ?? 1.25 * (allreduceMs + updateMs);
    const timed: Record<'true' | 'false', { step: number[]; iteration: number[] }> = { true: { step: [], iteration: [] }, false: { step: [], iteration: [] } };
    for (const overlap of [false, true]) {
      const trainer = await DataParallelTrainer.create({
        comm,
        params,
        mode,
        optimizer,
        overlapUpdate: overlap,
        broadcastWeights: false,
        ...(data.clipGradNorm !== undefined ? { clipGradNorm: data.clipGradNorm } : {}),
        ...(data.guard !== undefined ? { guard: data.guard } : {}),
      });
      await comm.barrier();
      for (let i = 0; i < data.warmup + data.steps; i++) {
        const start = performance.now();
        compute(computeMs);
        fillDistinct(trainer.grads.array.subarray(0, 16), i, 1e-4, 1e-3);
        const before = performance.now();
        await trainer.step();
        const end = performance.now();
        if (i >= data.warmup) {
          timed[`${overlap}`].step.push(end - before);
          timed[`${overlap}`].iteration.push(end - start);
        }
      }
      await trainer.flush();
      await trainer.dispose();
    }
    rows.push({
      mode,
      updateMs,
      allreduceMs,
      computeMs,
      atStepMs: median(timed.false.step),
      overlappedMs: median(timed.true.step),
      atStepIterationMs: median(timed.false.iteration),
      overlappedIterationMs: median(timed.true.iteration),
    });
  }
  params.dispose();
  comm.destroy();
  if (rank === 0) parentPort!.postMessage({ rows });
}

main().catch((e: unknown) => parentPort!.postMessage({ error: String(e) }));
