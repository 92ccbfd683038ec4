/**
 * The stages of a pipeline on one device, in this process: each stage is a StageHost built here
 * and driven by the same requests a stage thread answers, so the trainer handles both alike. The
 * stages interleave on this thread at their waits (a receive not yet sent, a send not yet
 * received), in the order their schedules allow, while the device runs what they enqueued, each
 * stage on a stream of its own (AvgPipe's shared stages: each stage a stream per pipeline);
 * transfers between them are device-to-device copies ordered by events (DeviceLinks, one set per
 * pipeline).
 */
import { EventEmitter } from 'node:events';

import { modelDevice } from '../../nn/ops.js';
import { PeerLostError } from '../../errors.js';
import { DeviceLinks } from './device-links.js';
import { type FromStage, type PipelineData, type StageDescription, type ToStage, StageHost, answerStage, describeError, readyMessage } from './stage-host.js';

/**
 * @internal What the trainer asks of a stage worker: a worker thread, or an in-process stage.
 * Events: `message` (a FromStage), `error`, `exit` (code).
 */
export interface StageWorker {
  postMessage(message: ToStage): void;
  // The listener's argument depends on the event, as in a Worker's overloads.
  on(event: 'message' | 'error' | 'exit', listener: (value: any) => void): unknown;
  once(event: 'exit', listener: () => void): unknown;
  terminate(): Promise<number>;
}

/** @internal One stage of a device pipeline, answering the trainer's requests in order. */
class InProcessStage extends EventEmitter implements StageWorker {
  private host: StageHost | undefined;
  private chain: Promise<void>;
  private exited = false;

  private readonly stage: number;

  /** `links`: one per pipeline (AvgPipe's shared stages: every stage runs every pipeline), else one. */
  constructor(
    description: StageDescription,
    data: PipelineData,
    private readonly links: readonly DeviceLinks[],
  ) {
    super();
    this.stage = description.stage;
    // Built after the caller has attached its listeners (the next turn of the event loop).
    this.chain = new Promise<void>((resolve) => setImmediate(resolve)).then(async () => {
      try {
        const transports = links.map((l) => l.transport(description.stage));
        this.host = await StageHost.create(description, description.averaging?.layout === 'shared-stages' ? transports : transports[0], data);
        this.post(readyMessage(this.host, 0));
      } catch (error) {
        this.fail(description.stage, error);
      }
    });
  }

  postMessage(message: ToStage): void {
    this.chain = this.chain.then(async () => {
      if (this.exited) return;
      const host = this.host;
      if (!host) return; // its build failed, and said so
      try {
        if (message.type === 'stop') {
          await this.end();
          return;
        }
        const reply = await answerStage(host, message, 1, 0);
        if (reply) this.post(reply);
      } catch (error) {
        this.fail(host.description.stage, error);
      }
    });
  }

  /** Stops the stage once its current request settles (a round in flight fails at its next wait: the links are closed). */
  terminate(): Promise<number> {
    for (const l of this.links) l.close();
    return this.chain.then(() => this.end()).then(() => 1);
  }

  private post(message: FromStage): void {
    if (!this.exited) queueMicrotask(() => this.emit('message', message));
  }

  private fail(stage: number, error: unknown): void {
    this.post(describeError(stage, error));
    // The other stages waiting on this one fail at once instead of at their timeout.
    for (const l of this.links) l.close(new PeerLostError(`pipeline stage ${stage} failed`));
  }

  private async end(): Promise<void> {
    if (this.exited) return;
    this.exited = true;
    const host = this.host;
    this.host = undefined;
    try {
      await host?.dispose();
    } finally {
      for (const l of this.links) l.stageEnded(this.stage);
      setImmediate(() => this.emit('exit', 0));
    }
  }
}

/**
 * @internal Starts every stage of `descriptions` (all on `descriptions[i].device`) in this process:
 * one pipeline, or AvgPipe's N pipelines on the shared stages, each pipeline with links (and so a
 * stream per stage) of its own.
 */
export function startDeviceStages(descriptions: readonly StageDescription[], data: PipelineData, timeoutMs: number): StageWorker[] {
  const first = descriptions[0]!;
  const pipelines = first.averaging?.layout === 'shared-stages' ? first.schedule.pipelines : 1;
  const links = Array.from({ length: pipelines }, () => new DeviceLinks(descriptions.length, modelDevice(first.device!), timeoutMs));
  return descriptions.map((d) => new InProcessStage(d, data, links));
}
