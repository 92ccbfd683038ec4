/** ReLU in place: forward keeps max(0, x); backward masks the incoming gradient where the output was 0. */

export function reluForward(x: Float32Array): void {
  for (let i = 0; i < x.length; i++) if (!(x[i]! > 0)) x[i] = 0;
}

/** dX = dY where y > 0, else 0; `y` is the forward output (y > 0 exactly where the input was > 0). */
export function reluBackward(y: Float32Array, dy: Float32Array): void {
  for (let i = 0; i < dy.length; i++) if (!(y[i]! > 0)) dy[i] = 0;
}
