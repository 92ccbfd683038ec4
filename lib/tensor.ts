/**
 * Native memory seen from JavaScript: {@link FlatBuffer} (one aligned fp32 buffer) and
 * {@link ParamSet} (named tensors packed into one flat weight buffer and one gradient buffer, so a
 * single native call updates a whole model).
 */
import { DisposedError, InvalidArgumentError, SizeMismatchError } from './errors.js';
import { callNative, nativeAddon, type NativeBufferHandle } from './native.js';
import { checkArrayLike, checkInteger, checkObject, describeValue } from './validate.js';

/** Elements per cache line: every tensor of a ParamSet starts on one, so views are 64-byte aligned. @category Tensors and memory */
export const ALIGN_ELEMENTS = 16;

/**
 * The most floats one JavaScript view of native memory holds: 2^30 (4 GiB), Node's limit for an
 * external ArrayBuffer. Larger buffers work whole in every kernel and collective; JavaScript sees
 * them through {@link FlatBuffer.view} ranges (a ParamSet's tensor views are such ranges).
 *
 * @category Tensors and memory
 */
export const MAX_VIEW_LENGTH = 2 ** 30;

/**
 * A 64-byte aligned fp32 buffer in native memory, exposed as zero-copy Float32Arrays.
 *
 * Limits: a buffer holds any integer number of floats up to 2^53 - 1 that the machine's memory
 * allows (beyond it: `OutOfMemoryError`); `array`, the view of the whole buffer, exists up to
 * {@link MAX_VIEW_LENGTH} floats (beyond it: `ViewTooLargeError`, use `view(offset, length)`).
 * The memory is reported to the JavaScript engine, so a buffer dropped without `dispose()` is
 * collected under memory pressure like any ArrayBuffer (after a garbage collection, on a later turn
 * of the event loop); `dispose()` frees it at once.
 *
 * @category Tensors and memory
 */
export class FlatBuffer {
  /** @internal */
  readonly handle: NativeBufferHandle;

  private constructor(handle: NativeBufferHandle) {
    this.handle = handle;
  }

  /** Allocates `length` zero-filled floats. */
  static allocate(length: number): FlatBuffer {
    checkLength(length, 'FlatBuffer.allocate(length)');
    const addon = nativeAddon();
    return new FlatBuffer(callNative(() => new addon.NativeBuffer(length)));
  }

  /** @internal A FlatBuffer over a NativeBuffer made natively (e.g. in a communicator's shared memory). */
  static wrap(handle: NativeBufferHandle): FlatBuffer {
    return new FlatBuffer(handle);
  }

  /** Allocates a buffer holding a copy of `values`. */
  static from(values: ArrayLike<number>): FlatBuffer {
    checkArrayLike(values, 'FlatBuffer.from(values): values');
    if (Array.isArray(values))
      for (let i = 0; i < values.length; i++)
        if (typeof values[i] !== 'number')
          throw new InvalidArgumentError(`FlatBuffer.from(values): values[${i}] must be a number, got ${describeValue(values[i])}`);
    const buffer = FlatBuffer.allocate(values.length);
    buffer.array.set(values);
    return buffer;
  }

  get length(): number {
    return this.handle.length;
  }

  get disposed(): boolean {
    return this.handle.disposed;
  }

  /**
   * The whole buffer as a Float32Array over native memory (no copy). Empty after dispose().
   * Throws `ViewTooLargeError` for a buffer of more than {@link MAX_VIEW_LENGTH} floats.
   */
  get array(): Float32Array {
    if (this.handle.disposed) throw new DisposedError('FlatBuffer.array: the buffer was disposed');
    return callNative(() => this.handle.array);
  }

  /** Elements [offset, offset + length) as a Float32Array over native memory (no copy); length <= MAX_VIEW_LENGTH. */
  view(offset: number, length: number): Float32Array {
    if (this.handle.disposed) throw new DisposedError('FlatBuffer.view: the buffer was disposed');
    checkInteger(offset, 'FlatBuffer.view(offset, length): offset', 0, this.length);
    checkInteger(length, 'FlatBuffer.view(offset, length): length', 0, this.length - offset);
    return callNative(() => this.handle.view(offset, length));
  }

