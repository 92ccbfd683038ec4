/**
 * Communicator: collectives and point-to-point messages between the ranks of one group. Every
 * backend implements the protected `run*` methods; this class validates arguments, refuses use
 * after destroy(), and applies the optional network emulation. Collectives must be issued by every
 * rank in the same order. The buffers are the backend's: host FlatBuffers for `local` and `ucx`
 * (the default type parameter), DeviceBuffers for `nccl`; a backend names its type by overriding
 * isBuffer(), so a buffer of the wrong kind is an InvalidArgumentError, and TypeScript refuses it.
 */
import { AliasingError, DisposedError, InvalidArgumentError, SizeMismatchError } from '../errors.js';
import type { CommBackendName } from './backend-names.js';
import type { NativeUpdateBuffers, NativeUpdateConfig } from '../native.js';
import type { ExecutionQueue } from '../queue.js';
import { FlatBuffer } from '../tensor.js';
import { emulatedMs, type NetworkEmulation, type RingPattern } from './emulation.js';
import { checkOptions, describeValue, optionKeys } from '../validate.js';

/** @category Communication */
export type ReduceOp = 'sum' | 'avg';

/**
 * @internal How a backend keeps its sharded step all-or-nothing: `prescan` when it updates blocks
 * as it reduces them (the caller must first establish that every sum will be finite), `reduced`
 * when it reduces its whole part first and skips the update on every rank if any part holds a
 * non-finite sum (no extra read of the gradient).
 *
 * @category Communication
 */
export type ShardedGuard = 'prescan' | 'reduced';

/** @internal @category Communication */
export interface ShardedStepResult {
  applied: boolean;
  /** Non-finite sums found (a skipped step), or 0. */
  nonFiniteCount: number;
}

/** @internal One optimizer step of the sharded update (fused-step.ts), as a backend runs it. @category Communication */
export interface ShardedStep {
  /** The step's configuration (gradChecked set) and buffers over the whole ParamSet. */
  config: NativeUpdateConfig;
  buffers: NativeUpdateBuffers;
  /** The optimizer's queue, for backends that run the update as a separate operation. */
  queue: ExecutionQueue;
  grads: FlatBuffer;
  weights: FlatBuffer;
  /** The predicted weights, when the optimizer writes them: gathered like the weights. */
  predicted: FlatBuffer | undefined;
}

/** @category Communication */
export interface ReduceOptions {
  /** `sum` (default) or `avg` (sum divided by the world size). */
  op?: ReduceOp;
}

/** @category Communication */
export interface AllreduceOptions extends ReduceOptions {
  /** First element of the range to reduce (default 0): buckets of one flat gradient buffer. */
  offset?: number;
  /** Elements to reduce (default: from offset to the end). */
  count?: number;
}

/** @category Communication */
export interface ReduceResult {
  /** NaN/Inf values in the result (the same on every rank): the non-finite guard for free. */
  nonFiniteCount: number;
}

export type { CommBackendName };

/** @category Communication */
export const DEFAULT_COMM_TIMEOUT_MS = 30_000;

/** What a collective moves: host FlatBuffers, or device buffers for `nccl`. @category Communication */
export interface CommBuffer {
  readonly length: number;
  readonly disposed: boolean;
}

/**
 * Collectives and point-to-point messages among the ranks of a group: allreduce, reduceScatter,
 * allgather, broadcast, barrier, send/recv. Every wait is bounded (`timeoutMs`); a lost peer fails
 * every pending and later operation with PeerLostError. Backends: LocalCommunicator,
 * UcxCommunicator, NcclCommunicator; createCommunicator picks one.
 *
 * @category Communication
 */
export abstract class Communicator<Buffer extends CommBuffer = FlatBuffer> {
  abstract readonly backend: CommBackendName;
  private isDestroyed = false;

  protected constructor(
    readonly rank: number,
    readonly size: number,
    /** Network emulation, when configured (labelled: the delays are modelled, not measured). */
    readonly emulation: NetworkEmulation | undefined,
  ) {}

  get destroyed(): boolean {
    return this.isDestroyed;
  }

