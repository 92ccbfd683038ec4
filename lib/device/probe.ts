/**
 * What the CUDA plugin and the libraries it opens report, as backend statuses: the `cuda` compute
 * backend, cuBLAS (the model operations' products) and NCCL (the `nccl` communication backend's
 * library, whose registry entry in lib/comm/registry.ts takes this probe). Probes never throw;
 * `requireCudaDevice` turns an unavailable device into BackendUnavailableError with the reason (no
 * plugin built / no driver libcuda.so.1 / no device).
 */
import type { BackendStatus } from '../backends/status.js';
import { BackendUnavailableError, InvalidArgumentError } from '../errors.js';
import { nativeUnavailableReason } from '../native.js';
import { cudaAddon, type CudaStatus, type NcclStatus } from './cuda-native.js';
import { describeValue } from '../validate.js';
import { parseDevice } from './device-spec.js';

/** The CUDA plugin's state; never throws. @category Backends */
export function cudaStatus(): CudaStatus {
  const reason = nativeUnavailableReason();
  if (reason !== undefined) return { available: false, reason };
  try {
    return cudaAddon().cudaStatus();
  } catch (error) {
    return { available: false, reason: `probing CUDA failed: ${(error as Error).message}` };
  }
}

/** @category Backends */
export function probeCuda(): BackendStatus {
  const s = cudaStatus();
  const details: Record<string, string | number | boolean> = {};
  if (s.pluginPath) details.plugin = s.pluginPath;
  if (s.pluginChoice) details.pluginChoice = s.pluginChoice;
  if (s.architectures) details.architectures = s.architectures;
  if (s.runtimeVersion) details.runtime = s.runtimeVersion;
  s.devices?.forEach((d, i) => {
    details[`cuda:${i}`] = d.error ?? `${d.name ?? '?'} (sm ${d.computeCapability ?? '?'}${d.kernelsAvailable ? '' : ', no code for it'})`;
  });
  return {
    name: 'cuda',
    kind: 'compute',
    available: s.available,
    ...(s.available ? {} : { reason: s.reason ?? 'unknown' }),
    ...(Object.keys(details).length ? { details } : {}),
  };
}

/**
 * The status of a library the CUDA plugin opens at run time (`status` asks the addon), as backend
 * `name`: available only where a CUDA device is usable too, since the library serves device buffers.
 */
function probeDeviceLibrary(name: string, kind: BackendStatus['kind'], library: string, status: () => NcclStatus): BackendStatus {
  const reason = nativeUnavailableReason();
  let s: NcclStatus;
  if (reason !== undefined) s = { available: false, reason };
  else {
    try {
      s = status();
    } catch (error) {
      s = { available: false, reason: `probing ${library} failed: ${(error as Error).message}` };
    }
  }
  if (!s.available) return { name, kind, available: false, reason: s.reason ?? 'unknown' };
  const details = { version: s.version ?? 0, library: s.path ?? '' };
  const cuda = cudaStatus();
  if (!cuda.available)
    return { name, kind, available: false, reason: `${library} ${details.version} loaded (${details.library}), but it needs a CUDA device: ${cuda.reason ?? 'unknown'}`, details };
  return { name, kind, available: true, details };
}

/** NCCL: the nccl backend moves device buffers, so NCCL alone, without a usable GPU, is not enough. @category Backends */
export function probeNccl(): BackendStatus {
  return probeDeviceLibrary('nccl', 'comm', 'NCCL', () => cudaAddon().ncclStatus());
}

/**
 * cuBLAS, which the CUDA plugin's model operations open at run time for their matrix products:
 * where it is missing the models cannot run on a GPU (the fused updates and NCCL still can).
 * @category Backends
 */
export function probeCublas(): BackendStatus {
  return probeDeviceLibrary('cublas', 'compute', 'cuBLAS', () => cudaAddon().cublasStatus());
}

/** Checks that cuda:index can run the kernels; throws BackendUnavailableError saying why not. @category Backends */
export function requireCudaDevice(index: number): void {
  if (!Number.isInteger(index) || index < 0) throw new InvalidArgumentError(`CUDA device index must be a non-negative integer, got ${describeValue(index)}`);
  const s = cudaStatus();
  if (!s.available) throw new BackendUnavailableError(`cuda:${index} is unavailable: ${s.reason ?? 'unknown reason'}`);
  const device = s.devices?.[index];
  if (!device) throw new BackendUnavailableError(`cuda:${index} does not exist: ${s.devices?.length ?? 0} CUDA device(s) visible`);
  if (!device.kernelsAvailable)
    throw new BackendUnavailableError(`cuda:${index} (${device.name ?? '?'}, sm ${device.computeCapability ?? '?'}) cannot run this build's kernels (built for ${s.architectures ?? '?'})`);
}

/** What {@link chooseDevice} picked, and why. @category Backends */
export interface DeviceChoice {
  readonly device: 'cpu' | `cuda:${number}`;
  readonly reason: string;
}

/**
 * Resolves a device option: `cpu` and `cuda:N` as given (`cuda:N` checked usable, else
 * BackendUnavailableError with why), and `auto` to `cuda:0` where the CUDA plugin loads, a device
 * is visible whose kernels this build carries and cuBLAS opens (the model operations' products),
 * else to `cpu`; the reason says which. Never throws for `auto`.
 *
 * @category Backends
 */
export function chooseDevice(spec: unknown = 'auto'): DeviceChoice {
  if (spec !== 'auto') {
    if (typeof spec !== 'string') throw new InvalidArgumentError(`device must be "cpu", "cuda:N" or "auto", got ${describeValue(spec)}`);
    const parsed = parseDevice(spec);
    if (parsed.kind === 'cpu') return { device: 'cpu', reason: 'asked for' };
    requireCudaDevice(parsed.index);
    const cublas = probeCublas();
    if (!cublas.available) throw new BackendUnavailableError(`cuda:${parsed.index} cannot run models: ${cublas.reason ?? 'cuBLAS is unavailable'}`);
    return { device: `cuda:${parsed.index}`, reason: 'asked for' };
  }
  const s = cudaStatus();
  if (!s.available) return { device: 'cpu', reason: `no usable CUDA: ${s.reason ?? 'unknown reason'}` };
  const device = s.devices?.[0];
  if (!device) return { device: 'cpu', reason: 'no CUDA device is visible' };
  if (!device.kernelsAvailable) return { device: 'cpu', reason: `cuda:0 (${device.name ?? '?'}, sm ${device.computeCapability ?? '?'}) cannot run this build's kernels (built for ${s.architectures ?? '?'})` };
  const cublas = probeCublas();
  if (!cublas.available) return { device: 'cpu', reason: `cuda:0 is usable but cuBLAS is not: ${cublas.reason ?? 'unknown reason'}` };
  return { device: 'cuda:0', reason: `cuda:0 (${device.name ?? '?'}) is usable` };
}
