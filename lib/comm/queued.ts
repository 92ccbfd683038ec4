/**
 * What the native backends share: a handle whose collectives run on one execution queue and whose
 * point-to-point operations run on one queue per peer and direction (a send waiting for its
 * receiver holds up nothing else). The handles' shape is in native-handle.ts.
 */
import { DisposedError, InvalidArgumentError } from '../errors.js';
import { awaitNative, callNative, nativeAddon, type NativeBufferHandle, type NativeClip, type NativeUpdateBuffers, type NativeUpdateConfig, type NativeUpdateResult, type QueueHandle } from '../native.js';
import { ExecutionQueue } from '../queue.js';
import { FlatBuffer } from '../tensor.js';
import { Communicator, DEFAULT_COMM_TIMEOUT_MS, type ReduceResult, type ShardedGuard, type ShardedStep, type ShardedStepResult } from './communicator.js';
import { partition } from './partition.js';
import { CollectiveKind, type QueuedCommHandle } from './native-handle.js';

/** @category Communication */
export abstract class QueuedCommunicator extends Communicator {
  /** @internal */
  protected readonly collectives = new ExecutionQueue();
  /** @internal The bound of one collective (the backend's timeoutMs): what a wait across queues scales with. */
  protected operationTimeoutMs = DEFAULT_COMM_TIMEOUT_MS;
  private readonly sendQueues = new Map<number, ExecutionQueue>();
  private readonly recvQueues = new Map<number, ExecutionQueue>();
  protected abstract readonly handle: QueuedCommHandle;

  /**
   * A zero-filled buffer of `length` floats in the memory this communicator's collectives handle
   * fastest; pass the communicator as a ParamSet's `memory` to put a model there. On `ucx` it is
   * shared memory: when every rank of a collective passes such a buffer and all ranks run on one
   * machine, each rank reads the others' buffers directly instead of receiving the bytes in
   * messages. On `local`, ranks share one address space already, and it is ordinary memory. Any
   * buffer works with every collective; the memory only changes the speed. The buffer outlives
   * destroy() and is freed by its dispose().
   */
  allocate(length: number): FlatBuffer {
    this.checkLive('allocate');
    return this.allocateBuffer(length);
  }
  protected allocateBuffer(length: number): FlatBuffer {
    return FlatBuffer.allocate(length);
  }

  protected override async releaseThreads(): Promise<void> {
    await closeQueues([this.collectives, ...this.sendQueues.values(), ...this.recvQueues.values()]);
  }

  /** Submits collective `kind` to the collectives' queue; resolves with its non-finite count. */
  protected abstract collective(kind: number, input: FlatBuffer | null, offset: number, count: number, output: FlatBuffer | null, scale?: number, root?: number): Promise<number>;

  protected async runAllreduce(buffer: FlatBuffer, offset: number, count: number, scale: number): Promise<ReduceResult> {
    return { nonFiniteCount: await this.collective(CollectiveKind.allreduce, buffer, offset, count, null, scale) };
  }
  protected async runReduceScatter(input: FlatBuffer, output: FlatBuffer, scale: number): Promise<ReduceResult> {
    return { nonFiniteCount: await this.collective(CollectiveKind.reduceScatter, input, 0, input.length, output, scale) };
  }
  protected async runAllgather(input: FlatBuffer, output: FlatBuffer): Promise<void> {
    await this.collective(CollectiveKind.allgather, input, 0, input.length, output);
  }
  protected async runBroadcast(buffer: FlatBuffer, root: number): Promise<void> {
    await this.collective(CollectiveKind.broadcast, buffer, 0, buffer.length, null, 1, root);
  }
  protected async runBarrier(): Promise<void> {
    await this.collective(CollectiveKind.barrier, null, 0, 0, null);
  }
  protected async runSend(buffer: FlatBuffer, peer: number): Promise<void> {
    const queue = queueFor(this.sendQueues, peer);
    await awaitNative(callNative(() => this.handle.send(queue.handle, buffer.handle, 0, buffer.length, peer)));
  }
  protected async runRecv(buffer: FlatBuffer, peer: number): Promise<void> {
    const queue = queueFor(this.recvQueues, peer);
    await awaitNative(callNative(() => this.handle.recv(queue.handle, buffer.handle, 0, buffer.length, peer)));
  }

