/**
 * The fused all-reduce + update: a ParamSet's gradients are averaged over the ranks in buckets
 * (default 25 MB, a smaller first bucket so the update can start early) and the optimizer's fused
 * kernel (update + compensation + prediction) runs on each bucket.
 *
 * All-or-nothing under the non-finite guard. A NaN/Inf found in a late bucket after earlier
 * buckets were updated would leave a half-applied step, and fp32 updates cannot be undone exactly.
 * So a bucket is updated only once the step is known to be finite, in one of two ways:
 *
 * - `guard: 'prescan'`: before any reduction each rank reads its local gradient once (a squared
 *   norm in double, which is non-finite iff an element is, and bounds every |g_i|); one tiny
 *   all-reduce of those norms tells every rank whether any input is non-finite or large enough
 *   that the sum of n of them could overflow fp32 (|g| > FLT_MAX/n). If neither, every reduced
 *   bucket is finite by construction, so bucket k is updated while bucket k+1 is still being
 *   reduced. A non-finite input skips the step on every rank before anything is reduced; a
 *   possible overflow falls back to `deferred`. Best where communication is slower than memory
 *   (a network transport, or `emulate`): the extra local read is hidden by the overlap.
 * - `guard: 'deferred'`: all buckets are reduced first (the reduction counts non-finite results as
 *   it writes them, so no extra read), then the update runs on the whole ParamSet in one call, or
 *   the step is skipped. No overlap of update and reduction, but no extra pass: best on the local
 *   backend, where reduction and update compete for the same memory bandwidth anyway. The default
 *   for `local` without emulation.
 *
 * Either way the reduced gradient is exact and the same on every rank, so every rank's update is
 * the reference update applied to the all-reduced average.
 */
import { InvalidArgumentError } from '../errors.js';
import { awaitNative, nativeAddon } from '../native.js';
import type { Optimizer, StepResult } from '../optim/optimizer.js';
import { ALIGN_ELEMENTS, FlatBuffer } from '../tensor.js';
import type { Communicator } from './communicator.js';

export const DEFAULT_BUCKET_BYTES = 25 * 1024 * 1024;
export const DEFAULT_FIRST_BUCKET_BYTES = 1024 * 1024;
const FLT_MAX = 3.4028234663852886e38;

export interface FusedStepOptions {
  /** Bytes per bucket (default 25 MB). */
  bucketBytes?: number;
  /** Bytes of the first bucket (default 1 MB). */
  firstBucketBytes?: number;
  /** How the step stays all-or-nothing (see above). Default: `deferred` on an un-emulated local backend, else `prescan`. */
  guard?: 'prescan' | 'deferred';
  /** This rank's local gradient (a copy: the all-reduce overwrites the ParamSet's grads), for the `local` estimates. */
  localGrad?: FlatBuffer;
}

export interface FusedStepResult extends StepResult {
  /** Buckets the gradient was reduced in. */
  buckets: number;
  guard: 'prescan' | 'deferred';
}

/** [offset, count] of each bucket over `length` floats; every boundary on a cache line. */
export function bucketRanges(length: number, bucketBytes = DEFAULT_BUCKET_BYTES, firstBucketBytes = DEFAULT_FIRST_BUCKET_BYTES): [number, number][] {
  for (const [v, what] of [[bucketBytes, 'bucketBytes'], [firstBucketBytes, 'firstBucketBytes']] as const)
    if (!Number.isInteger(v) || v < 64) throw new InvalidArgumentError(`${what} must be an integer of at least 64 bytes, got ${String(v)}`);
  const toElements = (bytes: number): number => Math.max(ALIGN_ELEMENTS, Math.floor(bytes / 4 / ALIGN_ELEMENTS) * ALIGN_ELEMENTS);
  const ranges: [number, number][] = [];
  let offset = 0;
  let size = toElements(firstBucketBytes);
  while (offset < length) {
    const count = Math.min(size, length - offset);
    ranges.push([offset, count]);
    offset += count;
    size = toElements(bucketBytes);
  }
  return ranges;
}

/**
 * Averages the optimizer's ParamSet gradients over the communicator's ranks and applies one
 * optimizer step, bucket by bucket. Every rank must call it with the same bucket options.
 */
export async function allreduceAndStep(comm: Communicator, optimizer: Optimizer, options: FusedStepOptions = {}): Promise<FusedStepResult> {
  if (options === null || typeof options !== 'object') throw new InvalidArgumentError('allreduceAndStep(options) must be an object');
  comm.checkLive('allreduceAndStep');
  const params = optimizer.params;
  params.checkLive('allreduceAndStep');
  const ranges = bucketRanges(params.length, options.bucketBytes, options.firstBucketBytes);
  const guard = options.guard ?? (comm.backend === 'local' && !comm.emulation ? 'deferred' : 'prescan');
  if (guard !== 'prescan' && guard !== 'deferred') throw new InvalidArgumentError(`allreduceAndStep: guard must be 'prescan' or 'deferred', got ${String(guard)}`);
  const grads = params.grads;
  const inputs = options.localGrad ? { localGrad: options.localGrad } : {};
  const addon = nativeAddon();

  if (guard === 'prescan') {
    const norm = FlatBuffer.allocate(ALIGN_ELEMENTS);
    let safe: boolean;
    try {
      const squared = addon.squaredNorm(grads.handle);
      const local = Math.sqrt(squared);
      // [0]: non-finite inputs; [1]: ranks whose inputs could overflow the sum. Summed over ranks.
      norm.array[0] = Number.isFinite(local) ? 0 : addon.countNonFinite(grads.handle);
      norm.array[1] = Number.isFinite(local) && local * comm.size >= FLT_MAX / 2 ? 1 : 0;
      await comm.allreduce(norm);
      if (norm.array[0]! > 0) {
        const step = optimizer.beginPartialStep(inputs);
        return { ...step.finish(false, norm.array[0]!), buckets: 0, guard };
      }
      safe = norm.array[1] === 0;
    } finally {
      norm.dispose();
    }
    if (safe) {
      const step = optimizer.beginPartialStep(inputs);
      const updates: Promise<unknown>[] = [];
      let failure: unknown;
      try {
        for (const [offset, count] of ranges) {
          await comm.allreduce(grads, { op: 'avg', offset, count });
          const config = { ...step.config, gradChecked: true };
          updates.push(awaitNative(addon.updateAsync(step.queue.handle, config, { ...step.buffers, offset, count })));
        }
      } catch (error) {
        failure = error;
      }
      const settled = await Promise.allSettled(updates);
      const bad = settled.find((s) => s.status === 'rejected');
      if (failure !== undefined || bad) {
        step.finish(false, 0);
        throw failure ?? (bad as PromiseRejectedResult).reason;
      }
      return { ...step.finish(true, 0), buckets: ranges.length, guard };
    }
  }
  // deferred: reduce every bucket (pipelined on the communicator's queue), then one update.
  const reductions = ranges.map(([offset, count]) => comm.allreduce(grads, { op: 'avg', offset, count }));
  const results = await Promise.all(reductions);
  const nonFinite = results.reduce((a, r) => a + r.nonFiniteCount, 0);
  const step = optimizer.beginPartialStep(inputs);
  if (nonFinite > 0) return { ...step.finish(false, nonFinite), buckets: ranges.length, guard: 'deferred' };
  try {
    const r = await awaitNative(addon.updateAsync(step.queue.handle, { ...step.config, gradChecked: true }, step.buffers));
    return { ...step.finish(r.applied, r.nonFiniteCount), buckets: ranges.length, guard: 'deferred' };
  } catch (error) {
    step.finish(false, 0);
    throw error;
  }
}
