/**
 * AvgPipe's elastic averaging of one part's N replicas (ALGORITHMS.md section 5), in either of the
 * runtime's layouts (`averaging.layout`). An exchange is
 *
 *     d_i = alpha * (x_i - c);   x_i -= d_i;   c += sum_i d_i
 *
 * with every d_i taken against the same c. Both layouts compute d_i the same way
 * (`CenterCopy.difference`: the fused elastic-averaging kernel on a scratch copy of c, x_i -= d_i
 * and scratch = c + d_i in one pass, then scratch -= c) and add the sum to c with one axpy; they
 * differ in where the replicas are and so how the d_i are summed:
 *
 * - `worker-per-replica` ({@link ElasticCenter}): one replica per pipeline, each on its own worker.
 *   The center is a copy on every replica, kept identical by construction: one all-reduce (sum) of
 *   the d_i over the replicas, then c += sum. No rank owns the center: nothing waits on one rank,
 *   losing one loses no state the others lack, and an exchange costs one all-reduce of the part's
 *   size, as a data-parallel step does.
 * - `shared-stages` ({@link SharedElasticCenter}): the N replicas on one worker (the paper's N
 *   pipelines sharing S devices), one center beside them; the d_i are summed on the worker in the
 *   order its row reaches them (the generator's: pipeline order), with no communicator.
 */
import type { Communicator } from '../../comm/communicator.js';
import { BusyError, InvalidArgumentError, InvalidScheduleError, SizeMismatchError } from '../../errors.js';
import { axpy, elasticAverage } from '../../ops.js';
import { FlatBuffer, type ParamSet } from '../../tensor.js';
import { callNative, nativeAddon } from '../../native.js';
import { describeValue } from '../../validate.js';

/** The center copy of a part and a scratch buffer of its size: what both layouts hold per part. */
abstract class CenterCopy {
  protected readonly center: FlatBuffer;
  protected readonly scratch: FlatBuffer;

  /** The center starts as `initial` (every replica builds the part from the same seed). */
  protected constructor(
    initial: FlatBuffer,
    protected readonly alpha: number,
    protected readonly every: number,
  ) {
    this.center = FlatBuffer.allocate(initial.length);
    try {
      this.scratch = FlatBuffer.allocate(initial.length);
    } catch (error) {
      this.center.dispose();
      throw error;
    }
    this.center.array.set(initial.array);
  }

  /** The center copy (what the pipelines agree on: the model to evaluate). */
  get weights(): FlatBuffer {
    return this.center;
  }

  /** d = alpha (x - c) into the scratch buffer, and x -= d (the fused kernel on a copy of c). */
  protected difference(x: FlatBuffer): FlatBuffer {
    const { center, scratch } = this;
    callNative(() => nativeAddon().copy(scratch.handle, center.handle));
    elasticAverage(x, scratch, this.alpha);
    axpy(scratch, -1, center);
    return scratch;
  }

  /** The center's weights and its replicas' elasticAverage calls (what a checkpoint keeps; the scratch is rewritten by every exchange). */
  abstract exportState(): CenterState;
  /** Restores exportState() into a center of the same part, layout and replicas (checked first). */
  abstract importState(state: CenterState): void;

  /** The replicas on this worker whose elasticAverage calls the center counts. */
  protected abstract get counted(): number;

  /** Throws unless `state` fits this center (its weights, a call count per replica here); changes nothing. */
  checkState(state: CenterState): void {
    const replicas = this.counted;
    if (state === null || typeof state !== 'object' || !(state.weights instanceof Float32Array) || state.weights.length !== this.center.length)
      throw new SizeMismatchError(`elastic averaging: a center's state must hold a Float32Array of ${this.center.length} weights (the part's)`);
    if (!Array.isArray(state.updates) || state.updates.length !== replicas || state.updates.some((u) => !Number.isSafeInteger(u) || u < 0))
      throw new InvalidArgumentError(`elastic averaging: a center's state must count the elasticAverage calls of its ${replicas} replica(s) here, got ${describeValue(state.updates)}`);
  }

