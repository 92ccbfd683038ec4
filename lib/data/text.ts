/**
 * Real English text for a byte-level language model: the `fortunes` collection of Debian's
 * `fortunes` package (about 2.5 MB in /usr/share/games/fortunes: quotations, jokes, verse and
 * literature, in main under a free licence). Chosen because it is prose and verse written by
 * people, small enough that a CPU trains a GPT on it in minutes, and installable anywhere Debian
 * is, with nothing downloaded at run time. Its offensive subset (`off/`, a separate package) is not
 * read.
 */
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';

import { BackendUnavailableError, InvalidArgumentError } from '../errors.js';
import { checkInteger, checkNumber, checkOptions, describeValue, optionKeys } from '../validate.js';
import { tokenSource } from './loader.js';

/** Where Debian's `fortunes` package puts the collection. @category Data */
export const FORTUNES_DIR = '/usr/share/games/fortunes';

/** @category Data */
export interface TextCorpusOptions {
  /** The folder of the text files. Default {@link FORTUNES_DIR}. */
  dir?: string;
  /** The files to read, by name; default every text file of the folder (not the `.dat` indexes or `.u8` links), sorted. */
  files?: string[];
}
const OPTION_KEYS = optionKeys<TextCorpusOptions>({ dir: true, files: true });

/** A corpus: its bytes (the tokens of a byte-level model) and the files they came from, in order. @category Data */
export interface TextCorpus {
  readonly bytes: Uint8Array;
  readonly files: readonly string[];
}

/** Reads a folder of text files as one byte sequence, the files joined in order. @category Data */
export function loadTextCorpus(options: TextCorpusOptions = {}): TextCorpus {
  checkOptions(options, OPTION_KEYS, 'loadTextCorpus options');
  const dir = options.dir ?? FORTUNES_DIR;
  if (typeof dir !== 'string' || dir === '') throw new InvalidArgumentError(`loadTextCorpus: dir must be a folder path, got ${describeValue(dir)}`);
  let names: string[];
  try {
    names = options.files ?? readdirSync(dir).filter((n) => !/\.(dat|u8)$/.test(n) && statSync(join(dir, n)).isFile()).sort();
  } catch (error) {
    throw new BackendUnavailableError(
      `loadTextCorpus: cannot list ${dir} (${(error as NodeJS.ErrnoException).code ?? describeValue(error)}); install Debian's fortunes package (\`apt-get install fortunes\`) or pass dir`,
      { cause: error },
    );
  }
  if (!Array.isArray(names) || names.length === 0 || !names.every((n) => typeof n === 'string' && n !== '' && !n.includes('/') && !n.includes('\0')))
    throw new InvalidArgumentError(`loadTextCorpus: files must be a non-empty list of file names in ${dir}, got ${describeValue(names)}`);
  const parts = names.map((n) => {
    try {
      return readFileSync(join(dir, n));
    } catch (error) {
      throw new BackendUnavailableError(`loadTextCorpus: cannot read ${join(dir, n)} (${(error as NodeJS.ErrnoException).code ?? describeValue(error)})`, { cause: error });
    }
  });
  return { bytes: new Uint8Array(Buffer.concat(parts)), files: names };
}

/** The corpus cut in two at `validationFraction` from the end: training text first, validation text last (no window spans both). @category Data */
export function splitText(bytes: Uint8Array, validationFraction = 0.1): { train: Uint8Array; validation: Uint8Array } {
  if (!(bytes instanceof Uint8Array)) throw new InvalidArgumentError(`splitText: bytes must be a Uint8Array, got ${describeValue(bytes)}`);
  checkNumber(validationFraction, 'splitText: validationFraction', 0, 1, { loOpen: true, hiOpen: true });
  const cut = bytes.length - Math.round(bytes.length * validationFraction);
  return { train: bytes.subarray(0, cut), validation: bytes.subarray(cut) };
}

/** The windows of {@link textWindows}: samples of `context` token ids and their `context` next tokens. @category Data */
export interface TextWindows {
  /** Token ids as floats, row-major [count, context] (an embedding layer's input). */
  readonly inputs: Float32Array;
  /** The next token of every position, [count, context]: `context` class indices per sample. */
  readonly labels: Uint8Array;
  readonly count: number;
  /** Tokens per window. */
  readonly features: number;
  /** The vocabulary: 256 byte values. */
  readonly classes: number;
}

/**
 * A byte text as samples for a language model: windows of `context` bytes one after another
 * (stride `context`), each with the byte after every position as its labels, so a pipeline's or a
 * trainer's cross-entropy over `context` rows per sample is the per-token loss. With `most`, that
 * many windows spread evenly over the text (a validation set of bounded size).
 *
 * @category Data
 */
export function textWindows(bytes: Uint8Array, context: number, most: number = Number.MAX_SAFE_INTEGER): TextWindows {
  if (!(bytes instanceof Uint8Array)) throw new InvalidArgumentError(`textWindows: bytes must be a Uint8Array, got ${describeValue(bytes)}`);
  checkInteger(context, 'textWindows: context', 1, 1 << 20);
  checkInteger(most, 'textWindows: most', 1, Number.MAX_SAFE_INTEGER);
  if (bytes.length < context + 1) throw new InvalidArgumentError(`textWindows: ${bytes.length} bytes make no window of ${context} and their next bytes; give at least ${context + 1}`);
  // The windows are tokenSource's at stride `context`; `most` of them picked evenly.
  const source = tokenSource(bytes, { context });
  const count = Math.min(source.count, most);
  const inputs = new Float32Array(count * context);
  const targets = new Float32Array(count * context);
  for (let i = 0; i < count; i++) source.read(Math.floor((i * source.count) / count), inputs, i * context, targets, i * context);
  return { inputs, labels: Uint8Array.from(targets), count, features: context, classes: 256 };
}
