import t from 'tap';

import { DisposedError, InternalError, SapipeError, SizeMismatchError, fromNativeError } from '../dist/errors.js';

t.test('native errors map to typed subclasses by code', async (t) => {
  const native = Object.assign(new Error('buffers differ'), { code: 'ERR_SIZE_MISMATCH' });
  const mapped = fromNativeError(native);
  t.ok(mapped instanceof SizeMismatchError);
  t.ok(mapped instanceof SapipeError);
  t.equal(mapped.code, 'ERR_SIZE_MISMATCH');
  t.equal(mapped.message, 'buffers differ');
  t.equal(mapped.cause, native);
  t.ok(fromNativeError(Object.assign(new Error('x'), { code: 'ERR_DISPOSED' })) instanceof DisposedError);
});

t.test('unknown errors become ERR_INTERNAL', async (t) => {
  t.ok(fromNativeError(new Error('boom')) instanceof InternalError);
  t.equal(fromNativeError('text').code, 'ERR_INTERNAL');
  t.equal(fromNativeError(Object.assign(new Error('y'), { code: 'EPERM' })).code, 'ERR_INTERNAL');
});