  dispose(): void {
    this.center.dispose();
    this.scratch.dispose();
  }
}

/** @internal A center between rounds: its weights and, per replica on this worker, the elasticAverage calls counted toward the next exchange. */
export interface CenterState {
  weights: Float32Array;
  updates: number[];
}

/** @internal The `worker-per-replica` layout: this worker's replica, the others reached by `replicas`. */
export class ElasticCenter extends CenterCopy {
  private updates = 0;

  constructor(
    private readonly params: ParamSet,
    private readonly replicas: Communicator<FlatBuffer>,
    alpha: number,
    every: number,
  ) {
    super(params.weights, alpha, every);
  }

  /** The elasticAverage action: an exchange after every `every`-th call. Every replica calls it alike. */
  async average(): Promise<void> {
    if (++this.updates % this.every !== 0) return;
    const d = this.difference(this.params.weights);
    await this.replicas.allreduce(d);
    axpy(this.center, 1, d);
  }

  protected get counted(): number {
    return 1;
  }

  exportState(): CenterState {
    return { weights: this.center.array.slice(), updates: [this.updates] };
  }

  importState(state: CenterState): void {
    this.checkState(state);
    this.center.array.set(state.weights);
    this.updates = state.updates[0]!;
  }
}

/**
 * @internal The `shared-stages` layout: every replica of the part on this worker (index =
 * pipeline). Replica i's elasticAverage action adds its d_i (against the center as the exchange
 * found it) to a sum; the last replica's adds the sum to the center.
 */
export class SharedElasticCenter extends CenterCopy {
  private readonly updates: number[];
  /** The exchange under way: which replicas have added their d_i to `sum`. */
  private readonly added: boolean[];
  private readonly sum: FlatBuffer;

  constructor(
    private readonly replicas: readonly ParamSet[],
    alpha: number,
    every: number,
  ) {
    if (replicas.length < 1 || replicas.some((r) => r.length !== replicas[0]!.length))
      throw new InvalidArgumentError('SharedElasticCenter: give one ParamSet per replica, all of the same part');
    super(replicas[0]!.weights, alpha, every);
    try {
      this.sum = FlatBuffer.allocate(replicas[0]!.length);
    } catch (error) {
      super.dispose();
      throw error;
    }
    this.updates = replicas.map(() => 0);
    this.added = replicas.map(() => false);
  }

  /** Replica `pipeline`'s elasticAverage action: its part of an exchange after its every `every`-th call. */
  average(pipeline: number): void {
    if (++this.updates[pipeline]! % this.every !== 0) return;
    if (this.added[pipeline])
      throw new InvalidScheduleError(`elastic averaging: pipeline ${pipeline} reached a second exchange before every replica of the part reached the first`);
    const d = this.difference(this.replicas[pipeline]!.weights);
    if (!this.added.some(Boolean)) callNative(() => nativeAddon().copy(this.sum.handle, d.handle));
    else axpy(this.sum, 1, d);
    this.added[pipeline] = true;
    if (!this.added.every(Boolean)) return;
    axpy(this.center, 1, this.sum);
    this.added.fill(false);
  }

  protected get counted(): number {
    return this.replicas.length;
  }

  /** Between rounds every replica has finished the exchanges it reached, so no partial sum is kept. */
  exportState(): CenterState {
    if (this.added.some(Boolean)) throw new BusyError('elastic averaging: an exchange is under way (some replicas have added their difference); export between rounds');
    return { weights: this.center.array.slice(), updates: this.updates.slice() };
  }

  importState(state: CenterState): void {
    this.checkState(state);
    this.center.array.set(state.weights);
    state.updates.forEach((u, i) => (this.updates[i] = u));
    this.added.fill(false);
  }

  override dispose(): void {
    super.dispose();
    this.sum.dispose();
  }
}
