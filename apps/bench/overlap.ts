/**
 * `sapipe bench overlap`: what the staleness-1 modes' step() blocks, with the update applied at
 * step() (on the critical path) and overlapped (in the background behind its all-reduce), beside
 * the standalone update and all-reduce times measured in the same run. Ranks are worker threads
 * over the local backend.
 */
import { type DataParallelMode, spawnLocalRanks } from 'sapipe';
import type { OverlapRow, OverlapWorkerData } from './overlap-worker.js';

export type { OverlapRow } from './overlap-worker.js';

export interface OverlapBenchOptions {
  nproc: number;
  elements: number;
  modes: DataParallelMode[];
  optimizer: 'sgd' | 'adam';
  computeMs?: number;
  compute: 'sleep' | 'busy';
  steps: number;
  warmup: number;
  /** Both trainers clip the averaged gradient to this global norm. */
  clipGradNorm?: number | undefined;
  /** The trainers' guard (DataParallelTrainer's guard). */
  guard?: 'prescan' | 'deferred' | undefined;
}

export async function benchOverlap(o: OverlapBenchOptions): Promise<OverlapRow[]> {
  const ext = import.meta.url.endsWith('.ts') ? 'ts' : 'js';
  const workerData: Omit<OverlapWorkerData, 'sapipeLocal'> = {
    elements: o.elements,
    modes: o.modes,
    optimizer: o.optimizer,
    computeMs: o.computeMs,
    compute: o.compute,
    steps: o.steps,
    warmup: o.warmup,
    clipGradNorm: o.clipGradNorm,
    guard: o.guard,
  };
  const workers = spawnLocalRanks(new URL(`./overlap-worker.${ext}`, import.meta.url), o.nproc, { workerData });
  try {
    return await new Promise<OverlapRow[]>((resolve, reject) => {
      workers.forEach((w, rank) => {
        w.on('error', reject);
        w.on('message', (m: { error?: string; rows?: OverlapRow[] }) => {
          if (m.error) reject(new Error(`rank ${rank}: ${m.error}`));
          else if (rank === 0 && m.rows) resolve(m.rows);
        });
      });
    });
  } finally {
    await Promise.all(workers.map((w) => w.terminate()));
  }
}
