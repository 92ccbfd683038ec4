/**
 * GPU memory seen from JavaScript: DeviceBuffer, fp32 memory on one `cuda:N` device (a ParamSet's
 * state on a device is DeviceParamSet, ./param-set.ts).
 *
 * A separate type rather than a `device` field on FlatBuffer: a FlatBuffer *is* host memory (its
 * `array` is a zero-copy Float32Array, and every CPU kernel and host collective reads it), so a
 * device flag would turn each of those into a run-time check and a possible late failure. With
 * two types the compiler keeps host and device buffers apart, and crossing is explicit
 * (`copyFromHost`, `copyToHost`).
 *
 * Every entry validates its arguments first (ERR_INVALID_ARGUMENT, ERR_SIZE_MISMATCH,
 * ERR_DISPOSED) and only then touches the device; where no device can be used it throws
 * BackendUnavailableError whose message is the plugin's reason (no plugin built, no driver
 * libcuda.so.1, no device, a plugin too old). Copies are synchronous: when they return, the data
 * is where it was sent. Inside a DeviceStream's run(), copies go on that stream: host copies wait
 * for it, and a device-to-device copy is only enqueued there, in order with the stream's work.
 */
import { DisposedError, InvalidArgumentError, SizeMismatchError } from '../errors.js';
import { callNative } from '../native.js';
import { FlatBuffer } from '../tensor.js';
import { describeValue } from '../validate.js';
import { cudaAddon, type CudaBufferHandle } from './cuda-native.js';
import { cudaDeviceIndex, type CudaDevice } from './device-spec.js';

/** @category Tensors and memory */
export interface DeviceOptions {
  /** Where the memory lives: `cuda:N`. */
  device: CudaDevice;
}

/** @internal The device index of `options.device`; InvalidArgumentError naming `what` when it is not one. */
export function checkDeviceOptions(options: unknown, what: string): number {
  if (options === null || typeof options !== 'object')
    throw new InvalidArgumentError(`${what}: options must be an object like { device: 'cuda:0' }`);
  return cudaDeviceIndex((options as DeviceOptions).device, `${what}: options.device`);
}

function checkLength(length: unknown, what: string): number {
  if (typeof length !== 'number' || !Number.isInteger(length) || length < 0 || length > 0xffffffff)
    throw new InvalidArgumentError(`${what}: length must be an integer in [0, 2^32 - 1], got ${describeValue(length)}`);
  return length;
}

function checkOffset(offset: unknown, what: string): number {
  if (typeof offset !== 'number' || !Number.isInteger(offset) || offset < 0)
    throw new InvalidArgumentError(`${what} must be a non-negative integer, got ${describeValue(offset)}`);
  return offset;
}

/** The Float32Array of a host source or destination; DisposedError for a disposed FlatBuffer. */
function hostArray(value: unknown, what: string): Float32Array {
  if (value instanceof FlatBuffer) {
    if (value.disposed) throw new DisposedError(`${what} was disposed; allocate a new buffer`);
    return value.array;
  }
  if (value instanceof Float32Array) return value;
  throw new InvalidArgumentError(`${what} must be a FlatBuffer or a Float32Array`);
}

/** fp32 memory on one CUDA device, owned by native code. Zero-filled when allocated. @category Tensors and memory */
export class DeviceBuffer {
  /** @internal */
  readonly handle: CudaBufferHandle;

  private constructor(handle: CudaBufferHandle) {
    this.handle = handle;
  }

  /** Allocates `length` zero-filled floats on `options.device`. */
  static allocate(length: number, options: DeviceOptions): DeviceBuffer {
    const index = checkDeviceOptions(options, 'DeviceBuffer.allocate');
    checkLength(length, 'DeviceBuffer.allocate');
    const addon = cudaAddon();
    return new DeviceBuffer(callNative(() => new addon.CudaBuffer(index, length)));
  }

  /** Allocates a device buffer holding a copy of `values`. */
  static from(values: FlatBuffer | Float32Array, options: DeviceOptions): DeviceBuffer {
    const array = hostArray(values, 'DeviceBuffer.from(values)');
    checkDeviceOptions(options, 'DeviceBuffer.from');
    const buffer = DeviceBuffer.allocate(array.length, options);
    try {
      buffer.copyFromHost(array);
    } catch (error) {
      buffer.dispose();
      throw error;
    }
    return buffer;
  }

