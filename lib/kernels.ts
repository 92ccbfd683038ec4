/**
 * `sapipe/kernels`: the native kernels' raw bindings, for microbenchmarks and tools (the CLI's
 * `sapipe bench` is built on it). This is a lower level than the main API: callers own the
 * buffers they allocate and pass handles, and only the bindings' own argument checks apply (their
 * failures are the same typed errors as everywhere: SapipeError subclasses with a `code`).
 * Training code wants `sapipe`.
 */
import type { CommAddon } from './comm/local-native.js';
import { fromNativeError } from './errors.js';
import { nativeAddon as rawAddon, type NativeAddon } from './native.js';

export { nativeUnavailableReason, OptimizerKind, CompensationKind, PredictionKind, EstimateKind, type NativeAddon, type NativeBufferHandle, type NativeUpdateConfig, type NativeUpdateBuffers, type NativeUpdateResult } from './native.js';
export { cudaBenchUpdate, type CudaBenchTiming } from './device/index.js';
export type { CommAddon } from './comm/local-native.js';

let wrapped: NativeAddon | undefined;

/** A binding's function with its native errors (and its Promise's rejections) turned into SapipeErrors. */
function typedErrors(fn: (...args: unknown[]) => unknown, self: object): (...args: unknown[]) => unknown {
  return (...args) => {
    let result: unknown;
    try {
      result = fn.apply(self, args);
    } catch (error) {
      throw fromNativeError(error);
    }
    return result instanceof Promise ? result.catch((error: unknown) => Promise.reject(fromNativeError(error))) : result;
  };
}

/**
 * The addon's bindings: the kernels, the buffers' and queues' classes, the communicators'
 * operations. Throws BackendUnavailableError, saying how to build it, where the addon is missing.
 * @category Kernels
 */
export function nativeAddon(): NativeAddon {
  if (wrapped !== undefined) return wrapped;
  const raw = rawAddon() as unknown as Record<string, unknown>;
  const out: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(raw)) {
    // Classes (NativeBuffer, Queue, ...) are constructed as they are; plain functions get typed errors.
    const isClass = typeof value === 'function' && /^class\b/.test(Function.prototype.toString.call(value));
    out[key] = typeof value === 'function' && !isClass && !/^[A-Z]/.test(key) ? typedErrors(value as (...args: unknown[]) => unknown, raw) : value;
  }
  wrapped = Object.freeze(out) as unknown as NativeAddon;
  return wrapped;
}

/** The same bindings, typed for the communicators' operations (the local group's, the CUDA staging copies). @category Kernels */
export function commAddon(): CommAddon {
  return nativeAddon() as unknown as CommAddon;
}
