/**
 * Argument checks shared by every public entry: they throw {@link InvalidArgumentError} with a
 * message that names the argument, shows what was passed (any value, formatted safely) and says
 * what is expected. One source for these, so that every entry speaks alike.
 */
import { InvalidArgumentError } from './errors.js';

const MAX_SHOWN = 60;

function truncate(text: string): string {
  return text.length > MAX_SHOWN ? `${text.slice(0, MAX_SHOWN - 3)}...` : text;
}

/**
 * A short description of any value for an error message. Never throws: BigInts, Symbols,
 * null-prototype objects, cyclic objects and throwing getters are all described.
 * @category Validation
 */
export function describeValue(value: unknown): string {
  try {
    switch (typeof value) {
      case 'undefined':
        return 'undefined';
      case 'number':
        return Object.is(value, -0) ? '-0' : String(value);
      case 'boolean':
        return String(value);
      case 'bigint':
        return `the BigInt ${truncate(value.toString())}n`;
      case 'string':
        return `the string ${truncate(JSON.stringify(value))}`;
      case 'symbol':
        return `a Symbol(${truncate(value.description ?? '')})`;
      case 'function':
        return value.name ? `a function ${truncate(value.name)}` : 'a function';
      default:
        break;
    }
    if (value === null) return 'null';
    if (Array.isArray(value)) return `an array of length ${value.length}`;
    if (ArrayBuffer.isView(value)) {
      const name = Object.getPrototypeOf(value)?.constructor?.name ?? 'typed array';
      return `a ${name} of length ${(value as unknown as { length?: number }).length ?? value.byteLength}`;
    }
    const ctor = Object.getPrototypeOf(value)?.constructor?.name;
    if (ctor && ctor !== 'Object') return `an instance of ${truncate(ctor)}`;
    const keys = Object.keys(value as object);
    return keys.length === 0 ? 'an empty object' : `an object with keys ${truncate(keys.join(', '))}`;
  } catch {
    return 'an unprintable value';
  }
}

/**
 * The name of the value checked, for a message. These checks are public (`sapipe/validate`), so
 * their own arguments are untrusted: a label that is not a string is described, never thrown on.
 * Only the failing path pays for it.
 */
function label(what: unknown): string {
  return typeof what === 'string' ? what : describeValue(what);
}

/** A list of strings given to a check (allowed values, known keys); anything else is refused. */
function checkStringList(list: unknown, what: string): readonly string[] {
  if (!Array.isArray(list) || !list.every((item) => typeof item === 'string'))
    throw new InvalidArgumentError(`${what} must be an array of strings, got ${describeValue(list)}`);
  return list;
}

/** The bounds given to checkNumber or checkInteger: numbers (checked before they are compared with). */
function checkBounds(lo: unknown, hi: unknown, fn: string): void {
  if (typeof lo !== 'number' || typeof hi !== 'number' || Number.isNaN(lo) || Number.isNaN(hi))
    throw new InvalidArgumentError(`${fn}: lo and hi must be numbers, got ${describeValue(lo)} and ${describeValue(hi)}`);
}

/** How a number's type went wrong, with a hint where the fix is obvious. */
function notANumber(value: unknown, what: string, expected: string): InvalidArgumentError {
  let hint = '';
  if (typeof value === 'string' && value.trim() !== '' && Number.isFinite(Number(value)))
    hint = ` (pass the number ${Number(value)}, not a string)`;
  else if (typeof value === 'bigint') hint = ' (pass a Number, not a BigInt)';
  return new InvalidArgumentError(`${label(what)} must be ${expected}, got ${describeValue(value)}${hint}`);
}

function rangeText(lo: number, hi: number, loOpen: boolean, hiOpen: boolean): string {
  const unboundedAbove = hi >= Number.MAX_SAFE_INTEGER;
  const unboundedBelow = lo <= -Number.MAX_VALUE;
  if (unboundedAbove && unboundedBelow) return 'finite';
  if (unboundedAbove) return `${loOpen ? '>' : '>='} ${lo}`;
  if (unboundedBelow) return `${hiOpen ? '<' : '<='} ${hi}`;
  return `in ${loOpen ? '(' : '['}${lo}, ${hi}${hiOpen ? ')' : ']'}`;
}

