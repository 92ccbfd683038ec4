/**
 * Wire format of the rendezvous store. Every message is one frame: a 4-byte big-endian body
 * length, then the body. A body starts with a 1-byte opcode and a 4-byte request id; the rest
 * depends on the opcode (see docs/launch.md). Both sides reject a frame whose declared length is
 * zero or above the agreed maximum as soon as the 4-byte header arrives, so an oversized prefix
 * never makes the reader buffer more than the maximum.
 */

/** Default largest frame body either side accepts: 16 MiB. @category Communication */
export const DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024;

/** Sent first in a HELLO so a connection from something that is not a rendezvous client is refused at once. @category Communication */
export const PROTOCOL_MAGIC = 0x53415052; // 'SAPR'
/**
 * Version a client sends in its HELLO. 2 added SET_ONCE and the EXISTS status; a version-1 client
 * is still served (it never sends SET_ONCE), while a version-1 store refuses a version-2 client
 * at HELLO with a message saying so, instead of closing the connection later on an unknown opcode.
 *
 * @category Communication
 */
export const PROTOCOL_VERSION = 2;
/** Oldest HELLO version the store serves. @category Communication */
export const MIN_PROTOCOL_VERSION = 1;

/**
 * Largest frame body the store reads from a connection that has not yet completed its HELLO (a
 * HELLO is at most 1036 bytes: its fields and a 1024-byte token). Only after the HELLO is accepted
 * does the limit rise to maxMessageBytes, so a connection that knows no token can make the store
 * buffer no more than this.
 *
 * @category Communication
 */
export const HANDSHAKE_MAX_MESSAGE_BYTES = 4096;

/** Longest key in UTF-8 bytes (keys carry a 2-byte length). @category Communication */
export const MAX_KEY_BYTES = 0xffff;

/** @category Communication */
export enum Op {
  Hello = 0x01,
  Set = 0x02,
  Get = 0x03,
  Wait = 0x04,
  Add = 0x05,
  SetOnce = 0x06,
  Response = 0x80,
}

/** @category Communication */
export enum Status {
  Ok = 0,
  NotFound = 1,
  Timeout = 2,
  BadRequest = 3,
  AuthFailed = 4,
  /** SET_ONCE of a key that is already set, or SET or ADD of a key that SET_ONCE made (such keys never change). */
  Exists = 5,
}

/** Thrown by the decoders on a malformed body; the receiver closes the connection. @category Communication */
export class ProtocolViolation extends Error {}

/** Frames a body: prefixes it with its length. @category Communication */
export function frame(body: Buffer): Buffer {
  const header = Buffer.allocUnsafe(4);
  header.writeUInt32BE(body.length, 0);
  return Buffer.concat([header, body]);
}

/** Builds a body from an opcode, a request id and the fields that follow. @category Communication */
export function body(op: Op, id: number, ...fields: Buffer[]): Buffer {
  const head = Buffer.allocUnsafe(5);
  head.writeUInt8(op, 0);
  head.writeUInt32BE(id >>> 0, 1);
  return Buffer.concat([head, ...fields]);
}

/** @category Communication */
export function u8(value: number): Buffer {
  const b = Buffer.allocUnsafe(1);
  b.writeUInt8(value, 0);
  return b;
}

/** @category Communication */
export function u32(value: number): Buffer {
  const b = Buffer.allocUnsafe(4);
  b.writeUInt32BE(value >>> 0, 0);
  return b;
}

/** @category Communication */
export function i64(value: number): Buffer {
  const b = Buffer.allocUnsafe(8);
  b.writeBigInt64BE(BigInt(value), 0);
  return b;
}

/** A byte string with a 2-byte length (keys, tokens). @category Communication */
export function short(bytes: Buffer): Buffer {
  return Buffer.concat([u16(bytes.length), bytes]);
}

/** A list of keys: 2-byte count, then each key as a short string. @category Communication */
export function keyList(keys: readonly Buffer[]): Buffer {
  return Buffer.concat([u16(keys.length), ...keys.map(short)]);
}

function u16(value: number): Buffer {
  const b = Buffer.allocUnsafe(2);
  b.writeUInt16BE(value, 0);
  return b;
}

/** Sequential reader over one body; every read checks bounds and throws ProtocolViolation. @category Communication */
export class BodyReader {
  private offset = 0;
  constructor(private readonly buf: Buffer) {}

