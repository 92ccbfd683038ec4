/**
 * The data-parallel trainer's device side over the `nccl` backend: the weights and the optimizer
 * state live on this rank's GPU, where NCCL averages the gradient and the fused CUDA kernel
 * applies it. Two sources of gradients:
 *
 * - from the host (the default: a model computing on the CPU, tfjs): its forward pass reads host
 *   weights, its backward pass writes a host gradient; per update the host gradient goes to the
 *   device and the new weights (and predicted weights) come back; in the staleness-1 modes all of
 *   it is queued on the communicator and runs while the caller computes the next gradient
 *   (NcclCommunicator.startOverlappedStep).
 * - from the device (`device: 'cuda:N'`, e.g. an MLP built with that device): the backward pass
 *   writes the set's device gradient, the forward pass reads the device weights (or predicted
 *   weights), and nothing crosses to the host inside a step. In the staleness-1 modes the set has
 *   two gradient buffers: the one under reduction, and the one the next backward pass writes.
 *
 * Which copy is current: the device's weights and optimizer state are the truth. With host
 * gradients the host weights (and host predicted weights) are copies of the device's, refreshed
 * by every update; with device gradients they are refreshed only on request (copyToHost,
 * exportState). The host optimizer's other state buffers are refreshed only by stateToHost().
 *
 * Ordering on a GPU: the model's operations run on the device's legacy default stream, the NCCL
 * step on the communicator's own (non-blocking) streams, which do not wait for it. Two ways to
 * order them, chosen when the trainer is made (`overlapBackward`):
 *
 * - following the backward (a model that reports its progress, GradientListener): the replica's
 *   BackwardBuckets records each bucket's event on the default stream once the backward has
 *   enqueued all of that bucket, and the NCCL step's reduction of the bucket waits for its event
 *   on the GPU: bucket k is reduced while the backward still computes the layers below it, and the
 *   host never waits for the backward. Each gradient buffer has its own events (two buffers in the
 *   staleness-1 modes), so the events a queued step waits on are not recorded again meanwhile.
 * - after the backward (any other model): waitForModel() waits for the default stream (a
 *   synchronous copy of one float on it) before the step starts.
 *
 * Either way the NCCL step is complete before its promise settles, and the next forward pass reads
 * its weights only after that.
 */
import { BackendUnavailableError, InvalidArgumentError } from '../errors.js';
import { checkSameLayout } from './layout-check.js';
import { DeviceBuffer, DeviceParamSet } from '../device/index.js';
import type { NcclCommunicator, NcclStepResultInfo } from '../comm/nccl.js';
import type { Optimizer, StepResult } from '../optim/optimizer.js';
import { FlatBuffer, type ParamSet } from '../tensor.js';
import { bucketRanges } from '../comm/buckets.js';
import { BackwardBuckets } from './backward-buckets.js';

/** @internal Bucket sizes of the device step (the NCCL step's own options). */
export interface DeviceBucketOptions {
  bucketBytes?: number | undefined;
  firstBucketBytes?: number | undefined;
}

/** @internal See the file comment. */
export class DeviceReplica {
  private constructor(
    private readonly comm: NcclCommunicator,
    private readonly set: DeviceParamSet,
    /** Out-of-place steps: what the step in flight writes (the set's current buffers are only read). */
    private spareWeights: DeviceBuffer | undefined,
    private sparePredicted: DeviceBuffer | undefined,
    /** Device gradients in the staleness-1 modes: the buffer that is not the set's (under reduction, or idle). */
    private otherGrads: DeviceBuffer | undefined,
    /** Device gradients in the staleness-1 modes: the copy of the weights the queued step reads (see startOverlappedOnDevice). */
    private readonly weightsIn: DeviceBuffer | undefined,
    /** Whether the backward pass writes the set's device gradient (else the host's is staged in). */
    readonly deviceGrads: boolean,
    /** Device gradients reduced behind the backward, bucket by bucket (see the file comment); undefined: after it. */
    private readonly backward: BackwardBuckets | undefined,
  ) {}

