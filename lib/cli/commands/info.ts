import type { Command } from 'commander';

import { backendStatuses, type BackendStatus } from '../../backends/index.js';
import { nativeAddon, nativeUnavailableReason } from '../../native.js';
import { packageVersion } from '../../version.js';

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
  const info: SapipeInfo = {
    version: packageVersion(),
    node: process.version,
    platform: `${process.platform}-${process.arch}`,
    backends: backendStatuses(),
  };
  if (nativeUnavailableReason() === undefined) {
    const native = nativeAddon().info();
    info.simd = native.simd;
    info.simdSupported = native.simdSupported;
    info.threads = native.threads;
  }
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
        console.log(`  ${b.name.padEnd(6)} ${b.kind.padEnd(7)} ${b.available ? 'available' : `unavailable: ${b.reason ?? ''}`}`);
    });
}