/** A finite number in [lo, hi] (either end open on request); `hi = Number.MAX_VALUE` means no upper bound. @category Validation */
export function checkNumber(
  value: unknown,
  what: string,
  lo: number,
  hi: number,
  options: { loOpen?: boolean; hiOpen?: boolean } = {},
): number {
  checkBounds(lo, hi, 'checkNumber');
  const opts = typeof options === 'object' && options !== null ? options : {};
  if (typeof value !== 'number' || !Number.isFinite(value)) throw notANumber(value, what, 'a finite number');
  const tooLow = opts.loOpen ? value <= lo : value < lo;
  const tooHigh = opts.hiOpen ? value >= hi : value > hi;
  if (tooLow || tooHigh)
    throw new InvalidArgumentError(`${label(what)} must be ${rangeText(lo, hi, !!opts.loOpen, !!opts.hiOpen)}, got ${describeValue(value)}`);
  return value;
}

/** An integer in [lo, hi]. @category Validation */
export function checkInteger(value: unknown, what: string, lo: number, hi: number): number {
  checkBounds(lo, hi, 'checkInteger');
  if (typeof value !== 'number' || !Number.isFinite(value)) throw notANumber(value, what, 'an integer');
  if (!Number.isInteger(value) || value < lo || value > hi)
    throw new InvalidArgumentError(`${label(what)} must be an integer ${rangeText(lo, hi, false, false)}, got ${describeValue(value)}`);
  return value;
}

/** A plain options object (not null, not an array). @category Validation */
export function checkObject(value: unknown, what: string): asserts value is Record<string, unknown> {
  if (typeof value !== 'object' || value === null || Array.isArray(value))
    throw new InvalidArgumentError(`${label(what)} must be an object, got ${describeValue(value)}`);
}

/** A boolean. @category Validation */
export function checkBoolean(value: unknown, what: string): boolean {
  if (typeof value !== 'boolean') throw new InvalidArgumentError(`${label(what)} must be true or false, got ${describeValue(value)}`);
  return value;
}

/** A Float32Array (a tensor view, or plain JavaScript memory). @category Validation */
export function checkFloat32Array(value: unknown, what: string): Float32Array {
  if (!(value instanceof Float32Array)) throw new InvalidArgumentError(`${label(what)} must be a Float32Array, got ${describeValue(value)}`);
  return value;
}

/** An array or typed array (anything with an integer length and indexed elements). @category Validation */
export function checkArrayLike(value: unknown, what: string): ArrayLike<unknown> {
  if (!Array.isArray(value) && !(ArrayBuffer.isView(value) && !(value instanceof DataView)))
    throw new InvalidArgumentError(`${label(what)} must be an array or a typed array, got ${describeValue(value)}`);
  return value as ArrayLike<unknown>;
}

/** A function. @category Validation */
export function checkFunction(value: unknown, what: string): (...args: never[]) => unknown {
  if (typeof value !== 'function') throw new InvalidArgumentError(`${label(what)} must be a function, got ${describeValue(value)}`);
  return value as (...args: never[]) => unknown;
}

/** One of a fixed list of strings. @category Validation */
export function checkOneOf<T extends string>(value: unknown, what: string, allowed: readonly T[]): T {
  if (typeof value !== 'string' || !Array.isArray(allowed) || !allowed.includes(value)) {
    const list = checkStringList(allowed, 'checkOneOf: allowed');
    throw new InvalidArgumentError(`${label(what)} must be one of ${list.map((a) => `'${a}'`).join(', ')}, got ${describeValue(value)}`);
  }
  return value as T;
}