  get length(): number {
    return this.handle.length;
  }

  /** `cuda:N`. */
  get device(): CudaDevice {
    return `cuda:${this.handle.device}`;
  }

  get deviceIndex(): number {
    return this.handle.device;
  }

  get disposed(): boolean {
    return this.handle.disposed;
  }

  /** Copies `src` into this buffer at element `offset` (default 0). */
  copyFromHost(src: FlatBuffer | Float32Array, offset = 0): void {
    this.checkLive('copyFromHost');
    const array = hostArray(src, 'DeviceBuffer.copyFromHost(src)');
    checkOffset(offset, 'DeviceBuffer.copyFromHost(offset)');
    if (offset + array.length > this.length)
      throw new SizeMismatchError(`DeviceBuffer.copyFromHost: ${array.length} floats at offset ${offset} exceed the buffer's ${this.length}`);
    callNative(() => this.handle.copyFromHost(array, offset));
  }

  /**
   * Copies this buffer, from element `offset` (default 0), into `dst` (as many elements as it
   * holds) and returns it; without `dst`, into a new Float32Array of the rest of the buffer.
   */
  copyToHost(dst?: FlatBuffer | Float32Array, offset = 0): Float32Array {
    this.checkLive('copyToHost');
    checkOffset(offset, 'DeviceBuffer.copyToHost(offset)');
    if (offset > this.length) throw new SizeMismatchError(`DeviceBuffer.copyToHost: offset ${offset} is past the buffer's ${this.length} elements`);
    const array = dst === undefined ? new Float32Array(this.length - offset) : hostArray(dst, 'DeviceBuffer.copyToHost(dst)');
    if (offset + array.length > this.length)
      throw new SizeMismatchError(`DeviceBuffer.copyToHost: ${array.length} floats from offset ${offset} exceed the buffer's ${this.length}`);
    callNative(() => this.handle.copyToHost(array, offset));
    return array;
  }

  /** Copies all of `src` (same device, at most this long) into this buffer from element 0 (enqueued only, inside a DeviceStream's run). */
  copyFrom(src: DeviceBuffer): void {
    this.copyFromDevice(src, false);
  }

  /**
   * @internal copyFrom enqueued on the device's default stream behind the model operations there,
   * without waiting: whatever reads the copy on another stream must wait for an event recorded
   * after it.
   */
  copyFromEnqueued(src: DeviceBuffer): void {
    this.copyFromDevice(src, true);
  }

  private copyFromDevice(src: DeviceBuffer, enqueueOnly: boolean): void {
    this.checkLive('copyFrom');
    if (!(src instanceof DeviceBuffer)) throw new InvalidArgumentError('DeviceBuffer.copyFrom(src) must be a DeviceBuffer');
    src.checkLive('copyFrom (source)');
    if (src.length > this.length) throw new SizeMismatchError(`DeviceBuffer.copyFrom: the source has ${src.length} elements, this buffer ${this.length}`);
    if (src.deviceIndex !== this.deviceIndex) throw new InvalidArgumentError(`DeviceBuffer.copyFrom: the source is on ${src.device}, this buffer on ${this.device}`);
    callNative(() => this.handle.copyFromDevice(src.handle, 0, 0, src.length, enqueueOnly));
  }

  /** NaN/Inf elements of [offset, offset + count) (default: the whole buffer), counted on the device. */
  countNonFinite(offset = 0, count = this.length - offset): number {
    this.checkLive('countNonFinite');
    checkOffset(offset, 'DeviceBuffer.countNonFinite(offset)');
    checkOffset(count, 'DeviceBuffer.countNonFinite(count)');
    if (offset + count > this.length) throw new SizeMismatchError(`DeviceBuffer.countNonFinite: the range exceeds the buffer's ${this.length} elements`);
    return callNative(() => cudaAddon().cudaCountNonFinite(this.handle, offset, count));
  }

  /** Frees the device memory now (ERR_BUSY while a queued collective uses it). Idempotent. */
  dispose(): void {
    callNative(() => this.handle.dispose());
  }

  /** @internal */
  checkLive(what: string): void {
    if (this.handle.disposed) throw new DisposedError(`DeviceBuffer.${what}: the buffer was disposed`);
  }
}