  /** Sets every element to `value` (in ranges of at most MAX_VIEW_LENGTH, so any size works). */
  fill(value: number): void {
    if (typeof value !== 'number') throw new InvalidArgumentError(`FlatBuffer.fill(value): value must be a number, got ${describeValue(value)}`);
    for (let offset = 0; offset < this.length; offset += MAX_VIEW_LENGTH)
      this.view(offset, Math.min(MAX_VIEW_LENGTH, this.length - offset)).fill(value);
  }

  /** Frees the native memory now; every view of it becomes empty. Idempotent. */
  dispose(): void {
    callNative(() => this.handle.dispose());
  }
}

/** @internal Throws InvalidArgumentError unless `length` is a valid FlatBuffer length. @category Tensors and memory */
export function checkLength(length: unknown, what: string): void {
  checkInteger(length, `${what}: length`, 0, Number.MAX_SAFE_INTEGER);
}

/**
 * Where buffers are allocated. A communicator is one: `comm.allocate(n)` gives memory its
 * collectives handle fastest (on the ucx backend, shared memory that the other ranks of the machine
 * read directly instead of receiving the bytes in messages).
 *
 * @category Tensors and memory
 */
export interface MemorySource {
  allocate(length: number): FlatBuffer;
}

/** @category Tensors and memory */
export interface ParamSetOptions {
  /**
   * Where the weights, gradients and optimizer state are allocated (default: ordinary memory). A
   * communicator's memory is its own: another communicator (say, one created after a peer was
   * lost) reads it as ordinary memory. Once the source is destroyed, later buffers of the ParamSet
   * come from ordinary memory.
   */
  memory?: MemorySource;
}

/** Shape of a tensor: non-negative integer dimensions. `[]` is a scalar. @category Tensors and memory */
export type Shape = readonly number[];

/** Tensor names and shapes, in packing order. @category Tensors and memory */
export type ParamSpec = Readonly<Record<string, Shape>> | ReadonlyArray<readonly [string, Shape]>;

/** Where one named tensor lives inside the flat buffers of a ParamSet. @category Tensors and memory */
export interface TensorLayout {
  readonly name: string;
  readonly shape: Shape;
  /** Number of elements (product of the shape). */
  readonly size: number;
  /** Offset in elements from the start of the flat buffer; a multiple of ALIGN_ELEMENTS. */
  readonly offset: number;
}

/** One named tensor of a ParamSet: views of its weights and gradient. @category Tensors and memory */
export class Tensor {
  /** @internal ParamSet makes its tensors: use `paramSet.get(name)`. */
  constructor(
    private readonly owner: ParamSet,
    readonly layout: TensorLayout,
  ) {}
  get name(): string {
    return this.layout.name;
  }
  get shape(): Shape {
    return this.layout.shape;
  }
  get size(): number {
    return this.layout.size;
  }
  /** The tensor's weights (a view of the ParamSet's flat weight buffer). */
  get data(): Float32Array {
    return this.owner.view(this.owner.weights, this.layout.name);
  }
  /** The tensor's gradient (a view of the ParamSet's flat gradient buffer). */
  get grad(): Float32Array {
    return this.owner.view(this.owner.grads, this.layout.name);
  }
}

/**
 * Named tensors packed into one flat weight buffer and one flat gradient buffer. Each tensor starts
 * on a cache line; the padding between tensors is zero and stays zero under every update, so
 * kernels run over the whole flat buffer in one call.
 *
 * @category Tensors and memory
 */
export class ParamSet {
  /** Total elements of the flat buffers, padding included. */
  readonly length: number;
  /** Number of parameters (padding excluded). */
  readonly numParams: number;
  private readonly layouts: Map<string, TensorLayout>;
  private readonly tensorsByName: Map<string, Tensor>;
  private memory: MemorySource | undefined;
  private isDisposed = false;
  private gradBuffer: FlatBuffer;
  private weightBuffer: FlatBuffer;

