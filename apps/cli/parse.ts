import { InvalidArgumentError } from 'commander';

import { InvalidArgumentError as SapipeInvalidArgumentError, MAX_KERNEL_THREADS } from 'sapipe';
import { checkInteger } from 'sapipe/validate';

const SUFFIX: Record<string, number> = { '': 1, k: 1 << 10, m: 1 << 20, g: 1 << 30 };

/** Parses an element count such as `16M`, `1K` or `1048576` (binary suffixes). */
export function parseCount(value: string): number {
  const match = /^(\d+)([kKmMgG]?)$/.exec(value.trim());
  if (!match) throw new InvalidArgumentError(`expected a count like 1048576, 1K, 16M or 1G, got "${value}"`);
  const n = Number(match[1]) * SUFFIX[match[2]!.toLowerCase()]!;
  if (!Number.isSafeInteger(n)) throw new InvalidArgumentError(`count too large: "${value}"`);
  return n;
}

/** Parses a positive integer option. */
export function parsePositiveInt(value: string): number {
  const n = Number(value);
  if (!Number.isInteger(n) || n < 1) throw new InvalidArgumentError(`expected a positive integer, got "${value}"`);
  return n;
}

/** Parses an integer option that may be 0 (a count of warm-up runs). */
export function parseNonNegativeInt(value: string): number {
  const n = Number(value);
  if (value.trim() === '' || !Number.isInteger(n) || n < 0) throw new InvalidArgumentError(`expected an integer of 0 or more, got "${value}"`);
  return n;
}

/** Formats an element count with a binary suffix when exact (16777216 -> 16M). */
export function formatCount(n: number): string {
  for (const [suffix, unit] of [['G', 1 << 30], ['M', 1 << 20], ['K', 1 << 10]] as const)
    if (n >= unit && n % unit === 0) return `${n / unit}${suffix}`;
  return String(n);
}

/**
 * A number option's value, or a typed InvalidArgumentError (the package's, not commander's) naming
 * the option, so that every bad value fails the same way as bad values of the API.
 */
export function numberOption(value: string, name: string): number {
  const n = Number(value);
  if (value.trim() === '' || !Number.isFinite(n)) throw new SapipeInvalidArgumentError(`${name} must be a number, got "${value}"`);
  return n;
}

/** `--kernel-threads`: `auto`, `shared`, or each worker's number of kernel threads (a typed error naming the option otherwise). */
export function kernelThreadsOption(value: string): number | 'auto' | 'shared' {
  if (value === 'auto' || value === 'shared') return value;
  return checkInteger(numberOption(value, '--kernel-threads'), "--kernel-threads (or 'auto', 'shared')", 1, MAX_KERNEL_THREADS);
}
