/**
 * @deprecated The CUDA backend's entries moved to lib/device (cuda-native.ts, probe.ts,
 * device-spec.ts, kernels.ts). This re-export is kept only for the modules being moved out of
 * lib (lib/bench imports it); import '../device/index.js' instead, and delete it once nothing does.
 */
export {
  cudaAddon,
  cudaBenchUpdate,
  cudaStatus,
  NcclCollective,
  parseDevice,
  probeCublas,
  probeCuda,
  probeNccl,
  requireCudaDevice,
  type CudaAddon,
  type CudaBenchTiming,
  type CudaBufferHandle,
  type CudaDeviceInfo,
  type CudaStatus,
  type CudaUpdateBuffers,
  type NcclCommHandle,
  type NcclStatus,
  type NcclStepResult,
} from '../device/index.js';
