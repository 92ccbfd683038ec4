/**
 * Every model operation (lib/nn/ops.ts) run once at odd sizes in one memory (`cpu` or `cuda:N`),
 * from the same seeded inputs, with the outputs copied back: the CPU table is checked against
 * test/reference/nn-ops.ts with these (test/nn/ops.test.ts), the CUDA table against the CPU table
 * (test/cuda/model-ops.test.ts).
 */
import { sgemm } from '../../dist/nn/gemm.js';
import { biasAdd, biasGrad, modelDevice, relu, reluGrad, softmaxXent, type Device, type Tensor } from '../../dist/nn/ops.js';
import { fillNormal, rng } from './random.js';

export interface GemmCase {
  transA: boolean;
  transB: boolean;
  m: number;
  n: number;
  k: number;
  alpha: number;
  beta: number;
}

/** The four transpose combinations at odd sizes, overwriting and accumulating into C, a wide one, and an empty product (k = 0: C = beta C). */
export const gemmCases: GemmCase[] = [
  ...[false, true].flatMap((transA) =>
    [false, true].flatMap((transB) => [
      { transA, transB, m: 37, n: 29, k: 53, alpha: 1, beta: 0 },
      { transA, transB, m: 5, n: 131, k: 17, alpha: 1.5, beta: 0.5 },
    ]),
  ),
  { transA: true, transB: false, m: 10, n: 785, k: 67, alpha: 1, beta: 1 },
  { transA: false, transB: true, m: 3, n: 7, k: 0, alpha: 1, beta: 0.5 },
];

export interface SoftmaxCase {
  rows: number;
  classes: number;
}
/** A few classes (fewer than a warp), many classes (several passes of a warp), one class. */
export const softmaxCases: SoftmaxCase[] = [
  { rows: 37, classes: 11 },
  { rows: 9, classes: 1003 },
  { rows: 4, classes: 1 },
];

export const random = (n: number, seed: number, scale = 1): Float32Array => fillNormal(new Float32Array(n), rng(seed), scale);

/** Labels of `rows` rows: class numbers, except row 2 which holds one that is not (3.5, or -1 with one class). */
export function labelsFor(rows: number, classes: number, seed: number): Float32Array {
  const next = rng(seed);
  const labels = Float32Array.from({ length: rows }, () => Math.floor(next() * classes));
  if (rows > 2) labels[2] = classes > 3 ? 3.5 : -1;
  return labels;
}

/** Inputs with NaN, negative zero and infinities among ordinary values, for ReLU. */
export function reluInput(n: number, seed: number): Float32Array {
  const x = random(n, seed);
  x[0] = Number.NaN;
  x[1] = -0;
  x[2] = Number.POSITIVE_INFINITY;
  x[3] = Number.NEGATIVE_INFINITY;
  return x;
}

export interface OpOutputs {
  gemm: Float32Array[];
  biasAdd: Float32Array;
  biasGrad: Float32Array;
  biasGradAccumulated: Float32Array;
  relu: Float32Array;
  reluInPlace: Float32Array;
  reluGrad: Float32Array;
  softmax: { losses: Float32Array; dlogits: Float32Array; correct: Float32Array; inPlace: Float32Array }[];
}

/** Runs every operation in `device`'s memory, each operand at an odd offset inside a larger buffer. */
export function runOps(device: Device): OpOutputs {
  const memory = modelDevice(device);
  const made: Tensor[] = [];
  // A tensor holding `values` from offset 3 (so no operand starts at a 16-byte boundary).
  const at = 3;
  const put = (values: Float32Array): Tensor => {
    const t = memory.allocate(values.length + at + 5);
    made.push(t);
    memory.write(t, values, at);
    return t;
  };
  const get = (t: Tensor, n: number): Float32Array => memory.read(t, n, at);
  try {
    const gemm = gemmCases.map((g, i) => {
      const a = put(random(g.m * g.k, 10 + i));
      const b = put(random(g.k * g.n, 20 + i));
      const c = put(random(g.m * g.n, 30 + i));
      sgemm({ ...g, a, aOffset: at, b, bOffset: at, c, cOffset: at });
      return get(c, g.m * g.n);
    });
    const [rows, cols] = [33, 19];
    const y = put(random(rows * cols, 40));
    biasAdd({ buffer: y, offset: at }, { buffer: put(random(cols, 41)), offset: at }, rows, cols);
    const dy = put(random(rows * cols, 42));
    const db = put(random(cols, 43));
    biasGrad({ buffer: db, offset: at }, { buffer: dy, offset: at }, rows, cols, false);
    const biasGradOut = get(db, cols);
    const db2 = put(random(cols, 43));
    biasGrad({ buffer: db2, offset: at }, { buffer: dy, offset: at }, rows, cols, true);
    const n = 1001;
    const x = put(reluInput(n, 44));
    const ry = put(new Float32Array(n));
    relu({ buffer: ry, offset: at }, { buffer: x, offset: at }, n);
    const inPlace = put(reluInput(n, 44));
    relu({ buffer: inPlace, offset: at }, { buffer: inPlace, offset: at }, n);
    const g = put(random(n, 45));
    reluGrad({ buffer: g, offset: at }, { buffer: ry, offset: at }, { buffer: g, offset: at }, n);
    const softmax = softmaxCases.map(({ rows: r, classes }, i) => {
      const logits = random(r * classes, 50 + i, 4);
      const labels = put(labelsFor(r, classes, 60 + i));
      const z = put(logits);
      const losses = put(new Float32Array(r));
      const dlogits = put(new Float32Array(r * classes));
      const correct = put(new Float32Array(r));
      softmaxXent({ buffer: z, offset: at }, { buffer: labels, offset: at }, r, classes, 1 / r, {
        losses: { buffer: losses, offset: at },
        dlogits: { buffer: dlogits, offset: at },
        correct: { buffer: correct, offset: at },
      });
      // The gradient written over the logits it is computed from.
      const z2 = put(logits);
      softmaxXent({ buffer: z2, offset: at }, { buffer: labels, offset: at }, r, classes, 1 / r, {
        losses: { buffer: losses, offset: at },
        dlogits: { buffer: z2, offset: at },
      });
      return { losses: get(losses, r), dlogits: get(dlogits, r * classes), correct: get(correct, r), inPlace: get(z2, r * classes) };
    });
    return {
      gemm,
      biasAdd: get(y, rows * cols),
      biasGrad: biasGradOut,
      biasGradAccumulated: get(db2, cols),
      relu: get(ry, n),
      reluInPlace: get(inPlace, n),
      reluGrad: get(g, n),
      softmax,
    };
  } finally {
    for (const t of made) t.dispose();
  }
}
