/**
 * What the tests of DataParallelTrainer over a one-rank nccl communicator share: the cases of every
 * mode the nccl path runs (test/cuda/device.test.ts with host gradients, device-trainer.test.ts
 * with device gradients), and the check that stands in for a `GPU:` test where no device is usable.
 */
import type { Test } from 'tap';

import { DeviceBuffer } from '../../dist/device/index.js';
import { BackendUnavailableError } from '../../dist/errors.js';

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

/** Where cudaStatus() says no device is usable: allocating one must fail with the reason. */
export function assertNoUsableDevice(t: Test): void {
  try {
    DeviceBuffer.allocate(1, { device: 'cuda:0' });
    t.fail('a device buffer was allocated although cudaStatus() says no device is usable');
  } catch (error) {
    t.ok(error instanceof BackendUnavailableError, `no usable device, and the reason says why: ${String(error)}`);
  }
}
