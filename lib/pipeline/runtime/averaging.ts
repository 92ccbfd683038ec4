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
 *   order its row reaches them (the generator's: pipeline order), with no communicator. On a device
 *   ({@link DeviceSharedElasticCenter}) the center, the d_i and their sum live there, and each
 *   replica's exchange is enqueued on the stream current when it is called (its pipeline's).
 */
import type { Communicator } from '../../comm/communicator.js';
import { BusyError, InvalidArgumentError, InvalidScheduleError, SizeMismatchError } from '../../errors.js';
import type { DeviceParamSet } from '../../device/param-set.js';
import { sgemm } from '../../nn/gemm.js';
import { modelDevice, type ModelDevice, type Tensor } from '../../nn/ops.js';
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
    checkCenterState(state, this.center.length, this.counted);
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

/** Throws unless `state` fits a center of `length` weights counting `replicas` replicas' calls; changes nothing. */
function checkCenterState(state: CenterState, length: number, replicas: number): void {
  if (state === null || typeof state !== 'object' || !(state.weights instanceof Float32Array) || state.weights.length !== length)
    throw new SizeMismatchError(`elastic averaging: a center's state must hold a Float32Array of ${length} weights (the part's)`);
  if (!Array.isArray(state.updates) || state.updates.length !== replicas || state.updates.some((u) => !Number.isSafeInteger(u) || u < 0))
    throw new InvalidArgumentError(`elastic averaging: a center's state must count the elasticAverage calls of its ${replicas} replica(s) here, got ${describeValue(state.updates)}`);
}

/**
 * The `shared-stages` layout's bookkeeping, in either memory: each replica's elasticAverage calls,
 * and which replicas have added their d_i to the exchange under way.
 */
class SharedExchange {
  readonly updates: number[];
  private readonly added: boolean[];

  constructor(
    replicas: number,
    private readonly every: number,
  ) {
    this.updates = new Array<number>(replicas).fill(0);
    this.added = new Array<boolean>(replicas).fill(false);
  }

  /** Counts replica `pipeline`'s call: whether it takes part in an exchange now (its every `every`-th). */
  due(pipeline: number): boolean {
    if (++this.updates[pipeline]! % this.every !== 0) return false;
    if (this.added[pipeline])
      throw new InvalidScheduleError(`elastic averaging: pipeline ${pipeline} reached a second exchange before every replica of the part reached the first`);
    return true;
  }

  /** Replica `pipeline` added its d_i: whether it was the first (the sum starts at it) and the last (the sum goes to the center; the exchange ends). */
  add(pipeline: number): { first: boolean; last: boolean } {
    const first = !this.added.some(Boolean);
    this.added[pipeline] = true;
    const last = this.added.every(Boolean);
    if (last) this.added.fill(false);
    return { first, last };
  }

  /** Throws unless no exchange is under way (between rounds). */
  checkIdle(): void {
    if (this.added.some(Boolean)) throw new BusyError('elastic averaging: an exchange is under way (some replicas have added their difference); export between rounds');
  }

  restore(updates: readonly number[]): void {
    updates.forEach((u, i) => (this.updates[i] = u));
    this.added.fill(false);
  }
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
  private readonly exchange: SharedExchange;
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
    this.exchange = new SharedExchange(replicas.length, every);
  }

  /** Replica `pipeline`'s elasticAverage action: its part of an exchange after its every `every`-th call. */
  average(pipeline: number): void {
    if (!this.exchange.due(pipeline)) return;
    const d = this.difference(this.replicas[pipeline]!.weights);
    const { first, last } = this.exchange.add(pipeline);
    if (first) callNative(() => nativeAddon().copy(this.sum.handle, d.handle));
    else axpy(this.sum, 1, d);
    if (last) axpy(this.center, 1, this.sum);
  }

  protected get counted(): number {
    return this.replicas.length;
  }

  /** Between rounds every replica has finished the exchanges it reached, so no partial sum is kept. */
  exportState(): CenterState {
    this.exchange.checkIdle();
    return { weights: this.center.array.slice(), updates: this.exchange.updates.slice() };
  }

  importState(state: CenterState): void {
    this.checkState(state);
    this.center.array.set(state.weights);
    this.exchange.restore(state.updates);
  }

  override dispose(): void {
    super.dispose();
    this.sum.dispose();
  }
}

