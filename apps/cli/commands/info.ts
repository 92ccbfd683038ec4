import type { Command } from 'commander';

import { type BackendStatus, backendStatuses, COMM_BACKENDS, COMPUTE_BACKENDS, installHint, selectBackend, selectCommBackend } from 'sapipe/backends';
import { chooseDevice, packageVersion } from 'sapipe';
import { nativeAddon, nativeUnavailableReason } from 'sapipe/kernels';
import { DEMO_DEFAULTS } from '../../demo/config.js';
import { resolveDemoDevice } from '../../demo/device.js';

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
  /** Where each command that trains or times a model runs here, by default and with `--device auto`. */
  devices: CommandDevice[];
}

/** Where a command runs its model: by default, and what its `--device auto` picks (absent: the command takes no device). */
export interface CommandDevice {
  command: string;
  device: string;
  why: string;
  auto?: string;
}

/** The commands' devices: one probe (chooseDevice never throws for auto). */
function commandDevices(): CommandDevice[] {
  const auto = chooseDevice('auto');
  // Why no GPU is usable is on the cuda and cublas lines above.
  const pick = auto.device === 'cpu' ? 'cpu (no usable GPU: see cuda and cublas above)' : `${auto.device} (${auto.reason})`;
  return [
    { command: 'train pipeline', device: 'cpu', why: 'the default --device; --device cuda:N or auto runs every stage on one GPU', auto: pick },
    { command: 'bench kernels', device: 'cpu', why: 'the default --device; --device cuda:N times the plugin\'s update kernels' },
    { command: 'demo', device: 'cpu', why: 'the default --device: its data-parallel workers are threads over the local backend; --device cuda:N, cuda or auto puts each worker on a GPU of its own, over NCCL', auto: demoAuto(pick) },
  ];
}

/** What `sapipe demo --device auto` would run on: the GPUs it puts a worker on each, or the CPU and why. */
function demoAuto(cpuPick: string): string {
  try {
    const { device } = resolveDemoDevice('auto', undefined, DEMO_DEFAULTS.workers);
    if (device.kind === 'cpu') return device.reason.includes('NCCL') ? `cpu (${device.reason.replace(/^--device auto: /, '')})` : cpuPick;
    return `${device.ranks.join(', ')}, one worker each (${device.reason.replace(/^--device auto: /, '')})`;
  } catch (error) {
    return `none: ${(error as Error).message}`;
  }
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
    devices: commandDevices(),
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
      const width = Math.max(60, Math.min(process.stdout.columns ?? 100, 120));
      const indent = ' '.repeat(17);
      const reasons = new Map(info.backends.map((b) => [b.name, b.reason ?? '']));
      for (const b of info.backends) {
        // A backend that is missing because another one is (nccl needs cuda) points at it instead
        // of repeating its reason.
        let reason = b.reason ?? '';
        for (const [other, text] of reasons) if (other !== b.name && text && reason.includes(text)) reason = reason.replace(text, `see ${other} above`);
        // Reasons may hold line breaks (a list of places looked at): the wrap lays them out.
        reason = reason.replace(/:\s*\n\s*/g, ': ').replace(/\s*\n\s*/g, '; ');
        const head = `  ${b.name.padEnd(6)} ${b.kind.padEnd(7)} `;
        console.log(wrap(head + (b.available ? 'available' : `unavailable: ${reason}`), width, indent));
        // What an available backend found (devices, architectures, library versions, algorithms);
        // the cpu backend's details are the simd and threads lines above.
        if (b.available && b.details && b.name !== 'cpu')
          console.log(wrap(indent + Object.entries(b.details).map(([k, v]) => `${k}: ${String(v)}`).join('; '), width, indent));
        const known = [...COMPUTE_BACKENDS, ...COMM_BACKENDS].find((name) => name === b.name);
        if (!b.available && known) console.log(wrap(`${indent}to use it: ${installHint(known)}`, width, indent));
      }
      console.log('auto selects:');
      for (const [kind, choice] of Object.entries(info.selected)) {
        // The reasons a backend was passed over are listed above; the line names them only.
        const why = choice.name === null ? `none: ${choice.error}` : `${choice.name} (${choice.why.replace(/ is unavailable \(.*\)$/s, ' is unavailable')})`;
        console.log(wrap(`  ${kind.padEnd(7)} ${why}`, width, ' '.repeat(10)));
      }
      console.log('commands run on:');
      for (const c of info.devices)
        console.log(wrap(`  ${c.command.padEnd(15)} ${c.device} (${c.why})${c.auto ? `; --device auto: ${c.auto}` : ''}`, width, ' '.repeat(18)));
    });
}

/** Wraps `text` at spaces to `width` columns, continuing lines with `indent`. */
function wrap(text: string, width: number, indent: string): string {
  const lines: string[] = [];
  let line = '';
  for (const word of text.split(/(?<=\S) (?=\S)/)) {
    if (line !== '' && line.length + 1 + word.length > width) {
      lines.push(line);
      line = indent + word.trimStart();
    } else line = line === '' ? word : `${line} ${word}`;
  }
  lines.push(line);
  return lines.join('\n');
}
