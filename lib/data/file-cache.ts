/**
 * The two levels of cache in front of a data file, in the form that fits one machine (the
 * multi-level data cache of training in a public cloud: remote store, local disk, memory):
 *
 * - disk: a compressed file is decompressed once into a cache folder, keyed by the source's path,
 *   size and modification time, and later runs read that copy (`decompressedCopy`);
 * - memory: a file is read through an LRU cache of fixed-size blocks (`FileBlockCache`), so a
 *   data set larger than the memory it is given is read in blocks, and one that fits is read from
 *   disk once. After warm-up the cache allocates nothing: an evicted block's buffer takes the next.
 */
import { createHash } from 'node:crypto';
import { closeSync, fstatSync, mkdirSync, openSync, readFileSync, readSync, renameSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, join, resolve } from 'node:path';
import { gunzipSync } from 'node:zlib';

import { BackendUnavailableError, DisposedError, InvalidArgumentError } from '../errors.js';
import { checkInteger, checkOptions, describeValue, optionKeys } from '../validate.js';

/** Default memory given to a FileBlockCache: 64 MiB. @category Data */
export const DEFAULT_CACHE_BYTES = 64 << 20;
/** Default block of a FileBlockCache: 64 KiB (a miss reads one block: small blocks waste less of a read when samples are drawn at random). @category Data */
export const DEFAULT_BLOCK_BYTES = 64 << 10;

/** Where decompressed copies go when no folder is given. @category Data */
export function defaultCacheDir(): string {
  return process.env.SAPIPE_DATA_CACHE ?? join(tmpdir(), 'sapipe-data-cache');
}

function checkPath(path: unknown, what: string): string {
  if (typeof path !== 'string' || path === '' || path.includes('\0')) throw new InvalidArgumentError(`${what} must be a file path, got ${describeValue(path)}`);
  return path;
}

/**
 * The path of an uncompressed copy of the gzip file `path` in `cacheDir`, made on first use (atomically:
 * written beside, then renamed) and reused while the source keeps its size and modification time.
 * @category Data
 */
export function decompressedCopy(path: string, cacheDir: string = defaultCacheDir()): string {
  checkPath(path, 'decompressedCopy: path');
  checkPath(cacheDir, 'decompressedCopy: cacheDir');
  let source;
  try {
    source = statSync(path);
  } catch (error) {
    throw new BackendUnavailableError(`decompressedCopy: cannot read ${path} (${(error as NodeJS.ErrnoException).code ?? describeValue(error)})`, { cause: error });
  }
  const key = createHash('sha256').update(`${resolve(path)}\0${source.size}\0${source.mtimeMs}`).digest('hex').slice(0, 16);
  const copy = join(cacheDir, `${basename(path).replace(/\.gz$/, '')}.${key}`);
  try {
    if (statSync(copy).isFile()) return copy;
  } catch {
    // not made yet
  }
  let bytes: Buffer;
  try {
    bytes = gunzipSync(readFileSync(path));
  } catch (error) {
    throw new InvalidArgumentError(`decompressedCopy: ${path} is not valid gzip (${(error as Error).message})`, { cause: error });
  }
  mkdirSync(cacheDir, { recursive: true });
  const tmp = `${copy}.tmp-${process.pid}`;
  try {
    writeFileSync(tmp, bytes);
    renameSync(tmp, copy);
  } catch (error) {
    rmSync(tmp, { force: true });
    throw new BackendUnavailableError(`decompressedCopy: cannot write the cache ${copy} (${(error as NodeJS.ErrnoException).code ?? describeValue(error)}); set SAPIPE_DATA_CACHE or pass another cacheDir`, { cause: error });
  }
  return copy;
}

/** @category Data */
export interface FileBlockCacheOptions {
  /** Memory for cached blocks; at least one block. Default {@link DEFAULT_CACHE_BYTES}. */
  capacityBytes?: number;
  /** Bytes per block. Default {@link DEFAULT_BLOCK_BYTES}. */
  blockBytes?: number;
}
const CACHE_OPTION_KEYS = optionKeys<FileBlockCacheOptions>({ capacityBytes: true, blockBytes: true });

/** What a FileBlockCache has done. @category Data */
export interface FileBlockCacheStats {
  /** Block reads served from memory. */
  hits: number;
  /** Block reads that went to the file. */
  misses: number;
  /** Bytes read from the file. */
  bytesFromFile: number;
  /** Blocks held now. */
  blocks: number;
}

/** A file read through an LRU cache of fixed-size blocks in memory. @category Data */
export class FileBlockCache {
  readonly path: string;
  /** The file's size in bytes. */
  readonly size: number;
  readonly blockBytes: number;
  /** How many blocks the cache holds at most. */
  readonly maxBlocks: number;
  /** Block number -> its bytes; Map order is recency (the first is the least recently used). */
  private readonly blocks = new Map<number, Buffer>();
  private fd: number | undefined;
  private readonly counts: FileBlockCacheStats = { hits: 0, misses: 0, bytesFromFile: 0, blocks: 0 };