/** @internal What a stage holds per averaged part, in either memory: see the centers above. */
export interface PartCenter {
  /** The center's weights on the host (a device center copies them out first: between rounds). */
  readonly weights: FlatBuffer;
  exportState(): CenterState;
  importState(state: CenterState): void;
  checkState(state: CenterState): void;
  dispose(): void;
}

/**
 * @internal The `shared-stages` layout on a device: every replica's weights in a DeviceParamSet
 * there, the center, each exchange's d_i and their sum beside them in device memory. Replica i's
 * exchange is enqueued on the stream current when `average(i)` is called (the runner calls it on
 * its pipeline's stream, after that stream waited for the previous exchange's): with `one` the
 * 1 x 1 tensor 1,
 *
 *     d = alpha x - alpha c     (one product: c = alpha (one x) - alpha c on a copy of c)
 *     x -= d;  sum = d (the first replica) or sum += d;  and after the last, c += sum,
 *
 * the same exchange as SharedElasticCenter's (d taken as alpha (x - c) directly, not as
 * (c + d) - c, so the two agree to rounding, not to the bit).
 */
export class DeviceSharedElasticCenter implements PartCenter {
  private readonly memory: ModelDevice;
  private readonly center: Tensor;
  private readonly scratch: Tensor;
  private readonly sum: Tensor;
  private readonly one: Tensor;
  private readonly host: FlatBuffer;
  private readonly exchange: SharedExchange;

  constructor(
    private readonly replicas: readonly DeviceParamSet[],
    private readonly alpha: number,
    every: number,
  ) {
    if (replicas.length < 1 || replicas.some((r) => r.params.length !== replicas[0]!.params.length || r.device !== replicas[0]!.device))
      throw new InvalidArgumentError('DeviceSharedElasticCenter: give one DeviceParamSet per replica, all of the same part on one device');
    this.memory = modelDevice(replicas[0]!.device);
    const n = replicas[0]!.params.length;
    const made: { dispose(): void }[] = [];
    const make = <T extends { dispose(): void }>(x: T): T => (made.push(x), x);
    try {
      this.center = make(this.memory.allocate(n));
      this.scratch = make(this.memory.allocate(n));
      this.sum = make(this.memory.allocate(n));
      this.one = make(this.memory.allocate(1));
      this.host = make(FlatBuffer.allocate(n));
      this.memory.write(this.one, Float32Array.of(1));
      // every replica starts from the same seed: the center starts as replica 0's weights
      this.memory.copy(this.center, replicas[0]!.weights, n);
    } catch (error) {
      for (const x of made) x.dispose();
      throw error;
    }
    this.exchange = new SharedExchange(replicas.length, every);
  }

  /** Replica `pipeline`'s elasticAverage action, enqueued on the current stream. */
  average(pipeline: number): void {
    if (!this.exchange.due(pipeline)) return;
    const x = this.replicas[pipeline]!.weights;
    const n = this.center.length;
    const rank1 = (b: Tensor, c: Tensor, alpha: number, beta: number): void => sgemm({ m: 1, n, k: 1, a: this.one, b, c, alpha, beta });
    this.memory.copy(this.scratch, this.center, n);
    rank1(x, this.scratch, this.alpha, -this.alpha);
    rank1(this.scratch, x, -1, 1);
    const { first, last } = this.exchange.add(pipeline);
    if (first) this.memory.copy(this.sum, this.scratch, n);
    else rank1(this.scratch, this.sum, 1, 1);
    if (last) rank1(this.sum, this.center, 1, 1);
  }

  /** The center on the host (read from the device: call it between rounds, its streams idle). */
  get weights(): FlatBuffer {
    this.host.array.set(this.memory.read(this.center, this.center.length));
    return this.host;
  }

  checkState(state: CenterState): void {
    checkCenterState(state, this.center.length, this.replicas.length);
  }

  exportState(): CenterState {
    this.exchange.checkIdle();
    return { weights: this.weights.array.slice(), updates: this.exchange.updates.slice() };
  }

  importState(state: CenterState): void {
    this.checkState(state);
    this.memory.write(this.center, state.weights);
    this.exchange.restore(state.updates);
  }

  dispose(): void {
    for (const x of [this.center, this.scratch, this.sum, this.one, this.host]) x.dispose();
  }
}
