/**
 * Where `sapipe demo`'s workers compute: `cpu` (threads over the local backend) or one GPU per
 * worker over NCCL. NCCL cannot put two ranks on one GPU, so the number of workers and the GPUs
 * are decided together here, once, before any worker starts.
 */
import { BackendUnavailableError, chooseDevice, type CudaDevice, InvalidArgumentError } from 'sapipe';
import { backendStatuses, cudaStatus, installHint, parseDevice } from 'sapipe/backends';
import { describeValue } from 'sapipe/validate';

/** The `--device` values the demo takes. */
export const DEMO_DEVICE_SPELLINGS = 'cpu, cuda:N, cuda or auto';

/** Where the demo's workers ran: `ranks[r]` is worker r's GPU (empty on the CPU), and why there. */
export interface DemoDevice {
  readonly kind: 'cpu' | 'cuda';
  readonly ranks: readonly CudaDevice[];
  readonly reason: string;
}

/** The CPU, the default: every worker a thread over the local backend. */
export const DEMO_CPU: DemoDevice = { kind: 'cpu', ranks: [], reason: 'the default --device' };

/** A resolved `--device`: where the workers run and how many there are (the reason says when the device chose the count). */
export interface DemoPlacement {
  device: DemoDevice;
  workers: number;
}

/**
 * Resolves `--device` and `--workers` (undefined: not given): `cpu` keeps `cpuWorkers` threads;
 * `cuda:N` runs one worker on that GPU; `cuda` runs rank r on `cuda:r`, one worker per usable GPU
 * unless `--workers` says fewer; `auto` is `cuda` where chooseDevice finds a usable GPU, else the
 * CPU. Typed errors for a bad spelling (InvalidArgumentError), a GPU that cannot run models or an
 * NCCL that is missing (BackendUnavailableError), and more workers than usable GPUs
 * (InvalidArgumentError naming what to pass).
 */
export function resolveDemoDevice(spec: unknown, workers: number | undefined, cpuWorkers: number): DemoPlacement {
  if (typeof spec !== 'string') throw new InvalidArgumentError(`--device must be one of ${DEMO_DEVICE_SPELLINGS}, got ${describeValue(spec)}`);
  let parsed: ReturnType<typeof parseDevice> | undefined;
  if (spec !== 'auto') {
    try {
      parsed = parseDevice(spec);
    } catch (error) {
      throw new InvalidArgumentError(`--device must be one of ${DEMO_DEVICE_SPELLINGS}, got ${describeValue(spec)}`, { cause: error });
    }
  }
  if (parsed?.kind === 'cpu') return { device: { kind: 'cpu', ranks: [], reason: 'asked for' }, workers: workers ?? cpuWorkers };
  if (parsed === undefined) {
    const auto = chooseDevice('auto');
    if (auto.device === 'cpu') return { device: { kind: 'cpu', ranks: [], reason: `--device auto: ${auto.reason}` }, workers: workers ?? cpuWorkers };
    // A GPU the workers cannot reduce over is not usable for the demo: auto never throws for it.
    const nccl = ncclObstacle();
    if (nccl !== undefined) return { device: { kind: 'cpu', ranks: [], reason: `--device auto: ${auto.device} is usable but NCCL is not (${nccl})` }, workers: workers ?? cpuWorkers };
    return onEveryGpu(workers, `--device auto: ${auto.reason}`, 'auto');
  }
  if (spec === 'cuda') return onEveryGpu(workers, 'asked for', 'cuda');
  // cuda:N: one GPU, so one worker.
  const one = gpuOrWhy(parsed.index, spec);
  if (workers !== undefined && workers !== 1)
    throw new InvalidArgumentError(
      `--device ${spec} puts the demo's one worker on that GPU, and NCCL cannot put two ranks on one GPU: pass --workers 1, or --device cuda for rank r on cuda:r (one GPU per worker), or --device cpu for ${workers} workers on the CPU`,
    );
  requireNccl(spec);
  return { device: { kind: 'cuda', ranks: [one], reason: `asked for${workers === undefined ? '; --workers not given: one worker, on that GPU' : ''}` }, workers: 1 };
}

/** `cuda` (or `auto` resolved to a GPU): rank r on cuda:r, over the GPUs that can run models. */
function onEveryGpu(workers: number | undefined, reason: string, spec: string): DemoPlacement {
  const usable = usableGpus();
  if (usable.length === 0) gpuOrWhy(0, spec); // throws BackendUnavailableError saying why
  const n = workers ?? usable.length;
  if (n > usable.length)
    throw new InvalidArgumentError(
      `--workers ${n} needs ${n} GPUs (NCCL puts each worker on a GPU of its own), and ${usable.length} ${usable.length === 1 ? 'is' : 'are'} usable here (${usable.join(', ')}): ` +
        `pass --workers ${usable.length}${usable.length === 1 ? '' : ' or fewer'}, or --device cpu for ${n} workers on the CPU`,
    );
  requireNccl(spec);
  return { device: { kind: 'cuda', ranks: usable.slice(0, n), reason: `${reason}${workers === undefined ? `; --workers not given: one worker per usable GPU (${n})` : ''}` }, workers: n };
}

/** cuda:index where it can run models; else chooseDevice's BackendUnavailableError, with the --device to pass instead. */
function gpuOrWhy(index: number, spec: string): CudaDevice {
  try {
    return chooseDevice(`cuda:${index}`).device as CudaDevice;
  } catch (error) {
    if (!(error instanceof BackendUnavailableError)) throw error;
    const usable = usableGpus();
    const instead = usable.length === 0 ? '--device cpu' : `--device ${usable.length === 1 ? usable[0] : `cuda:0 to cuda:${usable.length - 1}`}, or --device cpu`;
    throw new BackendUnavailableError(`--device ${spec}: ${error.message}; pass ${instead}`, { cause: error });
  }
}

/** cuda:0, cuda:1, ... up to the first GPU that cannot run models (chooseDevice's check). */
function usableGpus(): CudaDevice[] {
  const count = cudaStatus().devices?.length ?? 0;
  const usable: CudaDevice[] = [];
  for (let i = 0; i < count; i++) {
    try {
      usable.push(chooseDevice(`cuda:${i}`).device as CudaDevice);
    } catch {
      break;
    }
  }
  return usable;
}

/** Why NCCL cannot run here, or undefined where it can. */
function ncclObstacle(): string | undefined {
  const nccl = backendStatuses().find((b) => b.name === 'nccl');
  return nccl?.available ? undefined : (nccl?.reason ?? 'unknown reason');
}

function requireNccl(spec: string): void {
  const obstacle = ncclObstacle();
  if (obstacle === undefined) return;
  throw new BackendUnavailableError(`--device ${spec}: the demo's workers on GPUs average their gradients over NCCL, which is unavailable: ${obstacle}; ${installHint('nccl')}`);
}
