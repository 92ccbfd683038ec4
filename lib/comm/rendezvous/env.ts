/**
 * Reads a rank's place in the job from the environment its launcher set: `sapipe launch` and
 * torchrun (RANK, WORLD_SIZE, LOCAL_RANK, ...), mpirun (OMPI_COMM_WORLD_*) or Slurm (SLURM_*).
 */
import { InvalidArgumentError } from '../../errors.js';
import type { RendezvousOptions } from './rendezvous.js';
import { checkRank } from './validate.js';
import { checkObject } from '../../validate.js';

/** Port used when MASTER_PORT is unset (mpirun and Slurm do not set it); torchrun's default. @category Communication */
export const DEFAULT_MASTER_PORT = 29500;

/** {@link RendezvousOptions} plus the rank's place on its node. @category Communication */
export interface RendezvousEnv extends RendezvousOptions {
  /** Index of this rank among the ranks of its node. */
  localRank: number;
  /** Ranks on this node, where the launcher says (undefined otherwise). */
  localWorldSize: number | undefined;
  /** Which launcher's variables were read. */
  source: 'torchrun' | 'mpirun' | 'slurm';
}

const sources = [
  { source: 'torchrun', rank: 'RANK', size: 'WORLD_SIZE', localRank: 'LOCAL_RANK', localSize: 'LOCAL_WORLD_SIZE' },
  {
    source: 'mpirun',
    rank: 'OMPI_COMM_WORLD_RANK',
    size: 'OMPI_COMM_WORLD_SIZE',
    localRank: 'OMPI_COMM_WORLD_LOCAL_RANK',
    localSize: 'OMPI_COMM_WORLD_LOCAL_SIZE',
  },
  { source: 'slurm', rank: 'SLURM_PROCID', size: 'SLURM_NTASKS', localRank: 'SLURM_LOCALID', localSize: undefined },
] as const;

function readInt(env: NodeJS.ProcessEnv, name: string, min: number): number | undefined {
  const text = env[name];
  if (text === undefined || text === '') return undefined;
  if (!/^\s*\d+\s*$/.test(text)) throw new InvalidArgumentError(`${name} must be a non-negative integer, got '${text}'`);
  const value = Number(text);
  if (!Number.isSafeInteger(value) || value < min) throw new InvalidArgumentError(`${name} must be at least ${min}, got '${text}'`);
  return value;
}

/**
 * Builds {@link createRendezvous} options from `env` (default `process.env`). The first of
 * torchrun's, mpirun's and Slurm's variables found wins; MASTER_ADDR (default 127.0.0.1),
 * MASTER_PORT (default 29500), SAPIPE_TOKEN, SAPIPE_BIND_ADDR, SAPIPE_ALLOW_NO_TOKEN and
 * SAPIPE_RENDEZVOUS_TIMEOUT_MS apply to all. Throws InvalidArgumentError naming the variable that is missing or malformed.
 *
 * @category Communication
 */
export function fromEnv(env: NodeJS.ProcessEnv = process.env): RendezvousEnv {
  checkObject(env, 'fromEnv(env): env');
  const found = sources.find((s) => env[s.rank] !== undefined && env[s.rank] !== '');
  if (found === undefined)
    throw new InvalidArgumentError(
      'no rank in the environment: set RANK and WORLD_SIZE (sapipe launch, torchrun), or run under mpirun or Slurm',
    );
  const rank = readInt(env, found.rank, 0)!;
  const worldSize = readInt(env, found.size, 1);
  if (worldSize === undefined) throw new InvalidArgumentError(`${found.rank} is set but ${found.size} is not`);
  checkRank(rank, worldSize);
  const localRank = readInt(env, found.localRank, 0) ?? 0;
  const localWorldSize = found.localSize === undefined ? undefined : readInt(env, found.localSize, 1);
  const port = readInt(env, 'MASTER_PORT', 0) ?? DEFAULT_MASTER_PORT;
  if (port > 65535) throw new InvalidArgumentError(`MASTER_PORT must be at most 65535, got ${port}`);
  const options: RendezvousEnv = {
    rank,
    worldSize,
    localRank,
    localWorldSize,
    source: found.source,
    addr: env.MASTER_ADDR || '127.0.0.1',
    port,
  };
  if (env.SAPIPE_TOKEN) options.token = env.SAPIPE_TOKEN;
  if (env.SAPIPE_BIND_ADDR) options.bindAddr = env.SAPIPE_BIND_ADDR;
  const allow = env.SAPIPE_ALLOW_NO_TOKEN;
  if (allow !== undefined && allow !== '') {
    if (!/^(1|0|true|false)$/i.test(allow.trim())) throw new InvalidArgumentError(`SAPIPE_ALLOW_NO_TOKEN must be 1 or 0, got '${allow}'`);
    options.allowNoToken = /^(1|true)$/i.test(allow.trim());
  }
  const timeoutMs = readInt(env, 'SAPIPE_RENDEZVOUS_TIMEOUT_MS', 1);
  if (timeoutMs !== undefined) options.timeoutMs = timeoutMs;
  return options;
}
