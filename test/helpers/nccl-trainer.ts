/**
 * What the tests of DataParallelTrainer over a one-rank nccl communicator share: the cases of every
 * mode the nccl path runs (test/cuda/device.test.ts with host gradients, device-trainer.test.ts
 * and device-trainer-overlap.test.ts with device gradients), the training loops those two run on the
 * host and on the device, and the check that stands in for a `GPU:` test where no device is usable.
 */
import t, { type Test } from 'tap';

import { NcclCommunicator } from '../../dist/comm/nccl.js';
import { createRendezvous } from '../../dist/comm/rendezvous/rendezvous.js';
import type { DataParallelTrainer } from '../../dist/dataparallel/trainer.js';
import { cudaStatus, DeviceBuffer, probeNccl } from '../../dist/device/index.js';
import { BackendUnavailableError, type SapipeError } from '../../dist/errors.js';
import type { MLP } from '../../dist/nn/mlp.js';
import { fillUniform, rng, worstError } from './random.js';

/**
 * One case per mode the trainer runs over nccl (`sync` and the staleness-1 modes with the
 * overlapped update: the `prev-sync` estimate), plus `sapipe-wp` with compensation and Adam,
 * with `extra` (e.g. loss scaling) on that last one; several buckets each.
 */
export function ncclTrainerCases<Optimizer>(
  sgd: Optimizer,
  adam: Optimizer,
  buckets: { bucketBytes: number; firstBucketBytes: number },
  extra: { name: string; options: Record<string, unknown> } = { name: '', options: {} },
): [string, { mode: 'sync' | 'pipe-sgd' | 'sapipe-dc' | 'sapipe-wp'; optimizer: Optimizer } & Record<string, unknown>][] {
  return [
    ['sync', { mode: 'sync', optimizer: sgd, ...buckets }],
    ['pipe-sgd', { mode: 'pipe-sgd', optimizer: sgd, ...buckets }],
    ['sapipe-dc', { mode: 'sapipe-dc', optimizer: sgd, ...buckets }],
    ['sapipe-wp prev-sync', { mode: 'sapipe-wp', optimizer: sgd, estimate: 'prev-sync', ...buckets }],
    [`sapipe-wp prev-sync + DC, Adam${extra.name}`, { mode: 'sapipe-wp', optimizer: adam, estimate: 'prev-sync', compensation: {}, ...extra.options, ...buckets }],
  ];
}

/** A one-rank nccl communicator on cuda:0 with a rendezvous store of its own; `close()` ends both. */
export async function oneRankNccl(): Promise<{ comm: NcclCommunicator; close(): Promise<void> }> {
  const store = await createRendezvous({ rank: 0, worldSize: 1, port: 0, timeoutMs: 10_000 });
  try {
    const comm = await NcclCommunicator.create({ rank: 0, size: 1, device: 'cuda:0', store, timeoutMs: 10_000 });
    return {
      comm,
      close: async () => {
        comm.destroy();
        await store.close();
      },
    };
  } catch (error) {
    await store.close();
    throw error;
  }
}

/** Where cudaStatus() says no device is usable: allocating one must fail with the reason. */
export function assertNoUsableDevice(t: Test): void {
  try {
    DeviceBuffer.allocate(1, { device: 'cuda:0' });
    t.fail('a device buffer was allocated although cudaStatus() says no device is usable');
  } catch (error) {
    t.ok(error instanceof BackendUnavailableError, `no usable device, and the reason says why: ${String(error)}`);
  }
}

type Trainer = Awaited<ReturnType<typeof DataParallelTrainer.create>>;

/** What a training loop saw at every step. */
export interface Trace {
  losses: number[];
  weights: Float32Array[];
  forward: Float32Array[];
  results: unknown[];
}

/** The batches an MLP trains on, and the step whose gradient gets a NaN at flat element 5. */
export interface TrainingData {
  batch: number;
  batches: ReadonlyArray<{ x: Float32Array; labels: number[] }>;
  nanAt: number;
}

