/**
 * The trainer's creation check that every rank built the same model: the same layout, tensor by
 * tensor in order (its shape; every tensor is fp32). Without it, two ranks whose models merely have
 * the same padded length ([4, 8] against [8, 4], or 10 against 12 elements) would average unrelated
 * elements and train on silently. Names are not compared, only reported: ranks may name the same
 * tensor differently (TensorFlow.js numbers its layers per model instance, so two ranks in one
 * process hold "dense_Dense1/kernel" and "dense_Dense3/kernel"), and equal layouts average right.
 *
 * Each rank contributes a fingerprint of its layout to an all-gather (on whatever buffers its
 * backend reduces; every word an integer exact in fp32). Ranks that agree cost that one small
 * collective. When they do not, every rank has seen the same gathered words and takes the same
 * two further all-gathers, so that every rank throws the same SizeMismatchError naming the first
 * tensor that differs and what each side holds there.
 */
import { SizeMismatchError } from '../errors.js';
import type { Communicator } from '../comm/communicator.js';
import { FlatBuffer, type ParamSet } from '../tensor.js';

/** @internal All ranks' contributions, concatenated in rank order; every rank passes the same length. */
export type GatherWords = (mine: Float32Array) => Promise<Float32Array>;

/** Characters of a tensor's description sent when the layouts differ. */
const DESCRIPTION_CHARS = 160;
/** Words of a 64-bit hash: four 16-bit halves of two 32-bit FNV-1a hashes. */
const HASH_WORDS = 4;

/** What the fingerprint compares of tensor `index`: its shape (or its absence). */
function tensorShape(params: ParamSet, index: number): string {
  const name = params.names[index];
  return name === undefined ? '-' : `[${params.layout(name).shape.join(', ')}]`;
}

/** Tensor `index` for the error message: its name and shape. */
function describeTensor(params: ParamSet, index: number): string {
  const name = params.names[index];
  if (name === undefined) return `nothing (its model has ${params.names.length} tensors)`;
  return `"${name}" ${tensorShape(params, index)}`;
}

function fnv1a(text: string, seed: number): number {
  let h = seed >>> 0;
  for (let i = 0; i < text.length; i++) {
    h ^= text.charCodeAt(i);
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h;
}

function hashWords(text: string): number[] {
  const a = fnv1a(text, 0x811c9dc5);
  const b = fnv1a(text, 0x01234567);
  return [a & 0xffff, a >>> 16, b & 0xffff, b >>> 16];
}

/** The layout's fingerprint: tensor count, length (two halves), hash of every shape in order. */
function summaryWords(params: ParamSet): number[] {
  const text = params.names.map((_, i) => tensorShape(params, i)).join(';');
  return [params.names.length, params.length % 4096, Math.floor(params.length / 4096), ...hashWords(text)];
}

/**
 * @internal Throws SizeMismatchError on every rank (the same one) unless every rank's ParamSet has rank 0's
 * tensors, names, shapes and order. A collective: every rank calls it.
 */
export async function checkSameLayout(params: ParamSet, size: number, gather: GatherWords, what: string): Promise<void> {
  const mine = summaryWords(params);
  const all = await gather(Float32Array.from(mine));
  const width = mine.length;
  const rankWords = (words: Float32Array, w: number, r: number): number[] => Array.from(words.subarray(r * w, (r + 1) * w));
  const differs = (words: Float32Array, w: number, r: number): boolean => rankWords(words, w, r).some((x, i) => x !== words[i]);
  if (!Array.from({ length: size }, (_, r) => differs(all, width, r)).some(Boolean)) return;

  // Which tensor differs first: every rank's per-tensor hashes, padded to the largest count.
  const counts = Array.from({ length: size }, (_, r) => all[r * width]!);
  const slots = Math.max(...counts) + 1; // one more: a model that is a prefix of another differs at its end
  const perTensor = new Float32Array(slots * HASH_WORDS).fill(-1);
  for (let i = 0; i < params.names.length; i++) perTensor.set(hashWords(tensorShape(params, i)), i * HASH_WORDS);
  const hashes = await gather(perTensor);
  const tensorDiffers = (i: number): boolean =>
    Array.from({ length: size }, (_, r) => r).some((r) =>
      Array.from({ length: HASH_WORDS }, (_, k) => k).some((k) => hashes[(r * slots + i) * HASH_WORDS + k] !== hashes[i * HASH_WORDS + k]),
    );
  let first = 0;
  while (first < slots - 1 && !tensorDiffers(first)) first++;

  // What each rank holds there, as text.
  const text = describeTensor(params, first).slice(0, DESCRIPTION_CHARS);
  const chars = new Float32Array(DESCRIPTION_CHARS);
  for (let i = 0; i < text.length; i++) chars[i] = text.charCodeAt(i);
  const descriptions = await gather(chars);
  const describe = (r: number): string =>
    String.fromCharCode(...Array.from(descriptions.subarray(r * DESCRIPTION_CHARS, (r + 1) * DESCRIPTION_CHARS)).filter((c) => c !== 0));
  const other = Array.from({ length: size }, (_, r) => r).find((r) => describe(r) !== describe(0)) ?? Array.from({ length: size }, (_, r) => r).find((r) => differs(all, width, r))!;
  const lengthOf = (r: number): number => all[r * width + 1]! + 4096 * all[r * width + 2]!;
  throw new SizeMismatchError(
    `${what}: the ranks built different models: tensor #${first} is ${describe(0)} on rank 0 but ${describe(other)} on rank ${other} ` +
      `(rank 0: ${counts[0]} tensors, ${lengthOf(0)} elements; rank ${other}: ${counts[other]} tensors, ${lengthOf(other)} elements); ` +
      'every rank must build the same model, with its tensors in the same order',
  );
}

/** @internal The gather of checkSameLayout over a host communicator (local, ucx). */
export async function gatherHostWords(comm: Communicator, words: Float32Array): Promise<Float32Array> {
  const mine = FlatBuffer.from(words);
  const all = FlatBuffer.allocate(words.length * comm.size);
  try {
    await comm.allgather(mine, all);
    return all.array.slice();
  } finally {
    mine.dispose();
    all.dispose();
  }
}