  /**
   * The sharded update from in-place shard collectives: the ring reduce-scatter leaves this rank's
   * part of the gradient reduced (the other parts hold partial sums afterwards) and counts its
   * non-finite sums; one tiny all-reduce of those counts tells every rank whether the step is
   * finite (a NaN/Inf input or an overflowed sum shows up as a non-finite sum), so the step is
   * all-or-nothing without reading the gradient beforehand. Then the optimizer updates the own part
   * and ring all-gathers send every part's weights (and predicted weights) to every rank. The sums
   * are the ring all-reduce's, so the result equals the replicated update.
   */
  /**
   * @internal The sharded mode's fused step (see fused-step.ts): each rank averages its part
   * partition(count, size, rank) of every rank's gradient over buffers' [offset, offset + count),
   * updates its own weights and state there, and every rank receives every part's new weights (and
   * predicted weights). Resolves with the non-finite sums seen. Emulated as one all-reduce. The
   * host backends offer it (this class); nccl has its own sharded step on the GPU.
   */
  async shardedUpdate(step: ShardedStep, scale: number): Promise<ShardedStepResult> {
    this.checkLive('shardedUpdate');
    return this.emulated('allreduce', step.grads.length * 4, () => this.runShardedUpdate(step, scale));
  }

  /**
   * @internal Whether every peer is reached at memory speed (no network between the ranks, no
   * emulation): there a bucket's update cannot hide behind the next bucket's reduction, which
   * competes for the same memory, so allreduceAndStep's default guard is 'deferred'.
   */
  get memorySpeedLinks(): boolean {
    return false;
  }

  /**
   * @internal Whether this backend runs the replicated fused step in two passes of its own
   * (replicatedReduce, replicatedApply), so that the reduced gradient is not copied to every rank
   * and read back.
   */
  get fusesReplicatedUpdate(): boolean {
    return false;
  }

  /**
   * @internal The replicated fused step's first pass where {@link fusesReplicatedUpdate}: a
   * reduce-scatter in place over the whole of `grads` that leaves this rank's part averaged (times
   * `scale`) and resolves with the non-finite sums of every rank (the same count everywhere, so a
   * step is skipped on every rank or on none).
   */
  async replicatedReduce(grads: FlatBuffer, scale: number): Promise<number> {
    this.checkLive('replicatedReduce');
    return this.runReplicatedReduce(grads, scale);
  }
  /**
   * @internal The second pass, after a first that found every sum finite: every rank updates its
   * whole state (step.buffers, the whole ParamSet), reading part q of the averaged gradient where
   * rank q left it (ReduceUpdateJob in native/comm/collective.h). Afterwards the gradient buffer
   * holds this rank's part averaged and the rest as it was.
   */
  async replicatedApply(step: ShardedStep): Promise<void> {
    this.checkLive('replicatedApply');
    const offset = step.buffers.offset ?? 0;
    const count = step.buffers.count ?? step.grads.length - offset;
    if (offset !== 0 || count !== step.grads.length)
      throw new InvalidArgumentError('replicatedApply: the two-pass step covers the whole ParamSet; pass its whole buffers');
    return this.runReplicatedApply(step);
  }
  protected runReplicatedReduce(_grads: FlatBuffer, _scale: number): Promise<number> {
    return Promise.reject(new InvalidArgumentError(`replicatedReduce: the ${this.backend} backend has no fused replicated step; use allreduceAndStep`));
  }
  protected runReplicatedApply(_step: ShardedStep): Promise<void> {
    return Promise.reject(new InvalidArgumentError(`replicatedApply: the ${this.backend} backend has no fused replicated step; use allreduceAndStep`));
  }

  /** @internal In place: every rank's part partition(length, size, rank) of buffer is copied to every rank. */
  async allgatherShards(buffer: FlatBuffer): Promise<void> {
    this.checkLive('allgatherShards');
    if (!(buffer instanceof FlatBuffer)) throw new InvalidArgumentError('allgatherShards(buffer) must be a FlatBuffer');
    if (buffer.disposed) throw new DisposedError('allgatherShards(buffer) was disposed; allocate a new buffer');
    await this.emulated('allgather', buffer.length * 4, () => this.runAllgatherShards(buffer));
  }

