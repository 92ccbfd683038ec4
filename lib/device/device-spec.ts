/**
 * Device strings: `cpu`, and `cuda:N` (`cuda` alone is `cuda:0`) for the memory of one CUDA device.
 */
import { InvalidArgumentError } from '../errors.js';
import { describeValue } from '../validate.js';

/** A CUDA device: `cuda:N`, or `cuda` for `cuda:0`. @category Tensors and memory */
export type CudaDevice = 'cuda' | `cuda:${number}`;

/** Highest device index accepted (the addon's limit). */
const MAX_DEVICE_INDEX = 1023;

/** Parses `cpu` or `cuda:N` (`cuda` alone is `cuda:0`). @category Backends */
export function parseDevice(spec: string): { kind: 'cpu' } | { kind: 'cuda'; index: number } {
  if (spec === 'cpu') return { kind: 'cpu' };
  const m = /^cuda(?::(\d{1,4}))?$/.exec(spec);
  if (!m) throw new InvalidArgumentError(`device must be "cpu" or "cuda:N", not ${describeValue(spec)}`);
  return { kind: 'cuda', index: m[1] === undefined ? 0 : Number(m[1]) };
}

/** The index N of a `cuda:N` string; InvalidArgumentError for anything else (`cpu` included). @category Tensors and memory */
export function cudaDeviceIndex(device: unknown, whatArg: string = 'device'): number {
  const what = typeof whatArg === 'string' ? whatArg : 'device';
  if (typeof device !== 'string') throw new InvalidArgumentError(`${what} must be a string like "cuda:0", got ${typeof device}`);
  const parsed = parseDevice(device);
  if (parsed.kind !== 'cuda')
    throw new InvalidArgumentError(`${what} must be a CUDA device ("cuda:N"); host memory is a FlatBuffer, not a DeviceBuffer`);
  if (parsed.index > MAX_DEVICE_INDEX) throw new InvalidArgumentError(`${what}: device index ${parsed.index} is above ${MAX_DEVICE_INDEX}`);
  return parsed.index;
}
