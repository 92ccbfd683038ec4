/**
 * `sapipe/kernels`: the native kernels' raw bindings and their variant table, for microbenchmarks
 * and tools (the CLI's `sapipe bench` is built on it). This is a lower level than the main API:
 * callers own the buffers they allocate and pass handles, and only the kernels' own argument
 * checks apply. Training code wants `sapipe`.
 */
export { nativeAddon, nativeUnavailableReason, OptimizerKind, CompensationKind, PredictionKind, EstimateKind, type NativeAddon, type NativeBufferHandle, type NativeUpdateConfig, type NativeUpdateBuffers, type NativeUpdateResult } from './native.js';
export { commAddon } from './comm/local-native.js';
export { cudaBenchUpdate, type CudaBenchTiming } from './backends/cuda.js';
