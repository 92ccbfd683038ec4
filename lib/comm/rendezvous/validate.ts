/**
 * Argument checks shared by the rendezvous server, client and environment reader, and the checks
 * of what ranks read back from the store (the envelope of the values a rank publishes about itself).
 */
import { InvalidArgumentError, RendezvousError } from '../../errors.js';
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

/**
 * What a value published in an envelope is for. The kind is in the envelope so that a value copied
 * from a key of one kind to another (a liveness record where an address is read) is refused too.
 *
 * @category Communication
 */
export enum EnvelopeKind {
  UcxAddress = 1,
  Liveness = 2,
  NcclId = 3,
}

/** 'SAPE': the first bytes of every value a rank publishes about itself. @category Communication */
export const ENVELOPE_MAGIC = 0x53415045;
/** @category Communication */
export const ENVELOPE_VERSION = 1;
/** magic u32, version u8, kind u8, sender rank u32, world size u32, payload length u32. */
const ENVELOPE_HEADER_BYTES = 18;

const kindNames: Record<EnvelopeKind, string> = {
  [EnvelopeKind.UcxAddress]: 'a UCX worker address',
  [EnvelopeKind.Liveness]: 'a liveness listener',
  [EnvelopeKind.NcclId]: 'an NCCL unique id',
};

/**
 * Wraps what rank `rank` of `worldSize` publishes about itself (its UCX address, its liveness
 * listener, rank 0's NCCL id) with the fields a reader checks against the key it read: every value
 * read from the store is untrusted (any client that knows the token, or any local process when
 * there is none, can set any key), and what reaches UCX or NCCL must be what a rank of this job
 * published, or a typed error.
 *
 * @category Communication
 */
export function sealEnvelope(kind: EnvelopeKind, rank: number, worldSize: number, payload: Uint8Array): Buffer {
  const header = Buffer.allocUnsafe(ENVELOPE_HEADER_BYTES);
  header.writeUInt32BE(ENVELOPE_MAGIC, 0);
  header.writeUInt8(ENVELOPE_VERSION, 4);
  header.writeUInt8(kind, 5);
  header.writeUInt32BE(rank, 6);
  header.writeUInt32BE(worldSize, 10);
  header.writeUInt32BE(payload.length, 14);
  return Buffer.concat([header, payload]);
}

/** What {@link openEnvelope} expects of a value. @category Communication */
export interface EnvelopeExpectation {
  kind: EnvelopeKind;
  /** The rank the key names: the envelope's sender must be it. */
  rank: number;
  /** The reader's world size: every rank of a group publishes the same. */
  worldSize: number;
  /** Bounds of the payload's length, inclusive. */
  minPayloadBytes: number;
  maxPayloadBytes: number;
}

/**
 * The payload of an envelope read from `key`, once every field holds: magic, version, kind, sender
 * rank equal to the key's, world size equal to the reader's, a payload length within bounds that
 * accounts for every byte. Throws RendezvousError (`malformed`) naming the key and the first field
 * that does not hold.
 *
 * @category Communication
 */
export function openEnvelope(key: string, value: Buffer, expect: EnvelopeExpectation): Buffer {
  const what = kindNames[expect.kind];
  const bad = (why: string): RendezvousError =>
    new RendezvousError(
      `the value of '${key}' in the rendezvous store is not ${what} published by rank ${expect.rank}: ${why}. ` +
        'Some other process set it (a stray or mismatched rank, another job on the same MASTER_PORT, or a process planting values: set SAPIPE_TOKEN)',
      { reason: 'malformed' },
    );
  if (value.length < ENVELOPE_HEADER_BYTES) throw bad(`${value.length} bytes, shorter than the ${ENVELOPE_HEADER_BYTES}-byte envelope`);
  if (value.readUInt32BE(0) !== ENVELOPE_MAGIC) throw bad('it does not start with the envelope magic');
  const version = value.readUInt8(4);
  if (version !== ENVELOPE_VERSION) throw bad(`envelope version ${version}, this sapipe reads ${ENVELOPE_VERSION} (do all ranks run the same sapipe?)`);
  const kind = value.readUInt8(5);
  if (kind !== expect.kind) throw bad(`it holds ${kindNames[kind as EnvelopeKind] ?? `an unknown kind (${kind})`}`);
  const rank = value.readUInt32BE(6);
  if (rank !== expect.rank) throw bad(`it says it comes from rank ${rank}`);
  const worldSize = value.readUInt32BE(10);
  if (worldSize !== expect.worldSize) throw bad(`its sender counts ${worldSize} ranks, this rank ${expect.worldSize}`);
  const length = value.readUInt32BE(14);
  if (length !== value.length - ENVELOPE_HEADER_BYTES)
    throw bad(`it announces ${length} payload bytes and carries ${value.length - ENVELOPE_HEADER_BYTES}`);
  if (length < expect.minPayloadBytes || length > expect.maxPayloadBytes)
    throw bad(`a payload of ${length} bytes, outside [${expect.minPayloadBytes}, ${expect.maxPayloadBytes}]`);
  return value.subarray(ENVELOPE_HEADER_BYTES);
}
