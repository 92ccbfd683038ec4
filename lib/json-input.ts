/** Inputs that may be given as an object or as its JSON text (profiles read from files or flags). */
import { InvalidArgumentError } from './errors.js';

/** @internal `input` itself, or the value its JSON text describes when it is a string. */
export function fromJsonText(input: unknown, what: string): unknown {
  if (typeof input !== 'string') return input;
  try {
    return JSON.parse(input) as unknown;
  } catch (error) {
    throw new InvalidArgumentError(`${what} is not valid JSON: ${(error as Error).message}`, { cause: error });
  }
}
