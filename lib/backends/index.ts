/** The backends: what each probe reports (registry.ts) and the choice among them (select.ts). */
export type { BackendProbe, BackendStatus } from './status.js';
export { backendStatuses } from './registry.js';
export * from './select.js';
export { cudaStatus, parseDevice, requireCudaDevice, type CudaStatus } from '../device/index.js';
export { ucxStatus, type UcxPluginStatus } from '../comm/ucx-native.js';