  /** Whether each bucket is reduced behind the backward pass (the model reports its progress to reportGradients). */
  get followsBackward(): boolean {
    return this.backward !== undefined;
  }

  /** The model's GradientListener, when the replica follows the backward. */
  reportGradients(grads: unknown, offset: number, count: number): void {
    this.backward?.report(grads, offset, count);
  }

  /** The device copy of the ParamSet (weights, gradients, optimizer state). */
  get deviceSet(): DeviceParamSet {
    return this.set;
  }

  /**
   * The trainer's creation collectives over nccl, on device buffers: every rank's ParamSet layout
   * is compared (layout-check.ts), then whether each follows the backward (`followBackward`: the
   * two steps issue their collectives in another order, so every rank must take the same one;
   * InvalidArgumentError on every rank otherwise), and rank 0's weights are broadcast into every
   * rank's host ParamSet.
   */
  static async checkLayoutAndBroadcast(comm: NcclCommunicator, params: ParamSet, broadcast: boolean, followBackward = false): Promise<void> {
    const device = { device: comm.device };
    await checkSameLayout(
      params,
      comm.size,
      async (words) => {
        const mine = DeviceBuffer.from(words, device);
        const all = DeviceBuffer.allocate(words.length * comm.size, device);
        try {
          await comm.allgather(mine, all);
          return all.copyToHost();
        } finally {
          mine.dispose();
          all.dispose();
        }
      },
      'DataParallelTrainer.create',
    );
    if (comm.size > 1) {
      const mine = DeviceBuffer.from(Float32Array.of(followBackward ? 1 : 0), device);
      const all = DeviceBuffer.allocate(comm.size, device);
      let choices: Float32Array;
      try {
        await comm.allgather(mine, all);
        choices = all.copyToHost();
      } finally {
        mine.dispose();
        all.dispose();
      }
      const differs = choices.findIndex((c) => c !== choices[0]);
      if (differs >= 0)
        throw new InvalidArgumentError(
          `DataParallelTrainer.create: rank 0 ${choices[0] ? 'reduces each bucket behind the backward' : 'waits for the whole backward'} and rank ${differs} does not; the two issue their collectives in another order, so every rank must make the same choice (the same model kind, or the same overlapBackward)`,
        );
    }
    if (!broadcast) return;
    const weights = DeviceBuffer.from(params.weights, device);
    try {
      await comm.broadcast(weights, 0);
      weights.copyToHost(params.weights);
    } finally {
      weights.dispose();
    }
  }

  /**
   * Moves the ParamSet's weights and the optimizer's state to the communicator's device. With
   * `deviceGrads` the backward pass writes the device gradient; `outOfPlace` (the staleness-1
   * modes) then also allocates the second gradient buffer. `followBackward` (device gradients
   * only): the step's buckets, reduced each behind the backward (see the file comment).
   */
  static create(
    comm: NcclCommunicator,
    params: ParamSet,
    optimizer: Optimizer,
    outOfPlace: boolean,
    deviceGrads = false,
    followBackward?: DeviceBucketOptions,
  ): DeviceReplica {
    const set = DeviceParamSet.create(params, { device: comm.device, optimizer });
    const made: DeviceBuffer[] = [];
    let backward: BackwardBuckets | undefined;
    try {
      const spare = (): DeviceBuffer => {
        const b = DeviceBuffer.allocate(set.length, { device: comm.device });
        made.push(b);
        return b;
      };
      const spareWeights = outOfPlace ? spare() : undefined;
      const sparePredicted = outOfPlace && set.stateBuffer('predicted') ? spare() : undefined;
      const otherGrads = outOfPlace && deviceGrads ? spare() : undefined;
      const weightsIn = outOfPlace && deviceGrads ? spare() : undefined;
      if (deviceGrads && followBackward) {
        const ranges = bucketRanges(set.length, followBackward.bucketBytes, followBackward.firstBucketBytes);
        backward = new BackwardBuckets(params, ranges, otherGrads ? [set.grads, otherGrads] : [set.grads], comm.device);
      }
      return new DeviceReplica(comm, set, spareWeights, sparePredicted, otherGrads, weightsIn, deviceGrads, backward);
    } catch (error) {
      backward?.dispose();
      for (const b of made) b.dispose();
      set.dispose();
      throw error;
    }
  }

