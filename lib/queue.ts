/**
 * Execution queues: each runs its operations in order on a native worker thread, off the JS
 * thread, like a CUDA stream. Optimizers use the process-wide default queue unless given one.
 */
import { awaitNative, callNative, nativeAddon, type QueueHandle } from './native.js';

/**
 * An in-order native execution queue (one worker thread), like a CUDA stream: async steps and
 * collectives run on one off the JavaScript thread, in the order they were issued.
 *
 * @category Tensors and memory
 */
export class ExecutionQueue {
  /** @internal */
  readonly handle: QueueHandle;
  constructor() {
    const addon = nativeAddon();
    this.handle = callNative(() => new addon.Queue());
  }
  private closing: Promise<void> | undefined;
  /** Operations submitted and not yet settled. */
  get pending(): number {
    return this.handle.pending;
  }
  /**
   * Takes no more operations (submitting one throws DisposedError), lets those already submitted
   * run and settle, then ends the worker thread. Resolves once the thread is joined. Idempotent.
   * Without it the thread ends only when garbage collection frees the queue.
   */
  close(): Promise<void> {
    this.closing ??= awaitNative(callNative(() => this.handle.close()));
    return this.closing;
  }
}

let defaultQueue: ExecutionQueue | undefined;

/** The process-wide queue (created on first use). @category Tensors and memory */
export function defaultExecutionQueue(): ExecutionQueue {
  defaultQueue ??= new ExecutionQueue();
  return defaultQueue;
}