  constructor(spec: ParamSpec, options: ParamSetOptions = {}) {
    checkObject(options, 'ParamSet(spec, options): options');
    for (const key of Reflect.ownKeys(options))
      if (key !== 'memory')
        throw new InvalidArgumentError(`ParamSet(spec, options): unknown option ${typeof key === 'string' ? `'${key}'` : describeValue(key)}; the only option is 'memory'`);
    const memory = (options as ParamSetOptions).memory;
    if (memory !== undefined && (memory === null || typeof memory !== 'object' || typeof memory.allocate !== 'function'))
      throw new InvalidArgumentError(
        `ParamSet: options.memory must have an allocate(length) method, e.g. a communicator; got ${describeValue(memory)}`,
      );
    this.memory = memory;
    if (typeof spec !== 'object' || spec === null)
      throw new InvalidArgumentError(`ParamSet(spec): spec must be an object of name -> shape or an array of [name, shape] pairs, e.g. { w: [10, 5] }; got ${describeValue(spec)}`);
    const entries: ReadonlyArray<readonly [string, Shape]> = Array.isArray(spec)
      ? (spec as ReadonlyArray<readonly [string, Shape]>)
      : Object.entries(spec as Record<string, Shape>);
    if (entries.length === 0) throw new InvalidArgumentError('ParamSet: give at least one tensor, e.g. { w: [10, 5] }');
    this.layouts = new Map();
    let offset = 0;
    let numParams = 0;
    for (const entry of entries) {
      if (!Array.isArray(entry) || entry.length !== 2)
        throw new InvalidArgumentError(`ParamSet: entries must be [name, shape] pairs, got ${describeValue(entry)}`);
      const [name, shape] = entry as unknown[];
      if (typeof name !== 'string' || name.length === 0)
        throw new InvalidArgumentError(`ParamSet: tensor names must be non-empty strings, got ${describeValue(name)}`);
      if (this.layouts.has(name)) throw new InvalidArgumentError(`ParamSet: tensor "${name}" is given twice`);
      if (!Array.isArray(shape) || shape.some((d) => typeof d !== 'number' || !Number.isInteger(d) || d < 0))
        throw new InvalidArgumentError(
          `ParamSet: the shape of "${name}" must be an array of non-negative integers (numbers), got ${
            Array.isArray(shape) ? `[${shape.map(describeValue).join(', ')}]` : describeValue(shape)
          }`,
        );
      const size = (shape as number[]).reduce((a, b) => a * b, 1);
      if (!Number.isSafeInteger(size))
        throw new InvalidArgumentError(`ParamSet: tensor "${name}" has ${size} elements, more than any buffer can hold`);
      this.layouts.set(name, { name, shape: Object.freeze([...(shape as number[])]), size, offset });
      numParams += size;
      offset += Math.ceil(size / ALIGN_ELEMENTS) * ALIGN_ELEMENTS;
    }
    checkLength(offset, 'ParamSet');
    this.length = offset;
    this.numParams = numParams;
    this.weightBuffer = this.allocateLike();
    try {
      this.gradBuffer = this.allocateLike();
    } catch (error) {
      this.weightBuffer.dispose();
      throw error;
    }
    this.tensorsByName = new Map([...this.layouts.values()].map((l) => [l.name, new Tensor(this, l)]));
  }

  /**
   * A zero-filled buffer of this ParamSet's length, from the same memory as its weights (optimizers
   * keep their state in such buffers, so that a sharded update gathers predicted weights as fast as
   * the weights).
   */
  allocateLike(): FlatBuffer {
    this.checkLive('allocateLike');
    if (this.memory === undefined) return FlatBuffer.allocate(this.length);
    let buffer: unknown;
    try {
      buffer = this.memory.allocate(this.length);
    } catch (error) {
      // A memory source that is gone (a communicator after destroy()): the ParamSet lives on, so
      // its later buffers (a new optimizer's state) come from ordinary memory.
      if (!(error instanceof DisposedError)) throw error;
      this.memory = undefined;
      return FlatBuffer.allocate(this.length);
    }
    if (!(buffer instanceof FlatBuffer) || buffer.length !== this.length) {
      if (buffer instanceof FlatBuffer) buffer.dispose();
      throw new InvalidArgumentError(`ParamSet: options.memory.allocate(${this.length}) must return a FlatBuffer of that length`);
    }
    return buffer;
  }

