/**
 * The model operations (native/include/sapipe/nn.h) written out plainly in double precision: what
 * the CPU table and the CUDA table are both checked against.
 */

/** C = alpha op(A) op(B) + beta C, row-major, returned as a new array (C's old values read when beta != 0). */
export function gemmReference(
  o: { transA: boolean; transB: boolean; m: number; n: number; k: number; alpha: number; beta: number },
  a: ArrayLike<number>,
  b: ArrayLike<number>,
  c: ArrayLike<number>,
): Float64Array {
  const out = new Float64Array(o.m * o.n);
  for (let i = 0; i < o.m; i++)
    for (let j = 0; j < o.n; j++) {
      let s = 0;
      for (let p = 0; p < o.k; p++) {
        const av = o.transA ? a[p * o.m + i]! : a[i * o.k + p]!;
        const bv = o.transB ? b[j * o.k + p]! : b[p * o.n + j]!;
        s += av * bv;
      }
      out[i * o.n + j] = o.alpha * s + (o.beta === 0 ? 0 : o.beta * c[i * o.n + j]!);
    }
  return out;
}

export function biasAddReference(y: ArrayLike<number>, bias: ArrayLike<number>, rows: number, cols: number): Float64Array {
  const out = Float64Array.from(y);
  for (let r = 0; r < rows; r++) for (let j = 0; j < cols; j++) out[r * cols + j]! += bias[j]!;
  return out;
}

export function biasGradReference(db: ArrayLike<number>, dy: ArrayLike<number>, rows: number, cols: number, accumulate: boolean): Float64Array {
  const out = accumulate ? Float64Array.from(db) : new Float64Array(cols);
  for (let r = 0; r < rows; r++) for (let j = 0; j < cols; j++) out[j]! += dy[r * cols + j]!;
  return out;
}

/** max(0, x), with NaN becoming 0. */
export function reluReference(x: ArrayLike<number>): Float64Array {
  return Float64Array.from(x, (v) => (v > 0 ? v : 0));
}

export function reluGradReference(y: ArrayLike<number>, dy: ArrayLike<number>): Float64Array {
  return Float64Array.from(dy, (g, i) => (y[i]! > 0 ? g : 0));
}

/** Per-row softmax cross-entropy, its gradient times `scale`, and whether the first largest logit is the label. */
export function softmaxXentReference(
  logits: ArrayLike<number>,
  labels: ArrayLike<number>,
  rows: number,
  classes: number,
  scale: number,
): { losses: Float64Array; dlogits: Float64Array; correct: Float64Array } {
  const losses = new Float64Array(rows);
  const dlogits = new Float64Array(rows * classes);
  const correct = new Float64Array(rows);
  for (let r = 0; r < rows; r++) {
    const z = Array.from({ length: classes }, (_, j) => logits[r * classes + j]!);
    const label = labels[r]!;
    const valid = Number.isInteger(label) && label >= 0 && label < classes;
    let best = 0;
    for (let j = 1; j < classes; j++) if (z[j]! > z[best]!) best = j;
    const max = Math.max(...z);
    const total = z.reduce((s, v) => s + Math.exp(v - max), 0);
    losses[r] = valid ? Math.log(total) + max - z[label]! : Number.NaN;
    correct[r] = valid && best === label ? 1 : 0;
    for (let j = 0; j < classes; j++) dlogits[r * classes + j] = valid ? (Math.exp(z[j]! - max) / total - (j === label ? 1 : 0)) * scale : 0;
  }
  return { losses, dlogits, correct };
}
