/** ReLU in place: forward keeps max(0, x); backward masks the incoming gradient where the output was 0. */
import { SizeMismatchError } from '../errors.js';
import { checkFloat32Array } from '../validate.js';

/** @category Models */
export function reluForward(x: Float32Array): void {
  checkFloat32Array(x, 'reluForward(x): x');
  for (let i = 0; i < x.length; i++) if (!(x[i]! > 0)) x[i] = 0;
}

/** dX = dY where y > 0, else 0; `y` is the forward output (y > 0 exactly where the input was > 0). @category Models */
export function reluBackward(y: Float32Array, dy: Float32Array): void {
  checkFloat32Array(y, 'reluBackward(y, dy): y');
  checkFloat32Array(dy, 'reluBackward(y, dy): dy');
  if (y.length < dy.length) throw new SizeMismatchError(`reluBackward: y has ${y.length} values, dy ${dy.length}`);
  for (let i = 0; i < dy.length; i++) if (!(y[i]! > 0)) dy[i] = 0;
}
