/** A stream that hands each chunk written to it to `append` as text: a launched job's stdout or stderr, collected. */
import { Writable } from 'node:stream';

export function textSink(append: (s: string) => void): Writable {
  return new Writable({
    write(chunk: Buffer, _encoding, callback): void {
      append(chunk.toString());
      callback();
    },
  });
}
