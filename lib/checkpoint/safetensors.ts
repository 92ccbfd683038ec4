/**
 * The safetensors file format (https://github.com/huggingface/safetensors), the ML ecosystem's
 * convention for weights, so that Python tools read sapipe's checkpoints as they are: 8 bytes of
 * little-endian header length N, N bytes of JSON header (`{ name: { dtype, shape, data_offsets:
 * [begin, end] }, __metadata__: { string: string } }`, padded with spaces to a multiple of 8),
 * then the tensors' bytes, offsets relative to the end of the header. Only what checkpoints need:
 * F32 and I32 tensors. Everything read is checked before it is trusted; what is wrong is a
 * CheckpointError naming the file and the fault.
 */
import { endianness } from 'node:os';

import { CheckpointError, InvalidArgumentError, SizeMismatchError } from '../errors.js';
import { checkObject, describeValue } from '../validate.js';

/** A tensor of a safetensors file. @category Checkpoints */
export interface SafetensorsTensor {
  readonly shape: readonly number[];
  readonly data: Float32Array | Int32Array;
}

/** The largest header accepted (the format's reference implementation takes 100 MB). */
const MAX_HEADER_BYTES = 100 * 1024 * 1024;
const DTYPES = { F32: Float32Array, I32: Int32Array } as const;

function checkHost(): void {
  // The format is little-endian; typed arrays use the host's order.
  if (endianness() !== 'LE') throw new CheckpointError('checkpoints are written and read on little-endian hosts only', { reason: 'foreign' });
}

/**
 * The file's bytes as a list of chunks (header, then each tensor's bytes as a view, no copy), in
 * the order given; `metadata` values must be strings (the format's rule).
 *
 * @category Checkpoints
 */
export function encodeSafetensors(tensors: ReadonlyMap<string, SafetensorsTensor>, metadata: Readonly<Record<string, string>>): Uint8Array[] {
  checkHost();
  if (!(tensors instanceof Map)) throw new InvalidArgumentError(`encodeSafetensors: tensors must be a Map of name -> { shape, data }, got ${describeValue(tensors)}`);
  checkObject(metadata, 'encodeSafetensors: metadata');
  for (const [k, v] of Object.entries(metadata)) if (typeof v !== 'string') throw new InvalidArgumentError(`encodeSafetensors: metadata.${k} must be a string (the format's rule), got ${describeValue(v)}`);
  const header: Record<string, unknown> = { __metadata__: { ...metadata } };
  let offset = 0;
  for (const [name, t] of tensors) {
    if (typeof name !== 'string' || name === '__metadata__') throw new InvalidArgumentError(`encodeSafetensors: tensor names must be strings other than __metadata__, got ${describeValue(name)}`);
    const tensor = t as Partial<SafetensorsTensor> | null;
    if (tensor === null || typeof tensor !== 'object' || !(tensor.data instanceof Float32Array || tensor.data instanceof Int32Array))
      throw new InvalidArgumentError(`encodeSafetensors: tensor ${name} must be { shape, data: Float32Array | Int32Array }`);
    if (!Array.isArray(tensor.shape) || !tensor.shape.every((d) => Number.isSafeInteger(d) && d >= 0))
      throw new InvalidArgumentError(`encodeSafetensors: tensor ${name}'s shape must be an array of non-negative integers, got ${describeValue(tensor.shape)}`);
    const dtype = t.data instanceof Float32Array ? 'F32' : 'I32';
    const count = t.shape.reduce((a: number, b: number) => a * b, 1);
    if (count !== t.data.length) throw new SizeMismatchError(`encodeSafetensors: tensor ${name}'s shape [${t.shape.join(', ')}] holds ${count} elements, its data ${t.data.length}`);
    header[name] = { dtype, shape: [...t.shape], data_offsets: [offset, offset + t.data.byteLength] };
    offset += t.data.byteLength;
  }
  let json = Buffer.from(JSON.stringify(header));
  const padded = Math.ceil(json.length / 8) * 8;
  if (padded > json.length) json = Buffer.concat([json, Buffer.alloc(padded - json.length, 0x20)]);
  const length = Buffer.alloc(8);
  length.writeBigUInt64LE(BigInt(json.length));
  return [length, json, ...[...tensors.values()].map((t) => new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength))];
}