  /**
   * @internal The overlapped staleness-1 step's native chain (see fused-step.ts): the average of
   * `grads` over the ranks in the buckets `ranges`, then the update `config`/`buffers`, queued back
   * to back on the collectives' queue. The update starts the moment the last bucket lands, without
   * a turn of the JavaScript thread (which is busy computing the caller's next gradient), and the
   * next collective waits for it. A failed reduction fails the update too, before it writes
   * anything. Undefined under network emulation, whose delays are timers on the JavaScript thread:
   * the caller then chains the two itself.
   */
  reduceThenUpdate(
    grads: FlatBuffer,
    ranges: readonly (readonly [number, number])[],
    config: NativeUpdateConfig,
    buffers: NativeUpdateBuffers,
    clip?: NativeClip,
  ): { reductions: Promise<ReduceResult>[]; update: Promise<NativeUpdateResult> } | undefined {
    this.checkLive('reduceThenUpdate');
    if (this.emulation) return undefined;
    if (grads.disposed) throw new DisposedError('reduceThenUpdate(grads) was disposed; allocate a new buffer');
    // A signal behind each bucket's reduction: the update reads the last slot (already set when it
    // runs: same queue), so a failed reduction fails it before it writes.
    const latch = FlatBuffer.allocate(Math.max(1, ranges.length));
    const reductions: Promise<ReduceResult>[] = [];
    const signals: Promise<unknown>[] = [];
    let update: Promise<NativeUpdateResult>;
    try {
      ranges.forEach(([offset, count], k) => {
        reductions.push(this.runAllreduce(grads, offset, count, 1 / this.size));
        signals.push(this.signalAfter(latch, k));
      });
      const wait = ranges.length > 0 ? this.latchWait(latch, ranges.length - 1) : undefined;
      update = awaitNative(callNative(() => nativeAddon().updateAsync(this.collectives.handle, config, buffers, clip, undefined, wait)));
    } catch (error) {
      // The update's buffers failed their native checks after the buckets were queued: those
      // finish on their own, and their outcome no longer matters to anyone.
      for (const p of [...reductions, ...signals]) p.catch(() => undefined);
      disposeWhenSettled(latch, signals);
      throw error;
    }
    disposeWhenSettled(latch, [update, ...signals]);
    return { reductions, update };
  }

  /**
   * @internal This rank's half of the `prescan` guard: guardAsync of `grads` into `gate[0..1]` (its
   * non-finite count, and whether a sum over the ranks could overflow), queued on the collectives'
   * queue, so behind any collective still writing `grads`. The caller all-reduces `gate` (a sum).
   */
  queueGuard(grads: FlatBuffer, gate: FlatBuffer): Promise<void> {
    this.checkLive('guard');
    return awaitNative(callNative(() => nativeAddon().guardAsync(this.collectives.handle, grads.handle, gate.handle, this.size)));
  }

  /**
   * @internal The overlapped staleness-1 step with each bucket updated as soon as it lands (guard
   * `prescan`; see fused-step.ts), without a turn of the JavaScript thread. On the collectives'
   * queue: this rank's guard of `grads` into `gate` (guardAsync: its non-finite count and overflow
   * risk), a sum all-reduce of `gate` (the verdict, the same on every rank), then each bucket's
   * average followed by a signal of its slot in `latch`. On `updateQueue` (another thread: the
   * collectives' queue is blocked by each reduction while it runs): each bucket's update, waiting
   * for its slot and gated by the verdict, so update k runs while bucket k+1 is reduced and every
   * bucket of every rank updates or none does. `latch` holds a zero per bucket plus one. A failed
   * collective releases no later update: each fails, writing nothing (buckets updated before it
   * stay updated). Undefined under network emulation (its delays are timers on the JavaScript
   * thread).
   */
  reduceAndUpdateByBucket(
    grads: FlatBuffer,
    ranges: readonly (readonly [number, number])[],
    config: NativeUpdateConfig,
    buffers: NativeUpdateBuffers,
    gate: FlatBuffer,
    latch: FlatBuffer,
    updateQueue: QueueHandle,
  ): { queued: Promise<unknown>[]; reductions: Promise<ReduceResult>[]; updates: Promise<NativeUpdateResult>[] } | undefined {
    this.checkLive('reduceAndUpdateByBucket');
    if (this.emulation) return undefined;
    for (const b of [grads, gate, latch]) if (b.disposed) throw new DisposedError('reduceAndUpdateByBucket: a buffer was disposed; allocate a new one');
    if (latch.length < ranges.length + 1) throw new InvalidArgumentError('reduceAndUpdateByBucket: the latch needs a slot per bucket, plus one');
    const queued: Promise<unknown>[] = [this.queueGuard(grads, gate)];
    const reductions: Promise<ReduceResult>[] = [];
    const updates: Promise<NativeUpdateResult>[] = [];
    try {
      // Slot 0 vouches for the verdict's all-reduce, slot k + 1 for bucket k's reduction: a signal
      // behind a failed collective, or behind a slot so marked, marks its slot failed (-1), so no
      // update runs on a verdict or a bucket that was not reduced.
      queued.push(this.runAllreduce(gate, 0, gate.length, 1));
      queued.push(this.signalAfter(latch, 0));
      ranges.forEach(([offset, count], k) => {
        reductions.push(this.runAllreduce(grads, offset, count, 1 / this.size));
        queued.push(this.signalAfter(latch, k + 1));
        const wait = this.latchWait(latch, k + 1);
        updates.push(awaitNative(callNative(() => nativeAddon().updateAsync(updateQueue, config, { ...buffers, offset, count }, undefined, gate.handle, wait))));
      });
    } catch (error) {
      // Refused after earlier operations were queued: those finish on their own (an update whose
      // signal was never queued times out), and their outcome no longer matters to anyone (the
      // caller fails the step).
      for (const p of [...queued, ...reductions, ...updates]) p.catch(() => undefined);
      throw error;
    }
    return { queued, reductions, updates };
  }

