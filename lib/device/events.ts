/**
 * Events on a device's default stream, one per gradient bucket: where a backward pass running
 * there has got to. The data-parallel trainer records bucket i's event once the backward has
 * enqueued every gradient of that bucket, and the NCCL step makes bucket i's reduction wait for it
 * on the GPU, so a bucket is reduced while the backward still computes the layers below it, with
 * no host wait for the whole backward (NcclCommunicator.allreduceAndStep's `ready`).
 *
 * On a GPU a wait on an event never recorded returns at once, so each event's state is kept here
 * too: recorded since the last step that waited on it, or not. The step refuses events not all
 * recorded (the host-memory plugin checks the same on its side).
 */
import { DisposedError, InvalidArgumentError } from '../errors.js';
import { callNative } from '../native.js';
import { checkInteger } from '../validate.js';
import { cudaAddon, type CudaEventsHandle } from './cuda-native.js';
import { cudaDeviceIndex, type CudaDevice } from './device-spec.js';

/** @category Tensors and memory */
export class DeviceEvents {
  readonly device: CudaDevice;
  readonly count: number;
  private native: CudaEventsHandle | undefined;
  private readonly recorded: boolean[];

  private constructor(device: CudaDevice, native: CudaEventsHandle) {
    this.device = device;
    this.native = native;
    this.count = native.count;
    this.recorded = new Array<boolean>(this.count).fill(false);
  }

  /** `count` events on `device` (`cuda:N`), none recorded. */
  static create(count: number, options: { device: CudaDevice }): DeviceEvents {
    checkInteger(count, 'DeviceEvents.create(count)', 1, 1 << 24);
    if (options === null || typeof options !== 'object') throw new InvalidArgumentError("DeviceEvents.create(count, options): options must be { device: 'cuda:N' }");
    const index = cudaDeviceIndex(options.device, 'DeviceEvents.create: options.device');
    const addon = cudaAddon();
    return new DeviceEvents(`cuda:${index}`, callNative(() => new addon.CudaEvents(index, count)));
  }

  /** Records event `index` behind everything enqueued so far on the device's default stream (where the model operations run). */
  record(index: number): void {
    const native = this.live('record');
    checkInteger(index, 'DeviceEvents.record(index)', 0, this.count - 1);
    callNative(() => native.record(index));
    this.recorded[index] = true;
  }

  /** Whether event `index` was recorded since a step last waited on the events. */
  isRecorded(index: number): boolean {
    checkInteger(index, 'DeviceEvents.isRecorded(index)', 0, this.count - 1);
    return this.recorded[index]!;
  }

  /** The first event not recorded since a step last waited on the events, or -1 when every one is. */
  firstUnrecorded(): number {
    return this.recorded.indexOf(false);
  }

  get disposed(): boolean {
    return this.native === undefined;
  }

  /** @internal The native events, for a step that waits on them. */
  handleFor(what: string): CudaEventsHandle {
    return this.live(what);
  }

  /** @internal A step that waits on the events was queued: each must be recorded again before the next. */
  markWaited(): void {
    this.recorded.fill(false);
  }

  /** Drops this object's events (a queued step that waits on them keeps them until it settles). Idempotent. */
  dispose(): void {
    this.native?.dispose();
    this.native = undefined;
  }

  private live(what: string): CudaEventsHandle {
    if (!this.native) throw new DisposedError(`DeviceEvents.${what}: the events were disposed`);
    return this.native;
  }
}
