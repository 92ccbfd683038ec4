/** Argument checks shared by the rendezvous server, client and environment reader. */
import { InvalidArgumentError } from '../../errors.js';
import { MAX_KEY_BYTES } from './frame.js';
import { describeValue } from '../../validate.js';

/** Longest delay a Node timer honours; longer timeouts would silently fire after 1 ms. @category Communication */
export const MAX_TIMEOUT_MS = 2 ** 31 - 1;

/** @category Communication */
export function checkPort(port: unknown, name: string, allowZero: boolean): number {
  if (typeof port !== 'number' || !Number.isInteger(port) || port < (allowZero ? 0 : 1) || port > 65535)
    throw new InvalidArgumentError(`${name} must be an integer in [${allowZero ? 0 : 1}, 65535], got ${describeValue(port)}`);
  return port;
}

/** @category Communication */
export function checkTimeoutMs(timeoutMs: unknown, name = 'timeoutMs'): number {
  if (typeof timeoutMs !== 'number' || !Number.isInteger(timeoutMs) || timeoutMs < 1 || timeoutMs > MAX_TIMEOUT_MS)
    throw new InvalidArgumentError(`${name} must be an integer number of milliseconds in [1, ${MAX_TIMEOUT_MS}], got ${describeValue(timeoutMs)}`);
  return timeoutMs;
}

/** @category Communication */
export function checkMaxMessageBytes(bytes: unknown): number {
  // 64 bytes leaves room for a HELLO with a short token; 1 GiB keeps Buffer.concat sane.
  if (typeof bytes !== 'number' || !Number.isInteger(bytes) || bytes < 64 || bytes > 2 ** 30)
    throw new InvalidArgumentError(`maxMessageBytes must be an integer in [64, 2^30], got ${describeValue(bytes)}`);
  return bytes;
}

/** Encodes a key; keys are non-empty strings of at most 65535 UTF-8 bytes. @category Communication */
export function encodeKey(key: unknown): Buffer {
  if (typeof key !== 'string' || key.length === 0) throw new InvalidArgumentError('a key must be a non-empty string');
  const bytes = Buffer.from(key, 'utf8');
  if (bytes.length > MAX_KEY_BYTES) throw new InvalidArgumentError(`key is ${bytes.length} UTF-8 bytes; the limit is ${MAX_KEY_BYTES}`);
  return bytes;
}

/** Encodes a value: bytes as they are, strings as UTF-8. @category Communication */
export function encodeValue(value: unknown): Buffer {
  if (typeof value === 'string') return Buffer.from(value, 'utf8');
  if (value instanceof Uint8Array) return Buffer.from(value.buffer, value.byteOffset, value.byteLength);
  throw new InvalidArgumentError('a value must be a Uint8Array (or Buffer) or a string');
}

/** @category Communication */
export function checkRank(rank: unknown, worldSize: unknown): void {
  if (typeof worldSize !== 'number' || !Number.isInteger(worldSize) || worldSize < 1)
    throw new InvalidArgumentError(`worldSize must be a positive integer, got ${describeValue(worldSize)}`);
  if (typeof rank !== 'number' || !Number.isInteger(rank) || rank < 0 || rank >= worldSize)
    throw new InvalidArgumentError(`rank must be an integer in [0, ${worldSize - 1}], got ${describeValue(rank)}`);
}
