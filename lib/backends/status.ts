/**
 * What each backend needs and whether this machine has it. Every backend contributes one probe
 * (beside the backend: the CPU's in lib/backends/cpu.ts, CUDA's and cuBLAS's in lib/device, each
 * communication backend's named by its entry in lib/comm/registry.ts); `sapipe info` and backend
 * selection read them. A probe never throws: a missing plugin, library or device is reported with
 * the reason.
 *
 * @category Backends
 */
export interface BackendStatus {
  /** `cpu`, `cuda`, `local`, `ucx`, `nccl`, ... */
  name: string;
  /** `compute` backends run kernels; `comm` backends run collectives. */
  kind: 'compute' | 'comm';
  available: boolean;
  /** Why the backend is unavailable (what was looked for, what to install). */
  reason?: string;
  /** Facts worth showing (versions, devices, library paths). */
  details?: Record<string, string | number | boolean>;
}

/** @category Backends */
export type BackendProbe = () => BackendStatus;
