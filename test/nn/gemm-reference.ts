/**
 * The plain triple loop the native SGEMM is checked against, in double precision, and the error
 * bound it is checked with.
 *
 * Tolerance per element: |c - ref| <= (k + 3) * 2^-23 * (|alpha| * sum_p |a_ip b_pj| + |beta c0|) + 1e-30.
 * That is twice the classic worst-case bound for an fp32 dot product of length k (gamma_k with
 * u = 2^-24) plus the roundings of the alpha/beta update; any order of summation, with or without
 * fused multiply-adds, stays inside it, and an indexing or transpose bug does not.
 */
import { sgemm } from '../../dist/nn/gemm.js';
import { FlatBuffer } from '../../dist/tensor.js';
import { fillUniform, rng } from '../helpers/random.js';

export interface GemmCase {
  m: number;
  n: number;
  k: number;
  transA: boolean;
  transB: boolean;
  alpha: number;
  beta: number;
}

/** Element (i, p) of op(A) where A is stored row-major (m x k, or k x m when transposed). */
function opAt(x: Float32Array, trans: boolean, rows: number, cols: number, i: number, j: number): number {
  return trans ? x[j * rows + i]! : x[i * cols + j]!;
}

/** Runs one case natively on seeded random data; returns the worst error as a ratio to the tolerance. */
export function checkGemmCase(c: GemmCase, seed: number): number {
  const next = rng(seed);
  const offset = 5; // views that do not start on a cache line
  const a = FlatBuffer.allocate(offset + c.m * c.k);
  const b = FlatBuffer.allocate(offset + c.k * c.n);
  const out = FlatBuffer.allocate(offset + c.m * c.n);
  try {
    const av = fillUniform(a.array.subarray(offset), next);
    const bv = fillUniform(b.array.subarray(offset), next);
    const cv = out.array.subarray(offset);
    // beta == 0 must not read C: NaN there would leak into the result.
    if (c.beta === 0) cv.fill(Number.NaN);
    else fillUniform(cv, next);
    const c0 = Float64Array.from(cv);
    sgemm({ ...c, a, aOffset: offset, b, bOffset: offset, c: out, cOffset: offset });
    let worst = 0;
    for (let i = 0; i < c.m; i++)
      for (let j = 0; j < c.n; j++) {
        let sum = 0;
        let abs = 0;
        for (let p = 0; p < c.k; p++) {
          const prod = opAt(av, c.transA, c.m, c.k, i, p) * opAt(bv, c.transB, c.k, c.n, p, j);
          sum += prod;
          abs += Math.abs(prod);
        }
        const prior = c.beta === 0 ? 0 : c.beta * c0[i * c.n + j]!;
        const ref = c.alpha * sum + prior;
        const tol = (c.k + 3) * 2 ** -23 * (Math.abs(c.alpha) * abs + Math.abs(prior)) + 1e-30;
        const ratio = Math.abs(cv[i * c.n + j]! - ref) / tol;
        if (!(ratio <= worst)) worst = Number.isNaN(ratio) ? Infinity : ratio;
      }
    // The padding in front of C is untouched.
    for (let i = 0; i < offset; i++) if (out.array[i] !== 0) worst = Infinity;
    return worst;
  } finally {
    a.dispose();
    b.dispose();
    out.dispose();
  }
}

const ODD = [1, 7, 33, 65, 129];

/** Odd sizes mixed, every transpose combination, two alpha/beta pairs; plus shapes that cross the
 * kernel's k block (256), n block (1024) and the threshold above which the thread pool splits C
 * by rows or by columns. */
export function gemmCases(): GemmCase[] {
  const shapes: Array<[number, number, number]> = [];
  for (let i = 0; i < ODD.length; i++)
    for (let j = 0; j < ODD.length; j++) shapes.push([ODD[i]!, ODD[j]!, ODD[(i + 2 * j) % ODD.length]!]);
  shapes.push([129, 65, 300], [7, 1100, 33], [65, 129, 129], [300, 33, 65], [1, 129, 129]);
  const cases: GemmCase[] = [];
  let flip = 0;
  for (const [m, n, k] of shapes)
    for (const transA of [false, true])
      for (const transB of [false, true]) {
        const [alpha, beta] = flip++ % 2 === 0 ? [1, 0] : [0.75, -1.5];
        cases.push({ m, n, k, transA, transB, alpha, beta });
      }
  return cases;
}