  private constructor(path: string, fd: number, size: number, blockBytes: number, maxBlocks: number) {
    this.path = path;
    this.fd = fd;
    this.size = size;
    this.blockBytes = blockBytes;
    this.maxBlocks = maxBlocks;
  }

  /** Opens `path` for reading through the cache. @category Data */
  static open(path: string, options: FileBlockCacheOptions = {}): FileBlockCache {
    checkPath(path, 'FileBlockCache.open: path');
    checkOptions(options, CACHE_OPTION_KEYS, 'FileBlockCache.open options');
    const blockBytes = checkInteger(options.blockBytes ?? DEFAULT_BLOCK_BYTES, 'FileBlockCache.open: blockBytes', 512, 1 << 30);
    const capacity = checkInteger(options.capacityBytes ?? DEFAULT_CACHE_BYTES, 'FileBlockCache.open: capacityBytes', blockBytes, Number.MAX_SAFE_INTEGER);
    let fd: number;
    try {
      fd = openSync(path, 'r');
    } catch (error) {
      throw new BackendUnavailableError(`FileBlockCache.open: cannot open ${path} (${(error as NodeJS.ErrnoException).code ?? describeValue(error)})`, { cause: error });
    }
    const stat = fstatSync(fd);
    if (!stat.isFile()) {
      closeSync(fd);
      throw new InvalidArgumentError(`FileBlockCache.open: ${path} is not a regular file`);
    }
    return new FileBlockCache(path, fd, stat.size, blockBytes, Math.floor(capacity / blockBytes));
  }

  /** Copies `length` bytes of the file from `offset` into `out` at `outOffset`. */
  read(offset: number, length: number, out: Uint8Array, outOffset = 0): void {
    if (this.fd === undefined) throw new DisposedError(`FileBlockCache(${this.path}) is closed`);
    checkInteger(offset, 'FileBlockCache.read: offset', 0, this.size);
    checkInteger(length, 'FileBlockCache.read: length', 0, this.size - offset);
    if (!(out instanceof Uint8Array)) throw new InvalidArgumentError(`FileBlockCache.read: out must be a Uint8Array, got ${describeValue(out)}`);
    checkInteger(outOffset, 'FileBlockCache.read: outOffset', 0, out.length);
    if (length > out.length - outOffset)
      throw new InvalidArgumentError(`FileBlockCache.read: ${length} bytes do not fit in out (${out.length} bytes) at ${outOffset}`);
    let done = 0;
    while (done < length) {
      const at = offset + done;
      const block = Math.floor(at / this.blockBytes);
      const within = at - block * this.blockBytes;
      const bytes = this.block(block);
      const n = Math.min(length - done, bytes.length - within);
      out.set(bytes.subarray(within, within + n), outOffset + done);
      done += n;
    }
  }

  /** What the cache has done so far. */
  stats(): FileBlockCacheStats {
    return { ...this.counts, blocks: this.blocks.size };
  }

  /** Closes the file and drops the blocks; idempotent. */
  close(): void {
    if (this.fd === undefined) return;
    closeSync(this.fd);
    this.fd = undefined;
    this.blocks.clear();
  }

  /** Block `n`'s bytes (the file's last block may be short), from memory or from the file. */
  private block(n: number): Buffer {
    const cached = this.blocks.get(n);
    if (cached !== undefined) {
      this.counts.hits++;
      this.blocks.delete(n);
      this.blocks.set(n, cached);
      return cached;
    }
    this.counts.misses++;
    let buffer: Buffer;
    if (this.blocks.size >= this.maxBlocks) {
      // Evict the least recently used block and take its buffer: no allocation after warm-up.
      const [oldest, reused] = this.blocks.entries().next().value as [number, Buffer];
      this.blocks.delete(oldest);
      // (a short last block is a view of a whole block's allocation: widen it back)
      buffer = Buffer.from(reused.buffer, reused.byteOffset, this.blockBytes);
    } else buffer = Buffer.allocUnsafe(this.blockBytes);
    const start = n * this.blockBytes;
    const want = Math.min(this.blockBytes, this.size - start);
    let got = 0;
    while (got < want) {
      const r = readSync(this.fd!, buffer, got, want - got, start + got);
      if (r === 0) throw new InvalidArgumentError(`FileBlockCache: ${this.path} ended at byte ${start + got}, before its size ${this.size} (it changed while open)`);
      got += r;
    }
    this.counts.bytesFromFile += want;
    const bytes = buffer.subarray(0, want);
    this.blocks.set(n, bytes);
    return bytes;
  }
}
