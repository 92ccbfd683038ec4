/**
 * The IDX format of MNIST and Fashion-MNIST (http://yann.lecun.com/exdb/mnist/): a 4-byte magic
 * (two zero bytes, the element type, the number of dimensions), each dimension as a big-endian
 * uint32, then the elements row-major. Only unsigned bytes (type 0x08) are read: every file of
 * those data sets holds them. Files may be gzip-compressed (`.gz`), as Debian ships them.
 */
import { readFileSync } from 'node:fs';
import { gunzipSync } from 'node:zlib';

import { BackendUnavailableError, InvalidArgumentError } from '../errors.js';
import { describeValue } from '../validate.js';

/** The element type code of unsigned bytes. */
const UBYTE = 0x08;
/** The most dimensions a file may declare (images are 3, labels 1). */
const MAX_DIMS = 8;

/** An IDX file's contents: its dimensions and its elements (a view of the file's bytes). @category Data */
export interface IdxArray {
  readonly dims: readonly number[];
  readonly data: Uint8Array;
}

/** Decodes IDX bytes (already decompressed); `name` names the source in errors. @category Data */
export function decodeIdx(bytes: Uint8Array, name = 'IDX data'): IdxArray {
  if (!(bytes instanceof Uint8Array)) throw new InvalidArgumentError(`decodeIdx: bytes must be a Uint8Array, got ${describeValue(bytes)}`);
  const label = typeof name === 'string' ? name : 'IDX data';
  const bad = (why: string): InvalidArgumentError => new InvalidArgumentError(`${label} is not an IDX file of unsigned bytes: ${why}`);
  if (bytes.length < 4) throw bad(`${bytes.length} bytes, shorter than the 4-byte magic`);
  if (bytes[0] !== 0 || bytes[1] !== 0) throw bad(`its magic starts ${bytes[0]}, ${bytes[1]} instead of 0, 0`);
  if (bytes[2] !== UBYTE) throw bad(`its element type is 0x${bytes[2]!.toString(16)}, not 0x08 (unsigned byte)`);
  const rank = bytes[3]!;
  if (rank < 1 || rank > MAX_DIMS) throw bad(`it declares ${rank} dimensions (1 to ${MAX_DIMS} are read)`);
  const header = 4 + 4 * rank;
  if (bytes.length < header) throw bad(`${bytes.length} bytes, shorter than its ${header}-byte header`);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const dims: number[] = [];
  let elements = 1;
  for (let d = 0; d < rank; d++) {
    const n = view.getUint32(4 + 4 * d, false);
    dims.push(n);
    elements *= n;
  }
  if (bytes.length - header !== elements)
    throw bad(`its dimensions ${dims.join(' x ')} make ${elements} elements, but ${bytes.length - header} bytes follow the header (truncated or corrupt)`);
  return { dims, data: bytes.subarray(header) };
}

/** Reads an IDX file, gunzipping it when its name ends in `.gz`. @category Data */
export function readIdx(path: string): IdxArray {
  if (typeof path !== 'string' || path === '' || path.includes('\0')) throw new InvalidArgumentError(`readIdx: path must be a file path, got ${describeValue(path)}`);
  let bytes: Uint8Array;
  try {
    bytes = readFileSync(path);
  } catch (error) {
    throw new BackendUnavailableError(`readIdx: cannot read ${path} (${(error as NodeJS.ErrnoException).code ?? describeValue(error)})`, { cause: error });
  }
  if (path.endsWith('.gz')) {
    try {
      bytes = gunzipSync(bytes);
    } catch (error) {
      throw new InvalidArgumentError(`readIdx: ${path} is not valid gzip (${(error as Error).message})`, { cause: error });
    }
  }
  return decodeIdx(bytes, path);
}
