/** Seeded initialisation, so a model built twice with the same seed has the same weights on every platform. */
import { checkFloat32Array, checkFunction, checkNumber } from '../validate.js';

function checkInit(what: string, out: unknown, fanIn: unknown, next: unknown): void {
  checkFloat32Array(out, `${what}: out`);
  checkNumber(fanIn, `${what}: fanIn`, 0, Number.MAX_VALUE, { loOpen: true });
  checkFunction(next, `${what}: next (a random source in [0, 1))`);
}

/**
 * Kaiming (He) uniform for a layer followed by ReLU: U(-sqrt(6 / fanIn), sqrt(6 / fanIn)) keeps the
 * activations' second moment roughly constant from layer to layer.
 *
 * @category Models
 */
export function kaimingUniform(out: Float32Array, fanIn: number, next: () => number): void {
  checkInit('kaimingUniform', out, fanIn, next);
  const bound = Math.sqrt(6 / fanIn);
  for (let i = 0; i < out.length; i++) out[i] = (2 * next() - 1) * bound;
}

/** Biases as PyTorch's Linear draws them: U(-1/sqrt(fanIn), 1/sqrt(fanIn)). @category Models */
export function biasUniform(out: Float32Array, fanIn: number, next: () => number): void {
  checkInit('biasUniform', out, fanIn, next);
  const bound = 1 / Math.sqrt(fanIn);
  for (let i = 0; i < out.length; i++) out[i] = (2 * next() - 1) * bound;
}
