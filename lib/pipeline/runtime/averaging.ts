/**
 * AvgPipe's elastic averaging of one part's replicas (ALGORITHMS.md section 5), one replica per
 * pipeline, each on its own worker. Where the center lives: a copy on every replica, kept
 * identical by construction. An exchange is
 *
 *     d_i = alpha * (x_i - c);   x_i -= d_i;   c += sum_i d_i
 *
 * done as the fused elastic-averaging kernel on a scratch copy of c (x_i -= d_i and scratch = c + d_i
 * in one pass), scratch -= c (d_i), one all-reduce (sum) of d_i over the replicas, c += sum. Every
 * replica then holds the same c, so no rank owns the center: nothing waits on one rank, losing one
 * loses no state the others lack, and an exchange costs one all-reduce of the part's size, as a
 * data-parallel step does.
 */
import type { Communicator } from '../../comm/communicator.js';
import { axpy, elasticAverage } from '../../ops.js';
import { FlatBuffer, type ParamSet } from '../../tensor.js';
import { callNative, nativeAddon } from '../../native.js';

/** @internal */
export class ElasticCenter {
  private readonly center: FlatBuffer;
  private readonly scratch: FlatBuffer;
  private updates = 0;

  /** The center starts as `params`' weights (every replica builds the part from the same seed). */
  constructor(
    private readonly params: ParamSet,
    private readonly replicas: Communicator<FlatBuffer>,
    private readonly alpha: number,
    private readonly every: number,
  ) {
    this.center = FlatBuffer.allocate(params.length);
    try {
      this.scratch = FlatBuffer.allocate(params.length);
    } catch (error) {
      this.center.dispose();
      throw error;
    }
    this.center.array.set(params.weights.array);
  }

  /** The center copy (what the pipelines agree on: the model to evaluate). */
  get weights(): FlatBuffer {
    return this.center;
  }

  /** The elasticAverage action: an exchange after every `every`-th call. Every replica calls it alike. */
  async average(): Promise<void> {
    if (++this.updates % this.every !== 0) return;
    const { center, scratch } = this;
    callNative(() => nativeAddon().copy(scratch.handle, center.handle));
    elasticAverage(this.params.weights, scratch, this.alpha);
    axpy(scratch, -1, center);
    await this.replicas.allreduce(scratch);
    axpy(center, 1, scratch);
  }

  dispose(): void {
    this.center.dispose();
    this.scratch.dispose();
  }
}