  private need(n: number): void {
    if (this.offset + n > this.buf.length) throw new ProtocolViolation('truncated message');
  }
  u8(): number {
    this.need(1);
    return this.buf.readUInt8(this.offset++);
  }
  u16(): number {
    this.need(2);
    const v = this.buf.readUInt16BE(this.offset);
    this.offset += 2;
    return v;
  }
  u32(): number {
    this.need(4);
    const v = this.buf.readUInt32BE(this.offset);
    this.offset += 4;
    return v;
  }
  i64(): bigint {
    this.need(8);
    const v = this.buf.readBigInt64BE(this.offset);
    this.offset += 8;
    return v;
  }
  short(): Buffer {
    const n = this.u16();
    this.need(n);
    const v = this.buf.subarray(this.offset, this.offset + n);
    this.offset += n;
    return v;
  }
  /** A key: a short string that must be non-empty, valid UTF-8. */
  key(): string {
    const bytes = this.short();
    if (bytes.length === 0) throw new ProtocolViolation('empty key');
    const text = bytes.toString('utf8');
    // Round-tripping catches invalid UTF-8, which toString would silently replace.
    if (!Buffer.from(text, 'utf8').equals(bytes))
      throw new ProtocolViolation('key is not valid UTF-8');
    return text;
  }
  keys(): string[] {
    const n = this.u16();
    if (n === 0) throw new ProtocolViolation('empty key list');
    const keys: string[] = [];
    for (let i = 0; i < n; i++) keys.push(this.key());
    return keys;
  }
  /** Everything left in the body (values). Copied, so the store does not pin the whole receive buffer. */
  rest(): Buffer {
    const v = Buffer.from(this.buf.subarray(this.offset));
    this.offset = this.buf.length;
    return v;
  }
  end(): void {
    if (this.offset !== this.buf.length) throw new ProtocolViolation('trailing bytes in message');
  }
}

/**
 * Splits a byte stream into frame bodies. push() returns the complete bodies received so far and
 * throws ProtocolViolation on a zero or oversized length. A reader whose limit changes between
 * frames (the store raises it once a connection has said HELLO) uses append() and next() instead,
 * so that each header is checked against the limit in force when its frame is reached.
 *
 * @category Communication
 */
export class FrameDecoder {
  private chunks: Buffer[] = [];
  private buffered = 0;
  /** Body length announced by the header already consumed, if any. */
  private expected: number | undefined;

  /** Largest body accepted; checked against each header as it is read. */
  constructor(public maxBodyBytes: number) {}

  push(chunk: Buffer): Buffer[] {
    this.append(chunk);
    const bodies: Buffer[] = [];
    for (let b = this.next(); b !== undefined; b = this.next()) bodies.push(b);
    return bodies;
  }

  /** Adds received bytes; next() takes frames out of them. */
  append(chunk: Buffer): void {
    this.chunks.push(chunk);
    this.buffered += chunk.length;
  }

  /** The next complete body, or undefined until more bytes arrive. */
  next(): Buffer | undefined {
    if (this.expected === undefined) {
      if (this.buffered < 4) return undefined;
      const length = this.take(4).readUInt32BE(0);
      if (length === 0) throw new ProtocolViolation('empty frame');
      if (length > this.maxBodyBytes)
        throw new ProtocolViolation(`frame of ${length} bytes exceeds the limit of ${this.maxBodyBytes}`);
      this.expected = length;
    }
    if (this.buffered < this.expected) return undefined;
    const b = this.take(this.expected);
    this.expected = undefined;
    return b;
  }

  /** Bytes received and not yet taken out as frames. */
  get pending(): number {
    return this.buffered;
  }

  /** Removes the first n buffered bytes; each byte is copied at most once, however it was chunked. */
  private take(n: number): Buffer {
    const first = this.chunks[0]!;
    let out: Buffer;
    if (first.length >= n) {
      out = first.subarray(0, n);
      if (first.length === n) this.chunks.shift();
      else this.chunks[0] = first.subarray(n);
    } else {
      out = Buffer.allocUnsafe(n);
      let filled = 0;
      while (filled < n) {
        const head = this.chunks[0]!;
        const used = Math.min(head.length, n - filled);
        head.copy(out, filled, 0, used);
        filled += used;
        if (used === head.length) this.chunks.shift();
        else this.chunks[0] = head.subarray(used);
      }
    }
    this.buffered -= n;
    return out;
  }
}
