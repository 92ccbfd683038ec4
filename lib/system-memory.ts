/**
 * What the machine's memory allows, read before allocating more than it can hold. Linux
 * overcommits: an allocation succeeds whatever its size and pages are given out as they are first
 * written, so a buffer too large for the machine fails only later, in the kernel's OOM killer,
 * which ends the process without an error. sapipe checks what it can know at allocation time.
 */
import { readFileSync } from 'node:fs';
import os from 'node:os';

import { OutOfMemoryError } from './errors.js';

/** Bytes of /proc/meminfo's fields, or undefined where the file is not there (not Linux). */
function meminfo(): Map<string, number> | undefined {
  try {
    const fields = new Map<string, number>();
    for (const line of readFileSync('/proc/meminfo', 'utf8').split('\n')) {
      const m = /^(\w+):\s+(\d+) kB/.exec(line);
      if (m) fields.set(m[1]!, Number(m[2]) * 1024);
    }
    return fields;
  } catch {
    return undefined;
  }
}

/** @internal Memory a process can still fill without swapping others out or being killed: available RAM plus free swap. */
export function availableMemoryBytes(): number {
  const m = meminfo();
  if (m?.has('MemAvailable')) return m.get('MemAvailable')! + (m.get('SwapFree') ?? 0);
  return os.freemem();
}

/** @internal All the memory there is: RAM plus swap. */
export function totalMemoryBytes(): number {
  const m = meminfo();
  if (m?.has('MemTotal')) return m.get('MemTotal')! + (m.get('SwapTotal') ?? 0);
  return os.totalmem();
}

const GiB = 2 ** 30;

/** @internal Bytes in words: GiB with one decimal, or MB. */
export function formatBytes(bytes: number): string {
  return bytes >= GiB ? `${(bytes / GiB).toFixed(1)} GiB` : `${Math.ceil(bytes / 2 ** 20)} MB`;
}

/**
 * @internal Throws OutOfMemoryError when `bytes` about to be written cannot fit in the memory
 * available now (`what` says what for, `advice` what to do).
 */
export function checkAvailable(bytes: number, what: string, advice: string): void {
  const available = availableMemoryBytes();
  if (bytes > available)
    throw new OutOfMemoryError(`${what} needs ${formatBytes(bytes)}; the machine has ${formatBytes(available)} available (RAM and free swap). ${advice}`);
}