  /**
   * `sync`: the bucketed fused all-reduce and update on the device, run to completion. With host
   * gradients the host gradient goes to the device first and the new weights come back after.
   */
  async syncStep(buckets: DeviceBucketOptions): Promise<NcclStepResultInfo> {
    const ready = this.backward?.take(this.set.grads);
    if (!this.deviceGrads) this.set.copyGradsFromHost();
    else if (!ready) this.waitForModel();
    const r = await this.comm.allreduceAndStepAfter(
      this.set,
      {
        ...(buckets.bucketBytes === undefined ? {} : { bucketBytes: buckets.bucketBytes }),
        ...(buckets.firstBucketBytes === undefined ? {} : { firstBucketBytes: buckets.firstBucketBytes }),
      },
      ready,
    );
    if (r.applied && !this.deviceGrads) this.set.weights.copyToHost(this.set.params.weights);
    return r;
  }

  /**
   * Device gradients, the staleness-1 modes: the out-of-place step of the set's device gradient,
   * queued (see NcclCommunicator.startOverlappedStep); its new weights (and predicted weights) land
   * in this replica's spare device buffers, put in place by swap(). The set then holds the other
   * gradient buffer, for the next backward pass: the caller has collected the step before this one,
   * so that buffer is no longer read.
   *
   * The step reads a copy of the weights (`weightsIn`), not the set's: a queued operation holds
   * every buffer it uses until it settles (ERR_BUSY for any other use, reads included), and the
   * forward passes of the next gradient read the set's weights while this step runs. After the
   * backward (see the file comment), the copy (device to device, synchronous on the default
   * stream) also waits for the backward pass that wrote the gradient. Following the backward, the
   * copy is enqueued on the default stream behind it, and bucket 0's event recorded again after
   * the copy: bucket 0 is reduced last and every update follows its reduction, so no update reads
   * the copy before it is done, and the host does not wait.
   */
  startOverlappedOnDevice(gradScaleFactor: number, buckets: DeviceBucketOptions): Promise<StepResult> {
    const ready = this.backward?.take(this.set.grads);
    if (ready) {
      this.weightsIn!.copyFromEnqueued(this.set.weights);
      ready.record(0);
    } else this.weightsIn!.copyFrom(this.set.weights);
    const done = this.comm.startOverlappedStep(this.set, {
      ready,
      deviceWeightsIn: this.weightsIn,
      deviceWeights: this.spareWeights!,
      devicePredicted: this.sparePredicted,
      gradScaleFactor,
      bucketBytes: buckets.bucketBytes,
      firstBucketBytes: buckets.firstBucketBytes,
    });
    this.otherGrads = this.set.exchangeGrads(this.otherGrads!);
    return done;
  }

  /**
   * Waits until the device operations enqueued so far on the device's default stream (the
   * model's forward and backward passes) have finished: a synchronous copy of one float on that
   * stream. The communicator's streams do not wait for the default stream by themselves.
   */
  private waitForModel(): void {
    this.set.grads.copyToHost(this.probe);
  }
  private readonly probe = new Float32Array(1);

  /** Device gradients: the current device weights into the host ParamSet's weights. */
  weightsToHost(): void {
    this.set.weights.copyToHost(this.set.params.weights);
  }

  /** Device gradients: the weights (and predicted weights) of the update applied ahead, into host arrays (reused when given at the right length). */
  aheadToHost(reuse: { weights?: Float32Array | undefined; predicted?: Float32Array | null | undefined } | undefined): { weights: Float32Array; predicted: Float32Array | null } {
    const n = this.set.params.length;
    const into = (old: Float32Array | null | undefined): Float32Array => (old instanceof Float32Array && old.length === n ? old : new Float32Array(n));
    return {
      weights: this.spareWeights!.copyToHost(into(reuse?.weights)),
      predicted: this.sparePredicted ? this.sparePredicted.copyToHost(into(reuse?.predicted)) : null,
    };
  }

