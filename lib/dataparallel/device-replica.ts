/**
 * The data-parallel trainer's device side over the `nccl` backend. The model computes on the host
 * (its forward pass reads host weights, its backward pass writes a host gradient); the weights and
 * the optimizer state live on this rank's GPU, where NCCL averages the gradient and the fused CUDA
 * kernel applies it. Per update the host gradient goes to the device and the new weights (and
 * predicted weights) come back; in the staleness-1 modes all of it is queued on the communicator
 * and runs while the caller computes the next gradient (NcclCommunicator.startOverlappedStep).
 *
 * Which copy is current: the device's weights and optimizer state are the truth. The host weights
 * (and host predicted weights) are copies of the device's, refreshed by every update; the host
 * optimizer's other state buffers are refreshed only by stateToHost() (exportState).
 */
import { BackendUnavailableError } from '../errors.js';
import { checkSameLayout } from './layout-check.js';
import { DeviceBuffer, DeviceParamSet } from '../device/index.js';
import type { NcclCommunicator, NcclStepResultInfo } from '../comm/nccl.js';
import type { Optimizer, StepResult } from '../optim/optimizer.js';
import { FlatBuffer, type ParamSet } from '../tensor.js';

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
  ) {}

  /**
   * The trainer's creation collectives over nccl, on device buffers: every rank's ParamSet layout
   * is compared (layout-check.ts), and rank 0's weights are broadcast into every rank's host ParamSet.
   */
  static async checkLayoutAndBroadcast(comm: NcclCommunicator, params: ParamSet, broadcast: boolean): Promise<void> {
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
    if (!broadcast) return;
    const weights = DeviceBuffer.from(params.weights, device);
    try {
      await comm.broadcast(weights, 0);
      weights.copyToHost(params.weights);
    } finally {
      weights.dispose();
    }
  }

  /** Moves the ParamSet's weights and the optimizer's state to the communicator's device. */
  static create(comm: NcclCommunicator, params: ParamSet, optimizer: Optimizer, outOfPlace: boolean): DeviceReplica {
    const set = DeviceParamSet.create(params, { device: comm.device, optimizer });
    const made: DeviceBuffer[] = [];
    try {
      const spare = (): DeviceBuffer => {
        const b = DeviceBuffer.allocate(set.length, { device: comm.device });
        made.push(b);
        return b;
      };
      const spareWeights = outOfPlace ? spare() : undefined;
      const sparePredicted = outOfPlace && set.stateBuffer('predicted') ? spare() : undefined;
      return new DeviceReplica(comm, set, spareWeights, sparePredicted);
    } catch (error) {
      for (const b of made) b.dispose();
      set.dispose();
      throw error;
    }
  }

  /**
   * `sync`: the host gradient to the device, the bucketed fused all-reduce and update there, and
   * the new weights back to the host, run to completion.
   */
  async syncStep(buckets: DeviceBucketOptions): Promise<NcclStepResultInfo> {
    this.set.copyGradsFromHost();
    const r = await this.comm.allreduceAndStep(this.set, {
      ...(buckets.bucketBytes === undefined ? {} : { bucketBytes: buckets.bucketBytes }),
      ...(buckets.firstBucketBytes === undefined ? {} : { firstBucketBytes: buckets.firstBucketBytes }),
    });
    if (r.applied) this.set.weights.copyToHost(this.set.params.weights);
    return r;
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
  stateFromHost(ahead?: { weights: FlatBuffer; predicted: FlatBuffer | undefined }): void {
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
    this.set.dispose();
    this.spareWeights?.dispose();
    this.sparePredicted?.dispose();
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
