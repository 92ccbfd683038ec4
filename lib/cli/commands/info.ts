import type { Command } from 'commander';

import {
  COMM_BACKENDS,
  COMPUTE_BACKENDS,
  backendStatuses,
  installHint,
  selectBackend,
  selectCommBackend,
  type BackendStatus,
} from '../../backends/index.js';
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
  /** What `auto` selects here and why, or why nothing can be selected. */
  selected: { compute: SelectedBackend; comm: SelectedBackend };
}

export type SelectedBackend = { name: string; why: string } | { name: null; error: string };

function selected(choose: () => { name: string; why: string }): SelectedBackend {
  try {
    const { name, why } = choose();
    return { name, why };
  } catch (error) {
    return { name: null, error: (error as Error).message };
  }
}

export function collectInfo(): SapipeInfo {
  const statuses = backendStatuses();
  const info: SapipeInfo = {
    version: packageVersion(),
    node: process.version,
    platform: `${process.platform}-${process.arch}`,
    backends: statuses,
    selected: {
      compute: selected(() => selectBackend('auto', statuses)),
      comm: selected(() => selectCommBackend('auto', statuses)),
    },
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
    .description('print the version, the SIMD level chosen, threads, every backend (and why one is missing) and what `auto` selects')
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
      for (const b of info.backends) {
        console.log(`  ${b.name.padEnd(6)} ${b.kind.padEnd(7)} ${b.available ? 'available' : `unavailable: ${b.reason ?? ''}`}`);
        const known = [...COMPUTE_BACKENDS, ...COMM_BACKENDS].find((name) => name === b.name);
        if (!b.available && known) console.log(`                 to use it: ${installHint(known)}`);
      }
      console.log('auto selects:');
      for (const [kind, choice] of Object.entries(info.selected))
        console.log(`  ${kind.padEnd(7)} ${choice.name === null ? `none: ${choice.error}` : `${choice.name} (${choice.why})`}`);
    });
}
