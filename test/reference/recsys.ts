/**
 * Plain-TypeScript references for the recommendation model's pieces: whole (unsharded) embedding
 * tables trained with SGD, the updates applied in the order the sharded ones are (rank, sample,
 * table), and the ROC AUC by counting every positive-negative pair.
 */
import { seededRandom } from '../../dist/data/seeded-random.js';

/** Whole tables with the initial rows ShardedEmbedding draws (one stream per table, row by row). */
export function referenceTables(tables: readonly number[], dim: number, seed: number, scale = 0.05): Float32Array[] {
  return tables.map((rows, t) => {
    const next = seededRandom(seed * 65536 + t);
    return Float32Array.from({ length: rows * dim }, () => (2 * next() - 1) * scale);
  });
}

/** The vectors of one batch: indices [batch, T] to [batch, T, dim]. */
export function referenceLookup(tables: readonly Float32Array[], dim: number, indices: Int32Array): Float32Array {
  const T = tables.length;
  const out = new Float32Array(indices.length * dim);
  for (let i = 0; i < indices.length; i++) out.set(tables[i % T]!.subarray(indices[i]! * dim, (indices[i]! + 1) * dim), i * dim);
  return out;
}

/** SGD on the rows of every rank's batch, rank by rank, sample by sample, table by table (each update computed in double, stored as fp32). */
export function referenceSgd(tables: Float32Array[], dim: number, indicesPerRank: readonly Int32Array[], gradsPerRank: readonly Float32Array[], lr: number): void {
  const T = tables.length;
  indicesPerRank.forEach((indices, r) => {
    const g = gradsPerRank[r]!;
    for (let i = 0; i < indices.length; i++) {
      const w = tables[i % T]!;
      const at = indices[i]! * dim;
      for (let j = 0; j < dim; j++) w[at + j] = Math.fround(w[at + j]! - lr * g[i * dim + j]!);
    }
  });
}

/** AUC by definition: the share of (positive, negative) pairs ordered right, ties one half. */
export function referenceAuc(scores: ArrayLike<number>, labels: ArrayLike<number>): number {
  let good = 0;
  let pairs = 0;
  for (let i = 0; i < scores.length; i++) {
    if (labels[i] !== 1) continue;
    for (let j = 0; j < scores.length; j++) {
      if (labels[j] !== 0) continue;
      pairs++;
      if (scores[i]! > scores[j]!) good++;
      else if (scores[i] === scores[j]) good += 0.5;
    }
  }
  return good / pairs;
}
