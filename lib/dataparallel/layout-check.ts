/**
 * The trainer's creation check that every rank built the same ParamSet: each rank's length is
 * all-gathered (on whatever buffers its backend reduces) and compared here. A mismatch would fail,
 * or worse pair the wrong elements, deep inside a later step. Lengths travel as two 12-bit/20-bit
 * halves, each exact in fp32.
 */
import { SizeMismatchError } from '../errors.js';

/** @internal This rank's length as the two floats it contributes to the all-gather. */
export function lengthWords(length: number): Float32Array {
  return new Float32Array([length % 4096, Math.floor(length / 4096)]);
}

/** @internal Throws SizeMismatchError unless every rank's gathered length equals rank 0's. */
export function checkGatheredLengths(gathered: Float32Array, size: number): void {
  const lengths = Array.from({ length: size }, (_, r) => gathered[2 * r]! + 4096 * gathered[2 * r + 1]!);
  const odd = lengths.findIndex((l) => l !== lengths[0]);
  if (odd >= 0)
    throw new SizeMismatchError(
      `DataParallelTrainer: the ranks' ParamSets differ in size (rank 0: ${lengths[0]} elements, rank ${odd}: ${lengths[odd]}); every rank must build the same model`,
    );
}
