/**
 * Choosing a backend at run time from the probes' statuses. `auto` takes the fastest backend this
 * machine can run (CUDA over CPU, UCX over in-process); a backend asked for by name that is not
 * usable here is an error that says why and what to install, never a silent fallback.
 */
import { COMM_BACKENDS, type CommBackendName } from '../comm/backend-names.js';
import { autoCommBackends, COMM_BACKEND_ENTRIES } from '../comm/registry.js';
import { BackendUnavailableError, InvalidArgumentError } from '../errors.js';
import { backendStatuses } from './registry.js';
import type { BackendStatus } from './status.js';
import { describeValue } from '../validate.js';

export { COMM_BACKENDS, type CommBackendName };

/** @category Backends */
export const COMPUTE_BACKENDS = ['cpu', 'cuda'] as const;

/** @category Backends */
export type ComputeBackendName = (typeof COMPUTE_BACKENDS)[number];
/** @category Backends */
export type ComputeBackendPreference = 'auto' | ComputeBackendName;
/** @category Backends */
export type CommBackendPreference = 'auto' | CommBackendName;

/** The outcome of a selection: the backend, its status, and in words why it was chosen. @category Backends */
export interface BackendSelection<Name extends string> {
  name: Name;
  status: BackendStatus;
  /** For `auto`: which preferred backends were passed over and why. */
  why: string;
}

/**
 * What a user installs to make each compute backend available; appended to every unavailability
 * error. A communication backend's is in its registry entry.
 */
const COMPUTE_INSTALL_HINTS: Record<ComputeBackendName, string> = {
  cpu:
    'reinstall sapipe (`npm install sapipe`); where no prebuilt binary matches, the install builds from source and needs python3, make and a C++17 compiler (g++ >= 9)',
  cuda:
    'it needs an NVIDIA GPU, its driver (libcuda.so.1, a driver recent enough for the CUDA toolkit the plugin was built with) and the CUDA plugin, built by `npm run build:native` where a CUDA toolkit is installed',
};

const isCommBackend = (name: string): name is CommBackendName => Object.hasOwn(COMM_BACKEND_ENTRIES, name);

/** How to make `name` available, in one sentence. @category Backends */
export function installHint(name: ComputeBackendName | CommBackendName): string {
  return isCommBackend(name) ? COMM_BACKEND_ENTRIES[name].installHint : COMPUTE_INSTALL_HINTS[name];
}

/**
 * The status of `name` among `statuses`. A communication backend compiled into the addon itself
 * (the in-process `local` transport) is, where no probe of its own reports on it, exactly as
 * available as the CPU addon.
 */
function statusOf(name: ComputeBackendName | CommBackendName, statuses: readonly BackendStatus[]): BackendStatus {
  const found = statuses.find((status) => status.name === name);
  if (found) return found;
  if (isCommBackend(name) && COMM_BACKEND_ENTRIES[name].builtIn) {
    const cpu = statuses.find((status) => status.name === 'cpu');
    if (cpu) return { name, kind: 'comm', available: cpu.available, ...(cpu.reason === undefined ? {} : { reason: cpu.reason }) };
  }
  const kind = (COMPUTE_BACKENDS as readonly string[]).includes(name) ? 'compute' : 'comm';
  return { name, kind, available: false, reason: `no probe for the ${name} backend is registered in this build` };
}

function unavailable(name: ComputeBackendName | CommBackendName, status: BackendStatus): BackendUnavailableError {
  return new BackendUnavailableError(`the ${name} backend is unavailable: ${status.reason ?? 'no reason was given'}. To use it: ${installHint(name)}.`);
}

function checkStatuses(statuses: unknown): readonly BackendStatus[] {
  if (!Array.isArray(statuses) || !statuses.every((s) => typeof s === 'object' && s !== null && typeof (s as BackendStatus).name === 'string' && typeof (s as BackendStatus).available === 'boolean'))
    throw new InvalidArgumentError('statuses must be an array of backend statuses ({ name, kind, available, reason? }), as backendStatuses() returns');
  return statuses as readonly BackendStatus[];
}

function select<Name extends ComputeBackendName | CommBackendName>(
  what: string,
  names: readonly Name[],
  preferenceOrder: readonly Name[],
  preference: unknown,
  statuses: unknown,
): BackendSelection<Name> {
  if (typeof preference !== 'string' || (preference !== 'auto' && !(names as readonly string[]).includes(preference)))
    throw new InvalidArgumentError(`${what} backend must be one of 'auto', ${names.map((n) => `'${n}'`).join(', ')}; got ${describeValue(preference)}`);
  const known = checkStatuses(statuses);
  if (preference !== 'auto') {
    const name = preference as Name;
    const status = statusOf(name, known);
    if (!status.available) throw unavailable(name, status);
    return { name, status, why: `${name} was asked for` };
  }
  const passedOver: string[] = [];
  for (const name of preferenceOrder) {
    const status = statusOf(name, known);
    if (status.available) {
      const why = passedOver.length === 0 ? `auto: ${name} is available` : `auto: ${name}, since ${passedOver.join('; ')}`;
      return { name, status, why };
    }
    passedOver.push(`${name} is unavailable (${status.reason ?? 'no reason was given'})`);
  }
  const last = preferenceOrder[preferenceOrder.length - 1]!;
  throw new BackendUnavailableError(`no ${what} backend is available: ${passedOver.join('; ')}. To use ${last}: ${installHint(last)}.`);
}

/**
 * The compute backend to run kernels on. `auto` picks CUDA when its plugin, a driver and a device
 * are present, else the CPU. Throws InvalidArgumentError for an unknown preference and
 * BackendUnavailableError (code ERR_BACKEND_UNAVAILABLE) when the named backend, or for `auto`
 * every backend, is unavailable.
 *
 * @category Backends
 */
export function selectBackend(
  preference: ComputeBackendPreference = 'auto',
  statuses: readonly BackendStatus[] = backendStatuses(),
): BackendSelection<ComputeBackendName> {
  return select('compute', COMPUTE_BACKENDS, ['cuda', 'cpu'], preference, statuses);
}

/**
 * The communication backend for collectives. `auto` picks UCX when its plugin and library load,
 * else the in-process `local` transport; `nccl` (collectives on GPU memory, see NcclCommunicator)
 * is chosen only by name. Errors as {@link selectBackend}.
 *
 * @category Backends
 */
export function selectCommBackend(
  preference: CommBackendPreference = 'auto',
  statuses: readonly BackendStatus[] = backendStatuses(),
): BackendSelection<CommBackendName> {
  return select('communication', COMM_BACKENDS, autoCommBackends(), preference, statuses);
}
