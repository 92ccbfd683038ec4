/**
 * The transfers between pipeline stages that share one device in one process: a send is a
 * device-to-device copy into the buffer the receiving stage posted, made once both sides are
 * there (in the order each pair of stages posted them, as a Communicator's send/recv). Every wait
 * is bounded by the timeout, and closing the links (a stage failed) fails every wait at once.
 */
import { PeerLostError, SizeMismatchError, TimeoutError } from '../../errors.js';
import type { ModelDevice, Tensor } from '../../nn/ops.js';
import type { StageTransport } from './stage-runner.js';

interface Waiting {
  readonly buffer: Tensor;
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

  constructor(
    readonly size: number,
    private readonly memory: ModelDevice,
    private readonly timeoutMs: number,
  ) {}

  transport(stage: number): StageTransport {
    return {
      size: this.size,
      // each send waits for its receive on its own: posting one early holds up nothing
      independentSends: true,
      send: (buffer, peer) => this.post(this.sends, this.recvs, `${stage}>${peer}`, buffer, stage, peer, 'send'),
      recv: (buffer, peer) => this.post(this.recvs, this.sends, `${peer}>${stage}`, buffer, stage, peer, 'recv'),
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
          w.reject(error);
        }
  }

  private post(mine: Map<string, Waiting[]>, theirs: Map<string, Waiting[]>, key: string, buffer: Tensor, stage: number, peer: number, kind: 'send' | 'recv'): Promise<void> {
    if (this.closedWith) return Promise.reject(this.closedWith);
    const match = theirs.get(key)?.shift();
    if (match) {
      clearTimeout(match.timer);
      const [src, dst] = kind === 'send' ? [buffer, match.buffer] : [match.buffer, buffer];
      try {
        if (src.length !== dst.length)
          throw new SizeMismatchError(`stage ${kind === 'send' ? stage : peer} sent ${src.length} values to stage ${kind === 'send' ? peer : stage}, which expected ${dst.length}`);
        this.memory.copy(dst, src, src.length);
      } catch (error) {
        match.reject(error);
        return Promise.reject(error);
      }
      match.resolve();
      return Promise.resolve();
    }
    return new Promise<void>((resolve, reject) => {
      const list = mine.get(key) ?? [];
      mine.set(key, list);
      const waiting: Waiting = {
        buffer,
        resolve,
        reject,
        timer: setTimeout(() => {
          const i = list.indexOf(waiting);
          if (i >= 0) list.splice(i, 1);
          reject(new TimeoutError(`pipeline stage ${stage}: a ${kind} ${kind === 'send' ? 'to' : 'from'} stage ${peer} on the device waited ${this.timeoutMs} ms for its peer`));
        }, this.timeoutMs),
      };
      list.push(waiting);
    });
  }
}
