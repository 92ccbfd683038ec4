import { nativeAddon, nativeUnavailableReason } from '../native.js';
import type { BackendStatus } from './status.js';

/** The CPU kernels live in the addon itself: available whenever the addon loads. @category Backends */
export function probeCpu(): BackendStatus {
  const reason = nativeUnavailableReason();
  if (reason !== undefined) return { name: 'cpu', kind: 'compute', available: false, reason };
  const info = nativeAddon().info();
  return { name: 'cpu', kind: 'compute', available: true, details: { simd: info.simd, simdSupported: info.simdSupported, threads: info.threads } };
}
