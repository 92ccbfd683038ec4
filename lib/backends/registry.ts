/**
 * The backend list: one probe per backend, and the statuses they report. The compute backends'
 * probes are listed here (the CPU, the addon itself; CUDA and cuBLAS, lib/device); every
 * communication backend's comes from its entry in the communication registry (lib/comm/registry.ts).
 */
import { commBackendEntries } from '../comm/registry.js';
import { probeCublas, probeCuda } from '../device/index.js';
import { probeCpu } from './cpu.js';
import type { BackendProbe, BackendStatus } from './status.js';

/**
 * Every probe, in the order `sapipe info` lists them: the compute backends, then the communication
 * backends on devices (their reasons often repeat cuda's, which the listing then points at above),
 * then those on host memory.
 */
function probes(): BackendProbe[] {
  const comm = commBackendEntries().map(({ entry }) => entry);
  return [probeCpu, probeCuda, probeCublas, ...comm.filter((e) => e.memory === 'device').map((e) => e.probe), ...comm.filter((e) => e.memory === 'host').map((e) => e.probe)];
}

/** Probes every backend; never throws. @category Backends */
export function backendStatuses(): BackendStatus[] {
  return probes().map((probe) => {
    try {
      return probe();
    } catch (error) {
      return { name: probe.name, kind: 'compute', available: false, reason: `probe failed: ${(error as Error).message}` };
    }
  });
}