  /** In place: buffer = sum (or average) over ranks. Resolves with the count of non-finite results. */
  async allreduce(buffer: Buffer, options: AllreduceOptions = {}): Promise<ReduceResult> {
    this.checkLive('allreduce');
    this.checkBuffer(buffer, 'allreduce(buffer)');
    checkOptions(options, ALLREDUCE_OPTION_KEYS, 'allreduce(buffer, options)');
    const offset = checkIndex(options.offset ?? 0, 'allreduce(options.offset)');
    const count = checkIndex(options.count ?? Math.max(0, buffer.length - offset), 'allreduce(options.count)');
    if (offset + count > buffer.length)
      throw new SizeMismatchError(`allreduce: offset ${offset} + count ${count} exceeds the buffer's ${buffer.length} elements`);
    const scale = this.scaleOf(options.op, 'allreduce');
    return this.emulated('allreduce', count * 4, () => this.runAllreduce(buffer, offset, count, scale));
  }

  /** output (length m) = reduction over ranks of input's part `rank` (input length size x m). */
  async reduceScatter(input: Buffer, output: Buffer, options: ReduceOptions = {}): Promise<ReduceResult> {
    this.checkLive('reduceScatter');
    this.checkBuffer(input, 'reduceScatter(input)');
    this.checkBuffer(output, 'reduceScatter(output)');
    checkOptions(options, REDUCE_OPTION_KEYS, 'reduceScatter(input, output, options)');
    if (input.length !== output.length * this.size)
      throw new SizeMismatchError(
        `reduceScatter: the input has ${input.length} elements; it must have size (${this.size}) x the output's ${output.length}`,
      );
    checkDistinct(input, output, 'reduceScatter');
    const scale = this.scaleOf(options.op, 'reduceScatter');
    return this.emulated('reduceScatter', input.length * 4, () => this.runReduceScatter(input, output, scale));
  }

  /** output (length size x m) = every rank's input (length m), in rank order. */
  async allgather(input: Buffer, output: Buffer): Promise<void> {
    this.checkLive('allgather');
    this.checkBuffer(input, 'allgather(input)');
    this.checkBuffer(output, 'allgather(output)');
    if (output.length !== input.length * this.size)
      throw new SizeMismatchError(
        `allgather: the output has ${output.length} elements; it must have size (${this.size}) x the input's ${input.length}`,
      );
    checkDistinct(input, output, 'allgather');
    await this.emulated('allgather', output.length * 4, () => this.runAllgather(input, output));
  }

  /** In place: every rank's buffer becomes root's. */
  async broadcast(buffer: Buffer, root = 0): Promise<void> {
    this.checkLive('broadcast');
    this.checkBuffer(buffer, 'broadcast(buffer)');
    this.checkPeer(root, 'broadcast(root)', true);
    await this.emulated('broadcast', buffer.length * 4, () => this.runBroadcast(buffer, root));
  }

  /** Resolves once every rank has called barrier(). */
  async barrier(): Promise<void> {
    this.checkLive('barrier');
    await this.emulated('barrier', 0, () => this.runBarrier());
  }

  /**
   * Sends the buffer to `peer`; resolves once the peer has received it (the buffer may then be
   * reused). Messages from one rank to another arrive in the order they were sent.
   */
  async send(buffer: Buffer, peer: number): Promise<void> {
    this.checkLive('send');
    this.checkBuffer(buffer, 'send(buffer)');
    this.checkPeer(peer, 'send(peer)', false);
    await this.emulated('p2p', buffer.length * 4, () => this.runSend(buffer, peer));
  }

  /** Receives the next message from `peer` into the buffer; its length must equal the message's. */
  async recv(buffer: Buffer, peer: number): Promise<void> {
    this.checkLive('recv');
    this.checkBuffer(buffer, 'recv(buffer)');
    this.checkPeer(peer, 'recv(peer)', false);
    await this.runRecv(buffer, peer);
  }

