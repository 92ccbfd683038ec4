/**
 * Copies a child's output stream to a shared destination with a prefix on every line, so the
 * interleaved output of many ranks stays readable. Lines are split on bytes, never decoded, so
 * multi-byte characters survive being cut across chunks.
 */
import type { Readable, Writable } from 'node:stream';

const NEWLINE = 0x0a;

/** Destinations are shared by all ranks; this tracks which sources wait for one to drain. */
const stalled = new WeakMap<Writable, Set<Readable>>();

function write(out: Writable, data: Buffer, source: Readable): void {
  if (out.write(data)) return;
  // Honour backpressure: a rank that prints faster than the terminal reads waits, rather than
  // filling this process's memory.
  let sources = stalled.get(out);
  if (sources === undefined) {
    const waiting = new Set<Readable>();
    sources = waiting;
    stalled.set(out, waiting);
    out.once('drain', () => {
      stalled.delete(out);
      for (const s of waiting) s.resume();
    });
  }
  sources.add(source);
  source.pause();
}

/**
 * Pipes `source` into `out`, each line prefixed with `prefix`. A last line without a newline is
 * completed with one when `source` ends. Resolves when `source` has ended.
 *
 * @category Launch
 */
export function pipeWithPrefix(source: Readable, out: Writable, prefix: string): Promise<void> {
  const head = Buffer.from(prefix, 'utf8');
  let partial: Buffer[] = [];
  return new Promise((resolve) => {
    source.on('data', (chunk: Buffer) => {
      let start = 0;
      const pieces: Buffer[] = [];
      for (let nl = chunk.indexOf(NEWLINE); nl !== -1; nl = chunk.indexOf(NEWLINE, start)) {
        pieces.push(head, ...partial, chunk.subarray(start, nl + 1));
        partial = [];
        start = nl + 1;
      }
      if (start < chunk.length) partial.push(chunk.subarray(start));
      if (pieces.length > 0) write(out, Buffer.concat(pieces), source);
    });
    let finished = false;
    const finish = (): void => {
      if (finished) return;
      finished = true;
      if (partial.length > 0) out.write(Buffer.concat([head, ...partial, Buffer.from('\n')]));
      partial = [];
      resolve();
    };
    source.once('end', finish);
    source.once('error', finish);
    // A stream destroyed without ending (its process never started) only closes.
    source.once('close', finish);
  });
}