/** The CPU path: the host MLP through trainer.forwardWeights and trainer.grads, steps [from, from + steps). */
export async function runHost(model: MLP, trainer: Trainer, data: TrainingData, from: number, steps: number): Promise<Trace> {
  const trace: Trace = { losses: [], weights: [], forward: [], results: [] };
  for (let step = from; step < from + steps; step++) {
    const { x, labels } = data.batches[step % data.batches.length]!;
    trace.forward.push(trainer.forwardWeights.array.slice());
    model.forward(x, data.batch, trainer.forwardWeights);
    trace.losses.push(model.loss(labels));
    model.backward(trainer.grads);
    if (step === data.nanAt) trainer.grads.array[5] = Number.NaN;
    const r = await trainer.step();
    trace.results.push({ applied: r.applied, updated: r.updated, nonFiniteCount: r.nonFiniteCount, step: r.step });
    trace.weights.push(trainer.params.weights.array.slice());
  }
  return trace;
}

/**
 * The device path: the device MLP through trainer.deviceForwardWeights and trainer.deviceGrads; the
 * test reads the device to compare. `after(step)` runs after each step's backward (e.g. a second one).
 */
export async function runDevice(model: MLP, trainer: Trainer, data: TrainingData, from: number, steps: number, after?: (step: number) => void): Promise<Trace> {
  const trace: Trace = { losses: [], weights: [], forward: [], results: [] };
  const n = trainer.params.length;
  for (let step = from; step < from + steps; step++) {
    const { x, labels } = data.batches[step % data.batches.length]!;
    trace.forward.push(trainer.deviceForwardWeights.copyToHost(new Float32Array(n)));
    model.forwardLogits(x, data.batch, trainer.deviceForwardWeights);
    trace.losses.push(model.loss(labels));
    model.backward(trainer.deviceGrads);
    after?.(step);
    if (step === data.nanAt) trainer.deviceGrads.copyFromHost(Float32Array.of(Number.NaN), 5);
    const r = await trainer.step();
    trace.results.push({ applied: r.applied, updated: r.updated, nonFiniteCount: r.nonFiniteCount, step: r.step });
    trace.weights.push(trainer.deviceWeights.copyToHost(new Float32Array(n)));
  }
  return trace;
}

/** The worst ratio of |a - b| to abs + rel |b| over the steps' arrays. */
export function worstOf(a: Float32Array[], b: Float32Array[], abs: number, rel: number): number {
  let worst = 0;
  for (let i = 0; i < a.length; i++) worst = Math.max(worst, worstError(a[i]!, b[i]!, abs, rel).ratio);
  return worst;
}

/** `code: message` of what `fn` throws or rejects with, or 'ran'. */
export async function failure(fn: () => unknown): Promise<string> {
  try {
    await fn();
  } catch (error) {
    return `${(error as SapipeError).code}: ${(error as Error).message}`;
  }
  return 'ran';
}

/** A `GPU:` test: runs on a usable device with NCCL, else asserts why there is none. */
export function gpuTest(name: string, fn: (t: Test) => Promise<void>): void {
  t.test(`GPU: ${name}`, async (t) => {
    if (!cudaStatus().available) {
      assertNoUsableDevice(t);
      return;
    }
    const nccl = probeNccl();
    if (!nccl.available) {
      t.match(nccl.reason, /NCCL/, `NCCL is unavailable: ${nccl.reason ?? ''}`);
      return;
    }
    await fn(t);
  });
}

/**
 * The MLP the device-gradient tests train, on batches from a fixed seed, with SGD (momentum) or
 * Adam and several buckets (the MLP has 464 floats with padding: 128 bytes, then 512).
 */
export const MLP_SIZES = [13, 17, 9, 7] as const;
export const MLP_BATCH = 8;
export const MLP_SGD = { kind: 'sgd', lr: 0.05, momentum: 0.9 } as const;
export const MLP_ADAM = { kind: 'adam', lr: 0.003 } as const;
export const MLP_BUCKETS = { bucketBytes: 512, firstBucketBytes: 128 };
/** Five batches of MLP_BATCH samples, and the step whose gradient gets a NaN. */
export function mlpData(nanAt: number): TrainingData {
  const next = rng(11);
  const batches = Array.from({ length: 5 }, () => ({
    x: fillUniform(new Float32Array(MLP_BATCH * MLP_SIZES[0]), next),
    labels: Array.from({ length: MLP_BATCH }, () => Math.floor(next() * MLP_SIZES[MLP_SIZES.length - 1]!)),
  }));
  return { batch: MLP_BATCH, batches, nanAt };
}