  /**
   * Leaves the group. Peers' pending and later operations fail with PeerLostError; this
   * communicator's own with DisposedError. The returned Promise resolves once the communicator's
   * threads have ended (its operations settle first); await it before creating many more, so
   * that a process under a thread or pids limit does not run out. Idempotent: every call returns
   * the same Promise, which never rejects.
   */
  destroy(): Promise<void> {
    if (this.released === undefined) {
      this.isDestroyed = true;
      this.runDestroy();
      this.released = this.releaseThreads().catch(() => undefined);
    }
    return this.released;
  }
  private released: Promise<void> | undefined;

  protected abstract runAllreduce(buffer: Buffer, offset: number, count: number, scale: number): Promise<ReduceResult>;
  protected abstract runReduceScatter(input: Buffer, output: Buffer, scale: number): Promise<ReduceResult>;
  protected abstract runAllgather(input: Buffer, output: Buffer): Promise<void>;
  protected abstract runBroadcast(buffer: Buffer, root: number): Promise<void>;
  protected abstract runBarrier(): Promise<void>;
  protected abstract runSend(buffer: Buffer, peer: number): Promise<void>;
  protected abstract runRecv(buffer: Buffer, peer: number): Promise<void>;

  /** Whether `b` is this backend's buffer type; FlatBuffer unless a backend says otherwise. */
  protected isBuffer(b: unknown): b is Buffer {
    return b instanceof FlatBuffer;
  }
  /** The buffer type in words, for messages. */
  protected get bufferKind(): string {
    return 'a FlatBuffer';
  }
  protected abstract runDestroy(): void;
  /** After runDestroy(): ends the backend's own threads (its execution queues); resolves when they are joined. */
  protected async releaseThreads(): Promise<void> {}

  /** @internal */
  checkLive(what: string): void {
    if (this.isDestroyed) throw new DisposedError(`Communicator.${what}: the communicator was destroyed; create a new one`);
  }

  private checkBuffer(b: unknown, what: string): asserts b is Buffer {
    if (!this.isBuffer(b)) throw new InvalidArgumentError(`${what} must be ${this.bufferKind} on the ${this.backend} backend`);
    if (b.disposed) throw new DisposedError(`${what} was disposed; allocate a new buffer`);
  }

  private scaleOf(op: ReduceOp | undefined, what: string): number {
    if (op === undefined || op === 'sum') return 1;
    if (op === 'avg') return 1 / this.size;
    throw new InvalidArgumentError(`${what}: op must be 'sum' or 'avg', got ${describeValue(op)}`);
  }

  private checkPeer(peer: number, what: string, selfAllowed: boolean): void {
    if (!Number.isInteger(peer) || peer < 0 || peer >= this.size || (!selfAllowed && peer === this.rank))
      throw new InvalidArgumentError(
        `${what} must be ${selfAllowed ? 'a rank' : 'another rank'} in [0, ${this.size}), got ${describeValue(peer)}`,
      );
  }

  /** Runs a collective, delayed as the emulated network would (when emulation is on). */
  protected async emulated<T>(pattern: RingPattern, bytes: number, run: () => Promise<T>): Promise<T> {
    if (!this.emulation) return run();
    const start = performance.now();
    const result = await run();
    const modelled = emulatedMs(this.emulation, pattern, bytes, this.size);
    // A timer may fire up to a millisecond or two early (Node truncates its delay and counts from
    // the event loop's cached clock): wait until the modelled time has really passed.
    for (let remaining = modelled - (performance.now() - start); remaining > 0; remaining = modelled - (performance.now() - start))
      await new Promise((resolve) => setTimeout(resolve, Math.min(Math.ceil(remaining), 2 ** 31 - 1))); // Node's largest delay
    return result;
  }
}

const ALLREDUCE_OPTION_KEYS = optionKeys<AllreduceOptions>({ op: true, offset: true, count: true });
const REDUCE_OPTION_KEYS = optionKeys<ReduceOptions>({ op: true });

function checkIndex(v: unknown, what: string): number {
  if (typeof v !== 'number' || !Number.isInteger(v) || v < 0) throw new InvalidArgumentError(`${what} must be a non-negative integer, got ${describeValue(v)}`);
  return v;
}

function checkDistinct(a: CommBuffer, b: CommBuffer, what: string): void {
  if (a === b) throw new AliasingError(`${what}: the input and the output must be different buffers`);
}
