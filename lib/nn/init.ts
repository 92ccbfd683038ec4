/** Seeded initialisation, so a model built twice with the same seed has the same weights on every platform. */

/**
 * Kaiming (He) uniform for a layer followed by ReLU: U(-sqrt(6 / fanIn), sqrt(6 / fanIn)) keeps the
 * activations' second moment roughly constant from layer to layer.
 */
export function kaimingUniform(out: Float32Array, fanIn: number, next: () => number): void {
  const bound = Math.sqrt(6 / fanIn);
  for (let i = 0; i < out.length; i++) out[i] = (2 * next() - 1) * bound;
}

/** Biases as PyTorch's Linear draws them: U(-1/sqrt(fanIn), 1/sqrt(fanIn)). */
export function biasUniform(out: Float32Array, fanIn: number, next: () => number): void {
  const bound = 1 / Math.sqrt(fanIn);
  for (let i = 0; i < out.length; i++) out[i] = (2 * next() - 1) * bound;
}