  /**
   * Queues a signal of `latch[slot]` on the collectives' queue (latchSignalAsync): 1 releases the
   * updates waiting on it; -1, when the collective just before it failed (or slot - 1 is -1), fails
   * them before they write.
   */
  private signalAfter(latch: FlatBuffer, slot: number): Promise<unknown> {
    return awaitNative(callNative(() => nativeAddon().latchSignalAsync(this.collectives.handle, latch.handle, slot)));
  }

  /**
   * An update's wait for `latch[slot]`, bounded from now: each collective queued before the
   * signal has its own deadline from its submission (now), so the signal comes within about one
   * timeout, or is dropped (-1).
   */
  private latchWait(latch: FlatBuffer, slot: number): { latch: NativeBufferHandle; slot: number; timeoutMs: number } {
    return { latch: latch.handle, slot, timeoutMs: Math.min(2 ** 31 - 1, 2 * this.operationTimeoutMs) };
  }

  /** @internal See ShardedGuard. */
  get shardedGuard(): ShardedGuard {
    return 'reduced';
  }
  protected async runShardedUpdate(step: ShardedStep, scale: number): Promise<ShardedStepResult> {
    const n = step.grads.length;
    const own = await this.collective(CollectiveKind.reduceScatterInPlace, step.grads, 0, n, null, scale);
    const count = FlatBuffer.allocate(1);
    let nonFinite: number;
    try {
      count.array[0] = own;
      await this.collective(CollectiveKind.allreduce, count, 0, 1, null);
      nonFinite = count.array[0]!;
    } finally {
      count.dispose();
    }
    if (nonFinite > 0) return { applied: false, nonFiniteCount: nonFinite };
    const [lo, hi] = partition(n, this.size, this.rank);
    if (hi > lo) await awaitNative(callNative(() => nativeAddon().updateAsync(step.queue.handle, step.config, { ...step.buffers, offset: lo, count: hi - lo })));
    await this.collective(CollectiveKind.allgatherInPlace, step.weights, 0, n, null);
    if (step.predicted) await this.collective(CollectiveKind.allgatherInPlace, step.predicted, 0, n, null);
    return { applied: true, nonFiniteCount: 0 };
  }
  protected async runAllgatherShards(buffer: FlatBuffer): Promise<void> {
    await this.collective(CollectiveKind.allgatherInPlace, buffer, 0, buffer.length, null);
  }
}

/** @internal */
export async function closeQueues(queues: Iterable<ExecutionQueue>): Promise<void> {
  await Promise.all([...queues].map((q) => q.close()));
}

function queueFor(map: Map<number, ExecutionQueue>, peer: number): ExecutionQueue {
  let q = map.get(peer);
  if (!q) {
    q = new ExecutionQueue();
    map.set(peer, q);
  }
  return q;
}

/** Frees `buffer` once every operation holding it has settled (each lets go as it settles). */
function disposeWhenSettled(buffer: FlatBuffer, holders: readonly Promise<unknown>[]): void {
  void Promise.allSettled(holders).then(() => {
    try {
      buffer.dispose();
    } catch {
      // still held (an operation dropped unrun at teardown): collected with its handle
    }
  });
}
