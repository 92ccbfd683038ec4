/**
 * A stream of its own on a device, for work that shares the device with other streams in this
 * process (the stages of a device pipeline): `run(fn)` enqueues every device operation fn makes
 * (model operations, DeviceBuffer copies, DeviceParamSet steps) on this stream instead of the
 * legacy default stream. The plugin's streams are non-blocking, so they are ordered against one
 * another, and against the default stream, only by events (`record`, `wait`) or by the host
 * waiting for them (`synchronize`).
 *
 * The current stream is a per-thread slot, set for the duration of a synchronous call only: fn
 * must not be async (refused), because at an await other code of this thread (another stage)
 * runs, and would otherwise enqueue on this stream.
 */
import { setImmediate as nextTurn, setTimeout as pause } from 'node:timers/promises';

import { DisposedError, InvalidArgumentError, TimeoutError } from '../errors.js';
import { callNative } from '../native.js';
import { checkInteger } from '../validate.js';
import { cudaAddon, type CudaStreamHandle } from './cuda-native.js';
import { cudaDeviceIndex, type CudaDevice } from './device-spec.js';
import type { DeviceEvents } from './events.js';

/** @category Tensors and memory */
export class DeviceStream {
  readonly device: CudaDevice;
  private native: CudaStreamHandle | undefined;

  private constructor(device: CudaDevice, native: CudaStreamHandle) {
    this.device = device;
    this.native = native;
  }

  /** A new stream on `device` (`cuda:N`). */
  static create(options: { device: CudaDevice }): DeviceStream {
    if (options === null || typeof options !== 'object') throw new InvalidArgumentError("DeviceStream.create(options): options must be { device: 'cuda:N' }");
    const index = cudaDeviceIndex(options.device, 'DeviceStream.create: options.device');
    const addon = cudaAddon();
    return new DeviceStream(`cuda:${index}`, callNative(() => new addon.CudaStream(index)));
  }

  /**
   * fn() with this stream current on its device; the previous current stream is restored when fn
   * returns or throws. fn must be synchronous: a returned Promise is refused (ERR_INVALID_ARGUMENT)
   * after the stream was restored, since the work after its first await would run elsewhere.
   */
  run<T>(fn: () => T): T {
    if (typeof fn !== 'function') throw new InvalidArgumentError('DeviceStream.run(fn): fn must be a function');
    const native = this.live('run');
    const result = native.run(fn);
    if (result instanceof Promise) throw new InvalidArgumentError('DeviceStream.run(fn): fn must be synchronous (at an await, other code of this thread would enqueue on the stream)');
    return result;
  }

  /** Records `events`' event `index` behind everything enqueued on this stream so far. */
  record(events: DeviceEvents, index: number): void {
    const native = this.live('record');
    checkInteger(index, 'DeviceStream.record(index)', 0, events.count - 1);
    callNative(() => native.record(events.handleFor('record'), index));
  }

  /** Later work on this stream waits, on the device, for the last record of `events`' event `index`. */
  wait(events: DeviceEvents, index: number): void {
    const native = this.live('wait');
    checkInteger(index, 'DeviceStream.wait(index)', 0, events.count - 1);
    callNative(() => native.wait(events.handleFor('wait'), index));
  }

  /** Blocks until everything enqueued on this stream has run. */
  synchronize(): void {
    const native = this.live('synchronize');
    callNative(() => native.synchronize());
  }

  /**
   * Resolves once everything enqueued on this stream so far has run, without blocking the thread
   * (it polls, first on each turn of the event loop, then every millisecond), so other code of
   * this thread (other stages) keeps issuing work meanwhile; rejects with ERR_TIMEOUT after
   * `timeoutMs`.
   */
  async idle(timeoutMs: number): Promise<void> {
    checkInteger(timeoutMs, 'DeviceStream.idle(timeoutMs)', 1, 2 ** 31 - 1);
    const deadline = performance.now() + timeoutMs;
    for (let polls = 0; ; polls++) {
      const native = this.live('idle');
      if (callNative(() => native.query())) return;
      if (performance.now() >= deadline) throw new TimeoutError(`DeviceStream.idle: the stream on ${this.device} was still busy after ${timeoutMs} ms`);
      // The first polls catch a stream about to finish at no cost in latency; later ones leave the CPU alone.
      await (polls < 16 ? nextTurn() : pause(1));
    }
  }

  get disposed(): boolean {
    return this.native === undefined;
  }

  /** Drops the stream (a run() in progress keeps it until it returns). Idempotent. */
  dispose(): void {
    this.native?.dispose();
    this.native = undefined;
  }

  private live(what: string): CudaStreamHandle {
    if (!this.native) throw new DisposedError(`DeviceStream.${what}: the stream was disposed`);
    return this.native;
  }
}
