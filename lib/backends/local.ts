import { nativeUnavailableReason } from '../native.js';
import type { BackendStatus } from './status.js';

/** The local communication backend (ranks as worker threads) is compiled into the addon itself. @category Backends */
export function probeLocal(): BackendStatus {
  const reason = nativeUnavailableReason();
  if (reason !== undefined) return { name: 'local', kind: 'comm', available: false, reason };
  return { name: 'local', kind: 'comm', available: true, details: { ranks: 'worker_threads of one process', algorithms: 'direct, ring' } };
}
