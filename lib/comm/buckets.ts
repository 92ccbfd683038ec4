/**
 * How a flat gradient is cut into buckets for the fused all-reduce (host and device backends
 * alike): a small first bucket, so the first update starts early, then equal ones, every boundary
 * on a cache line.
 */
import { InvalidArgumentError } from '../errors.js';
import { ALIGN_ELEMENTS } from '../tensor.js';
import { checkInteger, describeValue } from '../validate.js';

/** @category Communication */
export const DEFAULT_BUCKET_BYTES = 25 * 1024 * 1024;
/** @category Communication */
export const DEFAULT_FIRST_BUCKET_BYTES = 1024 * 1024;
/** [offset, count] of each bucket over `length` floats; every boundary on a cache line. @category Communication */
export function bucketRanges(length: number, bucketBytes = DEFAULT_BUCKET_BYTES, firstBucketBytes = DEFAULT_FIRST_BUCKET_BYTES): [number, number][] {
  checkInteger(length, 'bucketRanges(length): length', 0, Number.MAX_SAFE_INTEGER);
  for (const [v, what] of [[bucketBytes, 'bucketBytes'], [firstBucketBytes, 'firstBucketBytes']] as const)
    if (typeof v !== 'number' || !Number.isInteger(v) || v < 64 || v > Number.MAX_SAFE_INTEGER) throw new InvalidArgumentError(`${what} must be an integer of at least 64 bytes, got ${describeValue(v)}`);
  const toElements = (bytes: number): number => Math.max(ALIGN_ELEMENTS, Math.floor(bytes / 4 / ALIGN_ELEMENTS) * ALIGN_ELEMENTS);
  if (length / toElements(bucketBytes) > 1 << 24)
    throw new InvalidArgumentError(`bucketRanges: ${length} floats in buckets of ${bucketBytes} bytes make more than 2^24 buckets; use larger buckets`);
  const ranges: [number, number][] = [];
  let offset = 0;
  let size = toElements(firstBucketBytes);
  while (offset < length) {
    const count = Math.min(size, length - offset);
    ranges.push([offset, count]);
    offset += count;
    size = toElements(bucketBytes);
  }
  return ranges;
}
