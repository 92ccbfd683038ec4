/**
 * Follows a backward pass on the device through the gradient's buckets (the device trainer with
 * `overlapBackward`). The model reports each layer's parameter gradients as it enqueues them
 * (GradientListener); once every parameter of a bucket has been reported, the bucket's event is
 * recorded on the device's default stream, behind the operations that write it, and the NCCL step
 * makes that bucket's reduction wait for it on the GPU. Padding between tensors is never written
 * by a backward, so a bucket counts as complete when its tensors' elements are.
 *
 * A report that overlaps one already made since the last step starts a new backward pass (the
 * gradient is being written again: a second backward, or one after zeroGrad), so every bucket must
 * be reported again before the step; an incomplete pass is refused at step() rather than reduced.
 */
import { InvalidArgumentError } from '../errors.js';
import { DeviceEvents, type CudaDevice, type DeviceBuffer } from '../device/index.js';
import type { ParamSet } from '../tensor.js';
import { describeValue } from '../validate.js';

/** @internal One gradient buffer's progress through a backward pass, and its events. */
class BufferProgress {
  readonly events: DeviceEvents;
  remaining: number[];
  reported: Array<[number, number]> = [];
  constructor(
    device: CudaDevice,
    private readonly expected: readonly number[],
  ) {
    this.events = DeviceEvents.create(expected.length, { device });
    this.remaining = [...expected];
  }
  /** Starts a pass with nothing reported. */
  restart(): void {
    this.reported = [];
    this.remaining = [...this.expected];
  }
}

/** @internal See the file comment. */
export class BackwardBuckets {
  private readonly byBuffer = new Map<DeviceBuffer, BufferProgress>();
  /** Every tensor's offset, in increasing order, its size, and the tensor elements before it. */
  private readonly starts: number[];
  private readonly sizes: number[];
  private readonly before: number[];
  /** Every bucket's offset, in increasing order. */
  private readonly bucketStarts: number[];

  /**
   * `ranges`: the step's buckets ([offset, count], from offset 0, as bucketRanges cuts them);
   * `buffers`: the device gradient buffers a backward writes (two in the staleness-1 modes).
   */
  constructor(
    params: ParamSet,
    private readonly ranges: ReadonlyArray<readonly [number, number]>,
    buffers: readonly DeviceBuffer[],
    device: CudaDevice,
  ) {
    const layouts = params.names.map((n) => params.layout(n)).sort((a, b) => a.offset - b.offset);
    this.starts = layouts.map((l) => l.offset);
    this.sizes = layouts.map((l) => l.size);
    this.before = [];
    let total = 0;
    for (const size of this.sizes) {
      this.before.push(total);
      total += size;
    }
    this.bucketStarts = ranges.map(([offset]) => offset);
    const expected = ranges.map(([offset, count]) => this.tensorElements(offset, offset + count));
    try {
      for (const b of buffers) this.byBuffer.set(b, new BufferProgress(device, expected));
    } catch (error) {
      this.dispose();
      throw error;
    }
  }

  /** Elements the buckets cover. */
  private get length(): number {
    const last = this.ranges[this.ranges.length - 1];
    return last === undefined ? 0 : last[0] + last[1];
  }

  /** The GradientListener: [offset, offset + count) of `grads` is enqueued. Reports on other buffers are not this trainer's. */
  report(grads: unknown, offset: number, count: number): void {
    const p = this.byBuffer.get(grads as DeviceBuffer);
    if (!p) return;
    const end = this.length;
    if (!Number.isInteger(offset) || !Number.isInteger(count) || offset < 0 || count < 0 || offset + count > end)
      throw new InvalidArgumentError(`DataParallelTrainer: the model reported gradients at [${describeValue(offset)}, + ${describeValue(count)}), outside the gradient's ${end} elements`);
    if (count === 0) return;
    const hi = offset + count;
    if (p.reported.some(([a, b]) => a < hi && offset < b)) p.restart();
    if (p.reported.length === 0)
      // Buckets of padding alone (none with bucketRanges' cache-line cuts, but cheap to be sure).
      p.remaining.forEach((r, k) => {
        if (r === 0) p.events.record(k);
      });
    p.reported.push([offset, hi]);
    // The buckets the range meets: from the one holding `offset` on.
    for (let k = Math.max(0, lastAtOrBelow(this.bucketStarts, offset)); k < this.ranges.length && this.ranges[k]![0] < hi; k++) {
      const [start, n] = this.ranges[k]!;
      const lo = Math.max(start, offset);
      const up = Math.min(start + n, hi);
      if (lo >= up || p.remaining[k] === 0) continue;
      p.remaining[k]! -= this.tensorElements(lo, up);
      if (p.remaining[k] === 0) p.events.record(k);
    }
  }

  /**
   * The events of `grads` for the step about to reduce it: InvalidArgumentError naming the first
   * bucket the backward has not reported completely since the last step. The next pass starts empty.
   */
  take(grads: DeviceBuffer): DeviceEvents {
    const p = this.byBuffer.get(grads);
    if (!p) throw new InvalidArgumentError('DataParallelTrainer: the device gradient is not one the trainer follows');
    const k = p.remaining.findIndex((r) => r !== 0);
    if (k >= 0) {
      const [offset, count] = this.ranges[k]!;
      throw new InvalidArgumentError(
        `DataParallelTrainer.step: the model's backward pass has not reported every gradient of bucket ${k} ([${offset}, ${offset + count}) of the device gradient) since the last step, so it cannot be reduced behind the backward; run the backward into trainer.deviceGrads before step(), or create the trainer with overlapBackward: false (one wait for the whole backward) for a model that writes the gradient otherwise`,
      );
    }
    p.restart();
    return p.events;
  }

  /** The whole of `grads` was written at once (zeroGrad, on the default stream): every bucket is complete. */
  markWritten(grads: DeviceBuffer): void {
    const p = this.byBuffer.get(grads);
    if (!p) return;
    p.restart();
    if (this.length > 0) this.report(grads, 0, this.length);
  }

  dispose(): void {
    for (const p of this.byBuffer.values()) p.events.dispose();
    this.byBuffer.clear();
  }

  /** Elements of the tensors within [lo, hi). */
  private tensorElements(lo: number, hi: number): number {
    return this.elementsBelow(hi) - this.elementsBelow(lo);
  }

  /** Elements of the tensors below offset x. */
  private elementsBelow(x: number): number {
    const i = lastAtOrBelow(this.starts, x - 1);
    return i < 0 ? 0 : this.before[i]! + Math.min(this.sizes[i]!, x - this.starts[i]!);
  }
}

/** The index of the last of the increasing `values` at or below x, or -1. */
function lastAtOrBelow(values: readonly number[], x: number): number {
  let lo = 0;
  let hi = values.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (values[mid]! <= x) lo = mid + 1;
    else hi = mid;
  }
  return lo - 1;
}