  /**
   * The gradient buffer to write this step's gradients into. A DataParallelTrainer in a pipelined
   * mode gives the ParamSet a fresh buffer at each step() while it all-reduces the one just
   * filled, so re-read `grads` (or a tensor's `grad`) every step rather than keeping the buffer.
   */
  get grads(): FlatBuffer {
    return this.gradBuffer;
  }

  /**
   * The flat weight buffer. The data-parallel trainer's overlapped staleness-1 modes write the next
   * weights into a second buffer and put it here at the next step(), so re-read `weights` (or a
   * tensor's `data`) every step rather than keeping it.
   */
  get weights(): FlatBuffer {
    return this.weightBuffer;
  }

  /**
   * @internal Puts `buffer` (same length, from allocateLike()) in place of the weight buffer and
   * returns the one it replaces, which the caller now owns. The data-parallel trainer's
   * double-buffered weights: a forward pass reads one while the overlapped update writes the other.
   */
  exchangeWeights(buffer: FlatBuffer): FlatBuffer {
    this.checkExchange(buffer, 'exchangeWeights');
    const previous = this.weightBuffer;
    this.weightBuffer = buffer;
    return previous;
  }

  private checkExchange(buffer: FlatBuffer, what: string): void {
    this.checkLive(what);
    if (!(buffer instanceof FlatBuffer) || buffer.length !== this.length)
      throw new SizeMismatchError(`ParamSet.${what}: the buffer must be a FlatBuffer of ${this.length} elements`);
  }

  /**
   * @internal Puts `buffer` (same length, from allocateLike()) in place of the gradient buffer and
   * returns the one it replaces, which the caller now owns. The data-parallel trainer's double buffer.
   */
  exchangeGrads(buffer: FlatBuffer): FlatBuffer {
    this.checkExchange(buffer, 'exchangeGrads');
    const previous = this.gradBuffer;
    this.gradBuffer = buffer;
    return previous;
  }

  /** Tensor names in packing order. */
  get names(): string[] {
    return [...this.layouts.keys()];
  }

  /** All tensors in packing order. */
  get tensors(): Tensor[] {
    return [...this.tensorsByName.values()];
  }

  get disposed(): boolean {
    return this.isDisposed;
  }

  /** The tensor called `name`. */
  get(name: string): Tensor {
    this.checkLive('get');
    const tensor = typeof name === 'string' ? this.tensorsByName.get(name) : undefined;
    if (!tensor) throw new InvalidArgumentError(`ParamSet.get: no tensor ${describeValue(name)}; known: ${this.names.join(', ')}`);
    return tensor;
  }

  /** Layout of the tensor called `name`. */
  layout(name: string): TensorLayout {
    const layout = typeof name === 'string' ? this.layouts.get(name) : undefined;
    if (!layout) throw new InvalidArgumentError(`ParamSet.layout: no tensor ${describeValue(name)}; known: ${this.names.join(', ')}`);
    return layout;
  }

  /**
   * The view of tensor `name` inside any flat buffer with this ParamSet's layout (weights, grads,
   * optimizer state). A tensor of more than MAX_VIEW_LENGTH elements has no view (`ViewTooLargeError`).
   */
  view(buffer: FlatBuffer, name: string): Float32Array {
    this.checkLive('view');
    if (!(buffer instanceof FlatBuffer))
      throw new InvalidArgumentError(`ParamSet.view(buffer, name): buffer must be a FlatBuffer, got ${describeValue(buffer)}`);
    if (buffer.length !== this.length)
      throw new SizeMismatchError(`ParamSet.view: the buffer has ${buffer.length} elements, this ParamSet ${this.length}`);
    const l = this.layout(name);
    return buffer.view(l.offset, l.size);
  }

  /** Sets every gradient to zero. */
  zeroGrad(): void {
    this.checkLive('zeroGrad');
    this.grads.fill(0);
  }

  /** Frees the weights and gradients; the tensors' views become empty. */
  dispose(): void {
    if (this.isDisposed) return;
    this.weightBuffer.dispose();
    this.gradBuffer.dispose();
    this.isDisposed = true;
  }

  /** @internal */
  checkLive(what: string): void {
    if (this.isDisposed) throw new DisposedError(`ParamSet.${what}: the ParamSet was disposed`);
  }
}
