import type { Command } from 'commander';

import { nativeAddon, nativeUnavailableReason } from '../../native.js';
import { packageVersion } from '../../version.js';

export interface BackendStatus {
  name: string;
  available: boolean;
  reason?: string;
}

export interface SapipeInfo {
  version: string;
  node: string;
  platform: string;
  simd?: string;
  simdSupported?: string;
  threads?: number;
  backends: BackendStatus[];
}

export function collectInfo(): SapipeInfo {
  const reason = nativeUnavailableReason();
  const info: SapipeInfo = {
    version: packageVersion(),
    node: process.version,
    platform: `${process.platform}-${process.arch}`,
    backends: [],
  };
  if (reason === undefined) {
    const native = nativeAddon().info();
    info.simd = native.simd;
    info.simdSupported = native.simdSupported;
    info.threads = native.threads;
    info.backends.push({ name: 'cpu', available: true });
  } else {
    info.backends.push({ name: 'cpu', available: false, reason });
  }
  info.backends.push({ name: 'cuda', available: false, reason: 'the CUDA plugin is not part of this build yet' });
  info.backends.push({ name: 'ucx', available: false, reason: 'the UCX plugin is not part of this build yet' });
  return info;
}

export function registerInfoCommand(program: Command): void {
  program
    .command('info')
    .description('print the version, the SIMD level chosen, threads and available backends')
    .option('--json', 'print JSON')
    .action((options: { json?: boolean }) => {
      const info = collectInfo();
      if (options.json) {
        console.log(JSON.stringify(info, null, 2));
        return;
      }
      console.log(`sapipe ${info.version} (node ${info.node}, ${info.platform})`);
      if (info.simd) console.log(`simd:    ${info.simd} (supported: ${info.simdSupported}; SAPIPE_SIMD lowers it)`);
      if (info.threads) console.log(`threads: ${info.threads} (SAPIPE_NUM_THREADS overrides)`);
      console.log('backends:');
      for (const b of info.backends)
        console.log(`  ${b.name.padEnd(5)} ${b.available ? 'available' : `unavailable: ${b.reason ?? ''}`}`);
    });
}
