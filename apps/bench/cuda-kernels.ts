/**
 * `sapipe bench kernels --device cuda:N`: every fused update variant on the GPU, as effective
 * bandwidth (bytes counted as ALGORITHMS.md counts them) and as a ratio to a device-to-device copy
 * (8 B per element) timed in the same run, interleaved. Timing happens in the plugin with CUDA
 * events (native/cuda/bench_update.cu); each figure is the median of `reps` runs after warm-up.
 */
import { cudaBenchUpdate } from 'sapipe/kernels';
import { cudaStatus, parseDevice, requireCudaDevice } from 'sapipe/backends';
import { InvalidArgumentError } from 'sapipe';
import { selectVariants } from './kernels.js';

export interface CudaKernelBenchRow {
  name: string;
  bytesPerElement: number;
  medianMs: number;
  gbps: number;
  /** gbps / device-to-device copy gbps of the same run. */
  ratioToCopy: number;
  guardedMs: number;
  guardedRatioToCopy: number;
}

export interface CudaKernelBenchResult {
  device: string;
  deviceName: string;
  elements: number;
  /** Median copy bandwidth over every variant's interleaved copy runs. */
  copy: { gbps: number };
  rows: CudaKernelBenchRow[];
}

export interface CudaKernelBenchOptions {
  device: string;
  elements: number;
  reps: number;
  warmup: number;
  filter?: string;
}

export function benchCudaKernels(options: CudaKernelBenchOptions): CudaKernelBenchResult {
  const device = parseDevice(options.device);
  if (device.kind !== 'cuda') throw new InvalidArgumentError(`benchCudaKernels needs a cuda:N device, not ${options.device}`);
  requireCudaDevice(device.index);
  const variants = selectVariants(options.filter);
  const rows: CudaKernelBenchRow[] = [];
  const copies: number[] = [];
  for (const v of variants) {
    const t = cudaBenchUpdate(device.index, { ...v.config, step: 1 }, options.elements, options.reps, options.warmup);
    const bytes = t.bytesPerElement * options.elements;
    const copyGbps = (8 * options.elements) / (t.copyMs * 1e6);
    const gbps = bytes / (t.updateMs * 1e6);
    copies.push(copyGbps);
    rows.push({
      name: v.name,
      bytesPerElement: t.bytesPerElement,
      medianMs: t.updateMs,
      gbps,
      ratioToCopy: gbps / copyGbps,
      guardedMs: t.guardedMs,
      guardedRatioToCopy: bytes / (t.guardedMs * 1e6) / copyGbps,
    });
  }
  copies.sort((a, b) => a - b);
  const info = cudaStatus().devices?.[device.index];
  return {
    device: `cuda:${device.index}`,
    deviceName: info?.name ?? '',
    elements: options.elements,
    copy: { gbps: copies[Math.floor(copies.length / 2)] ?? 0 },
    rows,
  };
}