/** @internal The parsed header and where the data starts, checked against the file's size. */
export function decodeSafetensorsHeader(file: Uint8Array, what: string): { header: Record<string, unknown>; dataStart: number } {
  checkHost();
  if (!(file instanceof Uint8Array)) throw new InvalidArgumentError(`decodeSafetensors: file must be the file's bytes (a Buffer or Uint8Array), got ${describeValue(file)}`);
  if (typeof what !== 'string') throw new InvalidArgumentError(`decodeSafetensors: what must be a string naming the file (for messages), got ${describeValue(what)}`);
  if (file.byteLength < 8) throw new CheckpointError(`${what}: ${file.byteLength} bytes, too short for a safetensors file (truncated?)`, { reason: 'truncated' });
  const view = Buffer.from(file.buffer, file.byteOffset, file.byteLength);
  const n = view.readBigUInt64LE(0);
  if (n > BigInt(MAX_HEADER_BYTES)) throw new CheckpointError(`${what}: a header of ${n} bytes; not a safetensors file`, { reason: 'foreign' });
  const length = Number(n);
  if (8 + length > file.byteLength) throw new CheckpointError(`${what}: the header says ${length} bytes, the file holds ${file.byteLength - 8} after the length (truncated)`, { reason: 'truncated' });
  let header: unknown;
  try {
    header = JSON.parse(view.subarray(8, 8 + length).toString('utf8'));
  } catch (error) {
    throw new CheckpointError(`${what}: the header is not JSON; not a safetensors file, or corrupt`, { reason: 'corrupt', cause: error });
  }
  if (header === null || typeof header !== 'object' || Array.isArray(header)) throw new CheckpointError(`${what}: the header is not a JSON object`, { reason: 'corrupt' });
  return { header: header as Record<string, unknown>, dataStart: 8 + length };
}

/**
 * Decodes a whole file: every tensor (copied out, aligned) and the metadata. The tensors must tile
 * the data section exactly, in bounds and without overlap, with byte counts that match their
 * shapes.
 *
 * @category Checkpoints
 */
export function decodeSafetensors(file: Uint8Array, what: string): { tensors: Map<string, SafetensorsTensor>; metadata: Record<string, string> } {
  const { header, dataStart } = decodeSafetensorsHeader(file, what);
  const dataBytes = file.byteLength - dataStart;
  const metadata: Record<string, string> = {};
  const raw = header.__metadata__;
  if (raw !== undefined) {
    if (raw === null || typeof raw !== 'object' || Array.isArray(raw)) throw new CheckpointError(`${what}: __metadata__ is not an object`, { reason: 'corrupt' });
    for (const [k, v] of Object.entries(raw)) {
      if (typeof v !== 'string') throw new CheckpointError(`${what}: __metadata__.${k} is not a string`, { reason: 'corrupt' });
      metadata[k] = v;
    }
  }
  const entries: { name: string; dtype: keyof typeof DTYPES; shape: number[]; begin: number; end: number }[] = [];
  for (const [name, value] of Object.entries(header)) {
    if (name === '__metadata__') continue;
    const e = value as { dtype?: unknown; shape?: unknown; data_offsets?: unknown } | null;
    if (e === null || typeof e !== 'object') throw new CheckpointError(`${what}: tensor ${name} is not described by an object`, { reason: 'corrupt' });
    if (typeof e.dtype !== 'string' || !Object.hasOwn(DTYPES, e.dtype)) throw new CheckpointError(`${what}: tensor ${name} has dtype ${String(e.dtype)}; checkpoints hold F32 and I32`, { reason: 'foreign' });
    const shape = e.shape;
    if (!Array.isArray(shape) || !shape.every((d) => Number.isSafeInteger(d) && d >= 0)) throw new CheckpointError(`${what}: tensor ${name} has no valid shape`, { reason: 'corrupt' });
    const offsets = e.data_offsets;
    if (!Array.isArray(offsets) || offsets.length !== 2 || !offsets.every((o) => Number.isSafeInteger(o) && o >= 0) || offsets[0] > offsets[1] || offsets[1] > dataBytes)
      throw new CheckpointError(`${what}: tensor ${name}'s data offsets ${JSON.stringify(offsets)} are not inside the ${dataBytes} data bytes (truncated or corrupt)`, { reason: offsets && Array.isArray(offsets) && offsets[1] > dataBytes ? 'truncated' : 'corrupt' });
    const dtype = e.dtype as keyof typeof DTYPES;
    const count = (shape as number[]).reduce((a, b) => a * b, 1);
    if ((offsets[1] - offsets[0]) !== count * DTYPES[dtype].BYTES_PER_ELEMENT)
      throw new CheckpointError(`${what}: tensor ${name} has ${offsets[1] - offsets[0]} bytes for shape [${(shape as number[]).join(', ')}] of ${dtype}`, { reason: 'corrupt' });
    entries.push({ name, dtype, shape: shape as number[], begin: offsets[0], end: offsets[1] });
  }
  entries.sort((a, b) => a.begin - b.begin);
  let at = 0;
  for (const e of entries) {
    if (e.begin !== at) throw new CheckpointError(`${what}: the tensors do not tile the data (a gap or an overlap before ${e.name})`, { reason: 'corrupt' });
    at = e.end;
  }
  if (at !== dataBytes) throw new CheckpointError(`${what}: ${dataBytes - at} bytes after the last tensor`, { reason: 'corrupt' });
  const tensors = new Map<string, SafetensorsTensor>();
  for (const e of entries) {
    const Ctor = DTYPES[e.dtype];
    // A copy: the file's bytes need not be aligned for the element type.
    const data = new Ctor((e.end - e.begin) / Ctor.BYTES_PER_ELEMENT);
    new Uint8Array(data.buffer).set(file.subarray(dataStart + e.begin, dataStart + e.end));
    tensors.set(e.name, { shape: e.shape, data });
  }
  return { tensors, metadata };
}
