import { ucxAddon, type UcxPluginStatus } from '../comm/ucx-native.js';
import { nativeUnavailableReason } from '../native.js';
import type { BackendStatus } from './status.js';

/** The UCX plugin's state; never throws. @category Backends */
export function ucxStatus(): UcxPluginStatus {
  const reason = nativeUnavailableReason();
  if (reason !== undefined) return { available: false, reason };
  try {
    const status = ucxAddon().ucxStatus();
    // A checkout whose install found no UCX development files has no plugin: say how to get one.
    if (!status.available && /plugin was not found/.test(status.reason ?? ''))
      return { ...status, reason: `${status.reason}; build it with \`npm run build:native\` once UCX's development files are installed (\`apt-get install libucx-dev\`)` };
    return status;
  } catch (error) {
    return { available: false, reason: `probing UCX failed: ${(error as Error).message}` };
  }
}

/**
 * The ucx communication backend: the plugin sapipe_ucx.so beside the addon (or SAPIPE_UCX_PLUGIN)
 * and the UCX library it links (libucp.so.0). Unavailable with the reason and the fix when either
 * is missing.
 *
 * @category Backends
 */
export function probeUcx(): BackendStatus {
  const s = ucxStatus();
  const details: Record<string, string> = {};
  if (s.pluginPath) details.plugin = s.pluginPath;
  if (s.library) details.library = s.library;
  if (s.available) return { name: 'ucx', kind: 'comm', available: true, details: { ...details, ranks: 'processes (sapipe launch, torchrun, mpirun, Slurm)', algorithms: 'direct (comm.allocate buffers, ranks of one machine), ring' } };
  let reason = s.reason ?? 'unknown';
  if (/libuc[pts]\.so/.test(reason)) reason += ' (the UCX library is not installed: `apt-get install libucx0`, or UCX from your distribution)';
  return { name: 'ucx', kind: 'comm', available: false, reason, ...(Object.keys(details).length ? { details } : {}) };
}
