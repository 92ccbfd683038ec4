/**
 * The cores a thread's native kernels use. By default every thread's kernels share one
 * process-wide pool that runs one job at a time, so two threads computing at once (pipeline
 * stages as worker threads) take turns job by job, each waiting while the other's job runs. A
 * thread given kernel threads of its own computes beside the others, like a device of its own: a
 * set of cores. Queued native work (an optimizer's `step()`) runs on the submitting thread's set.
 */
import { nativeInfo } from './info.js';
import { nativeAddon } from './native.js';
import { checkInteger } from './validate.js';

/** The most threads one thread's kernels may be given. @category Backends */
export const MAX_KERNEL_THREADS = 1024;

/**
 * @internal A kernel-thread setting checked: `shared`, or a count in [1, MAX_KERNEL_THREADS]
 * (`what` names it in the error).
 */
export function checkKernelThreads(value: unknown, what: string): number | 'shared' {
  if (value === 'shared') return 'shared';
  return checkInteger(value, `${what} (or 'shared')`, 1, MAX_KERNEL_THREADS);
}

/**
 * Gives the calling thread (the main thread, or a worker thread) `threads` kernel threads of its
 * own: the caller and `threads - 1` workers; with 1 every kernel it calls runs on the calling
 * thread alone. `'shared'` returns it to the process-wide pool. Returns the threads its kernels
 * now use (fewer than asked where the system refuses to start threads).
 *
 * @category Backends
 */
export function useKernelThreads(threads: number | 'shared'): number {
  const checked = checkKernelThreads(threads, 'useKernelThreads: threads');
  return nativeAddon().bindKernelThreads(checked === 'shared' ? 0 : checked);
}

/** The threads the calling thread's kernels use: its own set, or the process-wide pool's. @category Backends */
export function kernelThreads(): number {
  const own = nativeAddon().kernelThreads();
  return own > 0 ? own : nativeInfo().threads;
}

/** The calling thread's own kernel threads, or `shared` where it has none. */
function ownKernelThreads(): number | 'shared' {
  const own = nativeAddon().kernelThreads();
  return own > 0 ? own : 'shared';
}

/**
 * @internal Runs `fn` with the calling thread's kernels on `threads`, then gives the thread back
 * what it had; where `fn` returns a promise, once that settles (other work of the thread's event
 * loop meanwhile runs on `threads` too).
 */
export function withKernelThreads<T>(threads: number | 'shared', fn: () => T): T {
  const before = ownKernelThreads();
  useKernelThreads(threads);
  let result: T;
  try {
    result = fn();
  } catch (error) {
    useKernelThreads(before);
    throw error;
  }
  if (result instanceof Promise) return result.finally(() => useKernelThreads(before)) as T;
  useKernelThreads(before);
  return result;
}
