/**
 * The two communicators a rank of a multi-host job needs for hierarchical collectives: the ranks of
 * its host, and the ranks holding the same local rank on every host.
 */
import { InvalidArgumentError } from '../errors.js';
import { checkInteger, checkOptions, describeValue, optionKeys } from '../validate.js';
import type { Communicator } from './communicator.js';
import { DEFAULT_COMM_TIMEOUT_MS } from './communicator.js';
import { fromEnv } from './rendezvous/env.js';
import { createRendezvous } from './rendezvous/rendezvous.js';
import { processGroupBackend } from './registry.js';

/** The two communicators of a rank in a multi-host job. @category Communication */
export interface HostGroups {
  /** The ranks of this rank's host (its rank there: the local rank). */
  local: Communicator;
  /** The ranks that hold the same local rank on every host (its rank there: the host's index). */
  cross: Communicator;
}

/** Options of {@link createHostGroups}. @category Communication */
export interface CreateHostGroupsOptions {
  /** Every wait's limit. Default DEFAULT_COMM_TIMEOUT_MS. */
  timeoutMs?: number;
}
const HOST_GROUP_OPTION_KEYS = optionKeys<CreateHostGroupsOptions>({ timeoutMs: true });

/**
 * In a job of `sapipe launch --nnodes H --nproc L` (ranks numbered host by host), joins this
 * rank's host group and cross-host group, and the whole job as `world`, as communicators of the
 * backend that joins groups of processes (ucx) on groups of one rendezvous with the launcher's
 * store (a job uses this instead of `createCommunicator`, whose own store would take the same
 * port); every rank calls it.
 * `destroy()` ends all three and leaves the store; it resolves once their threads have ended.
 *
 * @category Communication
 */
export async function createHostGroups(options: CreateHostGroupsOptions = {}): Promise<HostGroups & { world: Communicator; destroy(): Promise<void> }> {
  checkOptions(options, HOST_GROUP_OPTION_KEYS, 'createHostGroups(options)');
  const timeoutMs = checkInteger(options.timeoutMs ?? DEFAULT_COMM_TIMEOUT_MS, 'createHostGroups: timeoutMs', 1, 2 ** 31 - 1);
  const env = fromEnv();
  const perHost = env.localWorldSize;
  if (perHost === undefined || env.worldSize % perHost !== 0)
    throw new InvalidArgumentError(
      `createHostGroups: the job must run the same number of ranks on every host, with LOCAL_WORLD_SIZE set (as sapipe launch does); got WORLD_SIZE ${env.worldSize}, LOCAL_WORLD_SIZE ${describeValue(perHost)}`,
    );
  const hosts = env.worldSize / perHost;
  const host = Math.floor(env.rank / perHost);
  const backend = processGroupBackend();
  const store = await createRendezvous({ ...env, timeoutMs });
  let world: Communicator | undefined;
  let local: Communicator | undefined;
  let cross: Communicator | undefined;
  const destroy = async (): Promise<void> => {
    const threads = [world?.destroy(), local?.destroy(), cross?.destroy()];
    // Rank 0 serves the store and waits (bounded) for the others to disconnect first.
    void store.close().catch(() => {});
    await Promise.all(threads);
  };
  try {
    world = await backend.joinStore(store.group('world', env.rank, env.worldSize), { timeoutMs });
    local = await backend.joinStore(store.group(`host-${host}`, env.localRank, perHost), { timeoutMs });
    cross = await backend.joinStore(store.group(`local-rank-${env.localRank}`, host, hosts), { timeoutMs });
  } catch (error) {
    await destroy();
    throw error;
  }
  return { world, local, cross, destroy };
}
