/**
 * The backend registry: one probe per backend, and the statuses they report. Adding a backend
 * means adding its probe here.
 */
import { probeCpu } from './cpu.js';
import { probeCublas, probeCuda, probeNccl } from '../device/index.js';
import { probeLocal } from './local.js';
import { probeUcx } from './ucx.js';
import type { BackendProbe, BackendStatus } from './status.js';


const probes: BackendProbe[] = [
  probeCpu,
  probeCuda,
  probeCublas,
  probeNccl,
  probeLocal,
  probeUcx,
];

/** Probes every backend; never throws. @category Backends */
export function backendStatuses(): BackendStatus[] {
  return probes.map((probe) => {
    try {
      return probe();
    } catch (error) {
      return { name: probe.name, kind: 'compute', available: false, reason: `probe failed: ${(error as Error).message}` };
    }
  });
}
