/**
 * One entry to join the job's communication group, in the spirit of torch.distributed's
 * init_process_group: it reads where this rank runs (a thread started by spawnLocalRanks or
 * runLocalRanks, or a process started by `sapipe launch`, torchrun, mpirun or Slurm) and creates
 * the communicator of the backend asked for, or of the best one that works there.
 */
import { isMainThread, workerData } from 'node:worker_threads';

import { selectCommBackend, type CommBackendPreference } from '../backends/select.js';
import { BackendUnavailableError, InvalidArgumentError } from '../errors.js';
import { checkObject, checkOneOf } from '../validate.js';
import { LocalCommunicator, type LocalCommunicatorOptions, type LocalRankData } from './local.js';
import { NcclCommunicator, type NcclCommunicatorOptions } from './nccl.js';
import { fromEnv } from './rendezvous/env.js';
import { UcxCommunicator, type UcxCommunicatorOptions } from './ucx.js';

/** Options passed on to the backend's create(); the rank and world come from where this rank runs. @category Communication */
export type CreateCommunicatorOptions = Omit<LocalCommunicatorOptions, 'group' | 'rank' | 'size'> &
  Omit<UcxCommunicatorOptions, 'rank' | 'size'> &
  Partial<Omit<NcclCommunicatorOptions, 'rank' | 'size'>>;

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
 * of the job must call it.
 *
 * @category Communication
 */
export async function createCommunicator(backend: 'nccl', options?: CreateCommunicatorOptions): Promise<NcclCommunicator>;
export async function createCommunicator(backend?: Exclude<CommBackendPreference, 'nccl'>, options?: CreateCommunicatorOptions): Promise<LocalCommunicator | UcxCommunicator>;
export async function createCommunicator(
  backend: CommBackendPreference = 'auto',
  options: CreateCommunicatorOptions = {},
): Promise<LocalCommunicator | UcxCommunicator | NcclCommunicator> {
  checkOneOf(backend, 'createCommunicator(backend)', ['auto', 'local', 'ucx', 'nccl'] as const);
  checkObject(options as unknown, 'createCommunicator(backend, options)');
  const local = localRank();
  const launched = launchedByEnvironment(process.env);
  if (backend === 'local' || (backend === 'auto' && local)) {
    if (!local)
      throw new InvalidArgumentError(
        `createCommunicator('local'): this is not a rank thread; the local backend runs ranks as threads: ${HOW_TO_START}`,
      );
    return LocalCommunicator.create({ ...(options as Omit<LocalCommunicatorOptions, 'group' | 'rank' | 'size'>), ...local });
  }
  if (!launched)
    throw new InvalidArgumentError(`createCommunicator('${backend}'): no launcher's environment (RANK, WORLD_SIZE) here: ${HOW_TO_START}`);
  if (backend === 'nccl') {
    const env = fromEnv(process.env);
    const { device, ...rest } = options as Partial<NcclCommunicatorOptions>;
    return NcclCommunicator.create({ ...rest, rank: env.rank, size: env.worldSize, device: device ?? `cuda:${env.localRank}`, env: rest.env ?? true });
  }
  if (backend === 'auto') {
    // In a launched process the choice is ucx or nothing: local ranks share one process.
    const status = selectCommBackend('auto');
    if (status.name !== 'ucx')
      throw new BackendUnavailableError(
        `createCommunicator('auto'): this rank is a process of a launched job, which needs the ucx backend: ${status.why}. ` +
          'Install UCX (apt-get install libucx-dev) and build the plugin (npm run build:native), or run the ranks as threads (runLocalRanks)',
      );
  }
  return UcxCommunicator.create(options as UcxCommunicatorOptions);
}
