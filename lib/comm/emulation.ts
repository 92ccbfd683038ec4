/**
 * Network emulation (EMULATED, not measured): makes each collective take at least the time a ring
 * algorithm would need on links of `gbps` gigabits per second with `latencyUs` per message, so that
 * overlap of communication and computation can be studied on one machine. The data still moves
 * through shared memory; only the completion is delayed.
 */
import { InvalidArgumentError } from '../errors.js';
import { checkInteger, checkNumber, checkOneOf, describeValue } from '../validate.js';

/** @category Communication */
export interface NetworkEmulation {
  /** Link bandwidth in gigabits per second (> 0). */
  gbps: number;
  /** Latency per message in microseconds (>= 0). Default 0. */
  latencyUs?: number;
}

/** @category Communication */
export function checkEmulation(e: unknown): NetworkEmulation | undefined {
  if (e === undefined) return undefined;
  if (e === null || typeof e !== 'object') throw new InvalidArgumentError('emulate must be an object like { gbps: 10, latencyUs: 5 }');
  const { gbps, latencyUs } = e as NetworkEmulation;
  if (typeof gbps !== 'number' || !Number.isFinite(gbps) || gbps <= 0)
    throw new InvalidArgumentError(`emulate.gbps must be a positive number of gigabits per second, got ${describeValue(gbps)}`);
  if (latencyUs !== undefined && (typeof latencyUs !== 'number' || !Number.isFinite(latencyUs) || latencyUs < 0))
    throw new InvalidArgumentError(`emulate.latencyUs must be a non-negative number of microseconds, got ${describeValue(latencyUs)}`);
  return { gbps, latencyUs: latencyUs ?? 0 };
}

/** What a ring moves per rank, in units of the collective's volume, and its number of steps. @category Communication */
export type RingPattern = 'allreduce' | 'reduceScatter' | 'allgather' | 'broadcast' | 'barrier' | 'p2p';

/**
 * Milliseconds a ring collective of `bytes` (the full buffer: the all-reduced buffer, the
 * reduce-scatter input, the all-gather output) takes on n ranks: all-reduce moves 2(n-1)/n of it in
 * 2(n-1) steps; reduce-scatter and all-gather (n-1)/n in n-1 steps; a pipelined broadcast and a
 * point-to-point message the whole volume once.
 *
 * @category Communication
 */
export function emulatedMs(e: NetworkEmulation, pattern: RingPattern, bytes: number, n: number): number {
  if (checkEmulation(e) === undefined) throw new InvalidArgumentError('emulatedMs: pass the emulation, e.g. { gbps: 10, latencyUs: 5 }');
  checkOneOf(pattern, 'emulatedMs: pattern', ['allreduce', 'reduceScatter', 'allgather', 'broadcast', 'p2p', 'barrier'] as const);
  checkNumber(bytes, 'emulatedMs: bytes', 0, Number.MAX_VALUE);
  checkInteger(n, 'emulatedMs: n (ranks)', 1, 1 << 24);
  const perByteMs = 8 / (e.gbps * 1e9) * 1e3;
  const latencyMs = (e.latencyUs ?? 0) / 1e3;
  if (n <= 1 && pattern !== 'p2p') return 0;
  switch (pattern) {
    case 'allreduce':
      return (2 * (n - 1) / n) * bytes * perByteMs + 2 * (n - 1) * latencyMs;
    case 'reduceScatter':
    case 'allgather':
      return ((n - 1) / n) * bytes * perByteMs + (n - 1) * latencyMs;
    case 'broadcast':
    case 'p2p':
      return bytes * perByteMs + latencyMs;
    case 'barrier':
      return 2 * (n - 1) * latencyMs;
  }
}
