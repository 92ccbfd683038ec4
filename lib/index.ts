/**
 * sapipe: staleness-aware distributed training for Node.js.
 * The public API; see README.md for an overview and docs/ for guides.
 */
export * from './errors.js';
export { FlatBuffer, ParamSet, Tensor, ALIGN_ELEMENTS, MAX_VIEW_LENGTH, type Shape, type ParamSpec, type TensorLayout, type MemorySource, type ParamSetOptions } from './tensor.js';
export { ExecutionQueue, defaultExecutionQueue } from './queue.js';
export { DeviceBuffer, DeviceParamSet, chooseDevice, cudaDeviceIndex, type CudaDevice, type DeviceChoice, type DeviceOptions, type DeviceParamSetOptions } from './device/index.js';
export * from './optim/index.js';
export { elasticAverage, sum, scale, axpy, squaredNorm, countNonFinite, clipByNorm, type SumOptions } from './ops.js';
export { nativeInfo } from './info.js';
export { kernelThreads, MAX_KERNEL_THREADS, useKernelThreads } from './kernel-threads.js';
export { packageVersion } from './version.js';
export * from './comm/index.js';
export * from './dataparallel/index.js';
export * from './checkpoint/index.js';
export * from './compress/index.js';
export * from './data/index.js';
export * from './launch/index.js';
export * from './pipeline/index.js';
export * from './nn/index.js';
export {
  backendStatuses,
  selectBackend,
  selectCommBackend,
  type BackendStatus,
  type BackendSelection,
  type ComputeBackendName,
  type ComputeBackendPreference,
  type CommBackendPreference,
} from './backends/index.js';