  /** Device gradients: zeroes the device gradient the next backward pass writes (zeros copied from the host). */
  zeroGrads(): void {
    this.set.grads.copyFromHost(new Float32Array(this.set.length));
    this.backward?.markWritten(this.set.grads);
  }

  /**
   * The staleness-1 modes: the out-of-place step of `hostGrads`, queued (see
   * NcclCommunicator.startOverlappedStep); its new weights land in `hostWeights` (and
   * `hostPredicted`) and in this replica's spare device buffers, put in place by swap().
   */
  startOverlapped(hostGrads: FlatBuffer, hostWeights: FlatBuffer, hostPredicted: FlatBuffer | undefined, gradScaleFactor: number, buckets: DeviceBucketOptions): Promise<StepResult> {
    return this.comm.startOverlappedStep(this.set, {
      hostGrads,
      hostWeights,
      hostPredicted,
      deviceWeights: this.spareWeights!,
      devicePredicted: this.sparePredicted,
      gradScaleFactor,
      bucketBytes: buckets.bucketBytes,
      firstBucketBytes: buckets.firstBucketBytes,
    });
  }

  /** After an applied out-of-place step: its outputs become the current device buffers. */
  swap(): void {
    this.spareWeights = this.set.exchangeWeights(this.spareWeights!);
    if (this.sparePredicted) this.sparePredicted = this.set.exchangeStateBuffer('predicted', this.sparePredicted);
  }

  /** The device optimizer state into the host optimizer's buffers (weights are current on the host already). */
  stateToHost(): void {
    const optimizer = this.set.optimizer!;
    for (const name of optimizer.stateNames) this.set.stateBuffer(name)!.copyToHost(optimizer.stateBuffer(name)!);
  }

  /**
   * The host weights and optimizer state onto the device (after importState), and, for an update
   * restored as already applied ahead, its weights and predicted weights into the spare buffers.
   */
  stateFromHost(ahead?: { weights: FlatBuffer | Float32Array; predicted: FlatBuffer | Float32Array | undefined }): void {
    this.set.copyFromHost();
    if (!ahead) return;
    this.spareWeights!.copyFromHost(ahead.weights);
    if (ahead.predicted) this.sparePredicted!.copyFromHost(ahead.predicted);
  }

  /** Delay compensation restarts from the current weights (flush()). */
  resetBackup(): void {
    this.set.stateBuffer('backup')?.copyFrom(this.set.weights);
  }

  dispose(): void {
    this.backward?.dispose();
    this.set.dispose();
    this.spareWeights?.dispose();
    this.sparePredicted?.dispose();
    this.otherGrads?.dispose();
    this.weightsIn?.dispose();
  }
}

/** @internal Refuses (BackendUnavailableError) what the trainer cannot run over nccl. */
export function checkNcclOptions(options: {
  update?: string | undefined;
  clipGradNorm?: number | undefined;
  compression?: unknown;
  guard?: string | undefined;
  staleness: 0 | 1;
  overlap: boolean;
}): void {
  const obstacle =
    options.update === 'sharded'
      ? "update 'sharded' is not offered (NcclCommunicator.allreduceAndStep steps a sharded DeviceParamSet directly)"
      : options.clipGradNorm !== undefined
        ? 'clipGradNorm is not applied by the device update'
        : options.compression !== undefined
          ? 'compression exchanges host buffers; use the ucx or local backend'
          : options.guard !== undefined
            ? 'the guard is always the device prescan; leave guard unset'
            : options.staleness === 1 && !options.overlap
              ? "the staleness-1 modes run only with the overlapped update (not the 'local' estimates, not overlapUpdate: false)"
              : undefined;
  if (obstacle !== undefined) throw new BackendUnavailableError(`DataParallelTrainer over the nccl backend: ${obstacle}`);
}
