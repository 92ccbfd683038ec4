/** The MLP's loss in double precision, written out plainly, for finite-difference gradient checks. */

/** Mean softmax cross-entropy of an MLP (ReLU between layers) with weights `w` (the ParamSet's flat layout). */
export function referenceLoss(
  sizes: readonly number[],
  offsets: ReadonlyArray<{ weight: number; bias: number }>,
  w: Float64Array,
  x: ArrayLike<number>,
  labels: ArrayLike<number>,
): number {
  const batch = labels.length;
  let total = 0;
  for (let r = 0; r < batch; r++) {
    let act: number[] = [];
    for (let j = 0; j < sizes[0]!; j++) act.push(x[r * sizes[0]! + j]!);
    for (let l = 0; l + 1 < sizes.length; l++) {
      const inF = sizes[l]!;
      const outF = sizes[l + 1]!;
      const next: number[] = [];
      for (let o = 0; o < outF; o++) {
        let s = w[offsets[l]!.bias + o]!;
        for (let i = 0; i < inF; i++) s += w[offsets[l]!.weight + o * inF + i]! * act[i]!;
        next.push(l + 2 < sizes.length ? Math.max(0, s) : s);
      }
      act = next;
    }
    const max = Math.max(...act);
    const lse = Math.log(act.reduce((a, z) => a + Math.exp(z - max), 0)) + max;
    total += lse - act[labels[r]!]!;
  }
  return total / batch;
}
