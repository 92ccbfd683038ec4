/**
 * What a checkpoint costs: the snapshot on the training thread (saveCheckpoint's exportState
 * copies, all the trainer waits for, into the previous snapshot's arrays) against a plain copy of
 * the same bytes into memory already touched, and the save's write rate against the disk's, both measured in the same run (a file
 * of the same size written and fsynced in the same directory).
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { monitorEventLoopDelay, performance } from 'node:perf_hooks';

import { DataParallelTrainer, InvalidArgumentError, LocalCommunicator, ParamSet, saveCheckpoint, writeAtomic } from 'sapipe';
import { checkInteger, describeValue } from 'sapipe/validate';
import { median } from './timing.js';

export interface CheckpointBenchOptions {
  /** Parameters of the model (one tensor). */
  elements: number;
  reps: number;
  /** Where the files go (default: a new directory under the system's temporary one, removed after). */
  dir?: string;
}

export interface CheckpointBenchResult {
  elements: number;
  /** Bytes the snapshot copies (weights and SGD's momentum). */
  snapshotBytes: number;
  /** Median ms of a copy of the same bytes into memory already touched. */
  memcpyMs: number;
  /** Median ms of the snapshot (exportState). */
  snapshotMs: number;
  /** snapshotMs / memcpyMs: the goal is at most 1.2. */
  snapshotRatio: number;
  /** Bytes of a checkpoint file, and the save's rate from the snapshot to the manifest on disk, MB/s. */
  fileBytes: number;
  saveMBps: number;
  /** The same bytes written and fsynced as one file in the same directory, MB/s. */
  diskMBps: number;
  /** saveMBps / diskMBps. */
  saveRatio: number;
  /**
   * The training thread's longest stall while a save was written in the background (the event
   * loop's largest delay between the snapshot and the manifest, ms): what a step could have
   * waited for beyond the snapshot. Median over the saves.
   */
  writeStallMs: number;
  dir: string;
}

export async function benchCheckpoint(options: CheckpointBenchOptions): Promise<CheckpointBenchResult> {
  const elements = checkInteger(options.elements, 'bench checkpoint: elements', 1, 1 << 30);
  const reps = checkInteger(options.reps, 'bench checkpoint: reps', 1, 1000);
  if (options.dir !== undefined && (typeof options.dir !== 'string' || options.dir === ''))
    throw new InvalidArgumentError(`bench checkpoint: dir must be a path, got ${describeValue(options.dir)}`);
  const base = options.dir ?? mkdtempSync(join(tmpdir(), 'sapipe-bench-ckpt-'));
  const comm = await LocalCommunicator.create({ group: `bench-checkpoint-${process.pid}`, rank: 0, size: 1 });
  const params = new ParamSet({ w: [elements] });
  try {
    const trainer = await DataParallelTrainer.create({ comm, params, mode: 'sync', optimizer: { kind: 'sgd', lr: 0.01, momentum: 0.9 } });
    try {
      params.weights.array.fill(0.5);
      params.grads.array.fill(0.01);
      await trainer.step(); // the momentum exists
      const snapshotBytes = 2 * 4 * params.length;
      const src = new Float32Array(2 * params.length).fill(1);
      const dst = new Float32Array(2 * params.length).fill(0);
      const copies: number[] = [];
      const snapshots: number[] = [];
      const saves: number[] = [];
      const disks: number[] = [];
      const stalls: number[] = [];
      let fileBytes = 0;
      // In turns: a copy of the bytes, a save (its snapshot timed on the way), the disk alone. The
      // first save is not counted: its snapshot fills fresh pages, the later ones reuse them.
      for (let r = 0; r < reps + 1; r++) {
        const t0 = performance.now();
        dst.set(src);
        const copy = performance.now() - t0;
        const save = await saveCheckpoint(trainer, { dir: join(base, 'ckpt'), keep: 1 });
        const delay = monitorEventLoopDelay({ resolution: 1 });
        delay.enable();
        const saved = await save.written;
        delay.disable();
        const stall = delay.max / 1e6;
        fileBytes = saved.bytes;
        const bytes = new Uint8Array(saved.bytes).fill(7);
        const t1 = performance.now();
        await writeAtomic(join(base, 'disk.bin'), [bytes]);
        const disk = saved.bytes / 1e6 / ((performance.now() - t1) / 1000);
        if (r === 0) continue;
        copies.push(copy);
        snapshots.push(save.snapshotMs);
        saves.push(saved.bytes / 1e6 / ((saved.writeMs - save.snapshotMs) / 1000));
        disks.push(disk);
        stalls.push(stall);
      }
      const memcpyMs = median(copies);
      const snapshotMs = median(snapshots);
      const saveMBps = median(saves);
      const diskMBps = median(disks);
      return { elements, snapshotBytes, memcpyMs, snapshotMs, snapshotRatio: snapshotMs / memcpyMs, fileBytes, saveMBps, diskMBps, saveRatio: saveMBps / diskMBps, writeStallMs: median(stalls), dir: base };
    } finally {
      await trainer.dispose();
    }
  } finally {
    params.dispose();
    comm.destroy();
    if (options.dir === undefined) rmSync(base, { recursive: true, force: true });
  }
}
