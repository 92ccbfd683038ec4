/**
 * One entry to join the job's communication group, in the spirit of torch.distributed's
 * init_process_group: it reads where this rank runs (a thread started by spawnLocalRanks or
 * runLocalRanks, or a process started by `sapipe launch`, torchrun, mpirun or Slurm) and creates
 * the communicator of the backend asked for, or of the best one that works there.
 */
import { isMainThread, workerData } from 'node:worker_threads';

import { installHint, selectCommBackend, type CommBackendPreference } from '../backends/select.js';
import { BackendUnavailableError, InvalidArgumentError } from '../errors.js';
import { checkObject, checkOneOf } from '../validate.js';
import { COMM_BACKENDS, type CommBackendName } from './backend-names.js';
import type { LocalRankData } from './local.js';
import { autoCommBackends, commBackendEntry, type CommunicatorOf, type CreateCommunicatorOptions, type HostCommunicatorOf } from './registry.js';

export type { CreateCommunicatorOptions };

/**
 * What {@link createCommunicator} resolves with for `backend`: that backend's communicator
 * ({@link LocalCommunicator}, {@link UcxCommunicator}, {@link NcclCommunicator}), and for `auto`
 * one of the host-memory backends it chooses among (`LocalCommunicator | UcxCommunicator`). Derived
 * from the backend registry, so a new backend needs no overload here.
 *
 * @category Communication
 */
export type CreatedCommunicator<P extends CommBackendPreference> = P extends 'auto' ? HostCommunicatorOf<CommBackendName> : P extends CommBackendName ? CommunicatorOf<P> : never;

const HOW_TO_START =
  'start the ranks with `npx sapipe launch --nproc N script.js` (processes: ucx, or nccl on GPUs) or with ' +
  'runLocalRanks(url, N) / spawnLocalRanks(url, N) (threads of this process: local)';

/** The local group this thread was started in, if spawnLocalRanks started it. */
function localRank(): LocalRankData['sapipeLocal'] | undefined {
  if (isMainThread) return undefined;
  const data = (workerData as Partial<LocalRankData> | null)?.sapipeLocal;
  return data && typeof data === 'object' ? data : undefined;
}

function launchedByEnvironment(env: NodeJS.ProcessEnv): boolean {
  return ['RANK', 'OMPI_COMM_WORLD_RANK', 'SLURM_PROCID'].some((name) => env[name] !== undefined && env[name] !== '');
}

/**
 * Creates this rank's communicator. `backend`:
 * - `auto` (default): inside a thread started by spawnLocalRanks/runLocalRanks, `local`; in a
 *   process started by a launcher, `ucx` (its plugin and UCX must be installed: the error says
 *   how). `nccl` is chosen only by name: it communicates GPU buffers (DeviceParamSet), not host ones.
 * - `local`, `ucx`, `nccl`: that backend, or a typed error saying why it cannot run here.
 *
 * Outside any launcher it throws InvalidArgumentError saying how to start the ranks. Every rank
 * of the job must call it. (How each backend is created is its entry in lib/comm/registry.ts.)
 *
 * @category Communication
 */
export async function createCommunicator<P extends CommBackendPreference = 'auto'>(backend?: P, options?: CreateCommunicatorOptions): Promise<CreatedCommunicator<P>>;
export async function createCommunicator(backend: CommBackendPreference = 'auto', options: CreateCommunicatorOptions = {}): Promise<unknown> {
  checkOneOf(backend, 'createCommunicator(backend)', ['auto', ...COMM_BACKENDS] as const);
  checkObject(options as unknown, 'createCommunicator(backend, options)');
  const local = localRank();
  const launched = launchedByEnvironment(process.env);
  // A rank thread's `auto` is the first backend of auto's order that runs ranks as threads.
  const inThreads = autoCommBackends().find((name) => !commBackendEntry(name, 'createCommunicator').capabilities.multiProcess);
  const threadBackend = backend === 'auto' && local ? (inThreads ?? backend) : backend;
  const threads = threadBackend === 'auto' ? undefined : commBackendEntry(threadBackend, 'createCommunicator');
  if (threads?.inProcess) {
    if (!local)
      throw new InvalidArgumentError(
        `createCommunicator('${threadBackend}'): this is not a rank thread; the ${threadBackend} backend runs ranks as threads: ${HOW_TO_START}`,
      );
    return threads.inProcess(local, options);
  }
  if (!launched)
    throw new InvalidArgumentError(`createCommunicator('${backend}'): no launcher's environment (RANK, WORLD_SIZE) here: ${HOW_TO_START}`);
  let name = backend;
  if (name === 'auto') {
    // In a launched process the choice is among the backends whose ranks are processes: the others
    // run ranks as threads of one process.
    const status = selectCommBackend('auto');
    const wanted = autoCommBackends().find((n) => commBackendEntry(n, 'createCommunicator').launched) ?? status.name;
    if (!commBackendEntry(status.name, 'createCommunicator').launched)
      throw new BackendUnavailableError(
        `createCommunicator('auto'): this rank is a process of a launched job, which needs the ${wanted} backend: ${status.why}. ` +
          `To use it: ${installHint(wanted)}; or run the ranks as threads (runLocalRanks)`,
      );
    name = status.name;
  }
  const entry = commBackendEntry(name, 'createCommunicator');
  if (!entry.launched) throw new InvalidArgumentError(`createCommunicator('${name}'): the ${name} backend cannot join a launched job's processes`);
  return entry.launched(options);
}