/** Spellings users bring from other libraries, mapped to sapipe's option names. */
const KNOWN_ALIASES: Readonly<Record<string, string>> = {
  beta1: 'betas',
  beta2: 'betas',
  beta_1: 'betas',
  beta_2: 'betas',
  learning_rate: 'lr',
  learningRate: 'lr',
  epsilon: 'eps',
  grad_scale: 'gradScale',
  timeout: 'timeoutMs',
  timeout_ms: 'timeoutMs',
};

function normalized(key: string): string {
  return key.toLowerCase().replace(/[_\-\s]/g, '');
}

function editDistance(a: string, b: string): number {
  const row = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    let diagonal = row[0]!;
    row[0] = i;
    for (let j = 1; j <= b.length; j++) {
      const above = row[j]!;
      row[j] = Math.min(row[j]! + 1, row[j - 1]! + 1, diagonal + (a[i - 1] === b[j - 1] ? 0 : 1));
      diagonal = above;
    }
  }
  return row[b.length]!;
}

/** The allowed key a mistyped one most likely meant, if any is close. @category Validation */
export function closestKey(key: string, allowed: readonly string[]): string | undefined {
  checkStringList(allowed, 'closestKey: allowed');
  if (typeof key !== 'string') throw new InvalidArgumentError(`closestKey: key must be a string, got ${describeValue(key)}`);
  const alias = KNOWN_ALIASES[key];
  if (alias !== undefined && allowed.includes(alias)) return alias;
  const n = normalized(key);
  const sameLetters = allowed.find((a) => normalized(a) === n);
  if (sameLetters !== undefined) return sameLetters;
  // A shortened or lengthened name: `base` for `baseLr`, `timeoutMsec` for `timeoutMs`.
  const prefix = n.length >= 3 ? allowed.find((a) => normalized(a).startsWith(n) || n.startsWith(normalized(a))) : undefined;
  if (prefix !== undefined) return prefix;
  let best: string | undefined;
  let bestDistance = Infinity;
  for (const a of allowed) {
    const d = editDistance(n, normalized(a));
    if (d < bestDistance) {
      best = a;
      bestDistance = d;
    }
  }
  return best !== undefined && bestDistance <= Math.max(1, Math.floor(Math.min(n.length, best.length) / 3)) ? best : undefined;
}

/**
 * Rejects keys of an options object that the entry does not know, naming the key and, where one
 * is close, the intended one (`weight_decay` -> `weightDecay`, `beta1` -> `betas`). A misspelled
 * option must never be silently ignored.
 * @category Validation
 */
export function checkKnownKeys(value: object, allowed: readonly string[], what: string): void {
  if (typeof value !== 'object' || value === null) throw new InvalidArgumentError(`${label(what)} must be an object, got ${describeValue(value)}`);
  checkStringList(allowed, 'checkKnownKeys: allowed');
  for (const key of Reflect.ownKeys(value)) {
    if (typeof key === 'string' && allowed.includes(key)) continue;
    const name = typeof key === 'string' ? key : describeValue(key);
    const guess = typeof key === 'string' ? closestKey(key, allowed) : undefined;
    throw new InvalidArgumentError(
      `${label(what)}: unknown option '${name}'${guess ? `; did you mean '${guess}'?` : ''} (known: ${allowed.join(', ')})`,
    );
  }
}

/**
 * The option names of an options type, as a list for {@link checkKnownKeys}. Written as an object
 * with every key of `T` set to true, so the compiler keeps the list equal to the type: a field
 * added to the interface and not here, or listed here and not there, fails to compile.
 * @category Validation
 */
export function optionKeys<T>(keys: { readonly [K in keyof Required<T>]: true }): readonly string[] {
  checkObject(keys, 'optionKeys: keys');
  return Object.freeze(Object.keys(keys));
}

/** checkObject then checkKnownKeys: the usual first line of an options resolver. @category Validation */
export function checkOptions<T>(value: T, allowed: readonly string[], what: string): asserts value is T & object {
  checkObject(value, what);
  checkKnownKeys(value, allowed, what);
}
