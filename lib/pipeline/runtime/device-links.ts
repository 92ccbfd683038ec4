/**
 * The transfers between pipeline stages that share one device in one process: a send is a
 * device-to-device copy into the buffer the receiving stage posted, made once both sides are
 * there (in the order each pair of stages posted them, as a Communicator's send/recv). Every wait
 * is bounded by the timeout, and closing the links (a stage failed) fails every wait at once.
 *
 * Each stage has a stream of its own (`transport(stage).stream`, where its runner enqueues its
 * work), and streams are ordered only where data crosses, by events, on the device:
 * - the sender records an event on its stream when it posts the send (behind the work that
 *   produced the message, or, if the receive was posted first, when the send arrives);
 * - the receiver's stream waits for that event, and the copy is enqueued there, on the receiver's
 *   stream, so the receiver's later reads of its buffer follow it in stream order;
 * - the receiver then records an event behind the copy, and the sender's stream waits for it:
 *   the sender may reuse its buffer once the send settles (now), and its next write there must not
 *   overtake the copy still reading it.
 * No host wait is involved; the host-memory plugin checks this order (a stream touching memory
 * another stream touched without such a wait is refused there).
 */
import { DeviceEvents } from '../../device/events.js';
import { DeviceStream } from '../../device/stream.js';
import { PeerLostError, SizeMismatchError, TimeoutError } from '../../errors.js';
import type { ModelDevice, Tensor } from '../../nn/ops.js';
import type { StageTransport } from './stage-runner.js';

interface Waiting {
  readonly buffer: Tensor;
  /** A send's event, recorded on the sender's stream when it was posted. */
  readonly event: DeviceEvents | undefined;
  resolve(): void;
  reject(error: unknown): void;
  readonly timer: NodeJS.Timeout;
}

/** @internal The links of `size` stages on one device; `transport(stage)` is what stage `stage`'s runner is given. */
export class DeviceLinks {
  /** `from>to` -> sends not yet received, and receives not yet sent, in posting order. */
  private readonly sends = new Map<string, Waiting[]>();
  private readonly recvs = new Map<string, Waiting[]>();
  private closedWith: Error | undefined;
  /** Each stage's stream; none where the memory is the host's. */
  private readonly streams: (DeviceStream | undefined)[];
  /** Events not in use (one event each), reused: a wait takes the event's record when it is enqueued. */
  private readonly spareEvents: DeviceEvents[] = [];
  private readonly ended = new Set<number>();

  constructor(
    readonly size: number,
    private readonly memory: ModelDevice,
    private readonly timeoutMs: number,
  ) {
    const device = memory.device;
    this.streams = Array.from({ length: size }, () => (device === 'cpu' ? undefined : DeviceStream.create({ device })));
  }

  transport(stage: number): StageTransport {
    const stream = this.streams[stage];
    return {
      size: this.size,
      // each send waits for its receive on its own: posting one early holds up nothing
      independentSends: true,
      send: (buffer, peer) => this.post(this.sends, this.recvs, `${stage}>${peer}`, buffer, stage, peer, 'send'),
      recv: (buffer, peer) => this.post(this.recvs, this.sends, `${peer}>${stage}`, buffer, stage, peer, 'recv'),
      ...(stream ? { stream, idle: () => stream.idle(this.timeoutMs) } : {}),
    };
  }

  /** Fails every wait, now and later, with `error` (a stage failed, or the trainer stopped). */
  close(error: Error = new PeerLostError('a pipeline stage on this device stopped')): void {
    if (this.closedWith) return;
    this.closedWith = error;
    for (const queues of [this.sends, this.recvs])
      for (const list of queues.values())
        for (const w of list.splice(0)) {
          clearTimeout(w.timer);
          if (w.event) this.spareEvents.push(w.event);
          w.reject(error);
        }
  }

  /** Stage `stage` has stopped: the streams and events go once every stage has. */
  stageEnded(stage: number): void {
    this.ended.add(stage);
    if (this.ended.size === this.size) this.dispose();
  }

  /** Drops the streams and events (the streams finish what they hold). Idempotent. */
  dispose(): void {
    this.close();
    for (const s of this.streams) s?.dispose();
    for (const e of this.spareEvents.splice(0)) e.dispose();
  }

  /** An event recorded now on `stage`'s stream, or undefined on the host. */
  private recordOn(stage: number): DeviceEvents | undefined {
    const stream = this.streams[stage];
    if (!stream) return undefined;
    const event = this.spareEvents.pop() ?? DeviceEvents.create(1, { device: stream.device });
    stream.record(event, 0);
    return event;
  }

  /** dst = src, on the receiver's stream after the sender's event; the sender's stream then waits for the copy. */
  private transfer(dst: Tensor, src: Tensor, sender: number, receiver: number, sent: DeviceEvents | undefined): void {
    const [from, to] = [this.streams[sender], this.streams[receiver]];
    if (!from || !to) {
      this.memory.copy(dst, src, src.length);
      return;
    }
    const produced = sent ?? this.recordOn(sender)!;
    try {
      to.wait(produced, 0);
      to.run(() => this.memory.copy(dst, src, src.length));
      const copied = this.recordOn(receiver)!;
      from.wait(copied, 0);
      this.spareEvents.push(copied);
    } finally {
      this.spareEvents.push(produced);
    }
  }

  private post(mine: Map<string, Waiting[]>, theirs: Map<string, Waiting[]>, key: string, buffer: Tensor, stage: number, peer: number, kind: 'send' | 'recv'): Promise<void> {
    if (this.closedWith) return Promise.reject(this.closedWith);
    const match = theirs.get(key)?.shift();
    if (match) {
      clearTimeout(match.timer);
      const [src, dst] = kind === 'send' ? [buffer, match.buffer] : [match.buffer, buffer];
      const [sender, receiver] = kind === 'send' ? [stage, peer] : [peer, stage];
      try {
        if (src.length !== dst.length) {
          if (match.event) this.spareEvents.push(match.event);
          throw new SizeMismatchError(`stage ${sender} sent ${src.length} values to stage ${receiver}, which expected ${dst.length}`);
        }
        this.transfer(dst, src, sender, receiver, match.event);
      } catch (error) {
        match.reject(error);
        return Promise.reject(error);
      }
      match.resolve();
      return Promise.resolve();
    }
    let event: DeviceEvents | undefined;
    try {
      event = kind === 'send' ? this.recordOn(stage) : undefined;
    } catch (error) {
      return Promise.reject(error);
    }
    return new Promise<void>((resolve, reject) => {
      const list = mine.get(key) ?? [];
      mine.set(key, list);
      const waiting: Waiting = {
        buffer,
        event,
        resolve,
        reject,
        timer: setTimeout(() => {
          const i = list.indexOf(waiting);
          if (i >= 0) list.splice(i, 1);
          if (event) this.spareEvents.push(event);
          reject(new TimeoutError(`pipeline stage ${stage}: a ${kind} ${kind === 'send' ? 'to' : 'from'} stage ${peer} on the device waited ${this.timeoutMs} ms for its peer`));
        }, this.timeoutMs),
      };
      list.push(waiting);
    });
  }
}
