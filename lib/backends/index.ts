/** The backends: what each probe reports (registry.ts) and the choice among them (select.ts). */
export type { BackendProbe, BackendStatus } from './status.js';
export { backendStatuses } from './registry.js';
export * from './select.js';
export { cudaStatus, parseDevice, requireCudaDevice, type CudaStatus } from './cuda.js';
export { ucxStatus } from './ucx.js';
export type { UcxPluginStatus } from '../comm/ucx-native.js';
