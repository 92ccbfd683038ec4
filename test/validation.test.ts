/**
 * Bad input to every public entry throws the documented SapipeError code, changes nothing, and
 * never crashes the process.
 */
import t from 'tap';

import {
  Adam,
  AdamW,
  FlatBuffer,
  ParamSet,
  SGD,
  axpy,
  clipByNorm,
  countNonFinite,
  elasticAverage,
  scale,
  squaredNorm,
  sum,
  SapipeError,
} from '../dist/index.js';
import { nativeAddon } from '../dist/native.js';
import { ExecutionQueue } from '../dist/queue.js';

const code = (c: string) => ({ code: c });

t.test('FlatBuffer', async (t) => {
  for (const bad of [-1, 1.5, NaN, Infinity, 2 ** 53, '3' as unknown as number])
    t.throws(() => FlatBuffer.allocate(bad), code('ERR_INVALID_ARGUMENT'), `allocate(${String(bad)})`);
  const b = FlatBuffer.allocate(10);
  const view = b.array;
  b.dispose();
  b.dispose(); // idempotent
  t.equal(view.length, 0, 'views of a disposed buffer are empty, not dangling');
  t.throws(() => b.array, code('ERR_DISPOSED'));
  t.throws(() => scale(b, 2), code('ERR_DISPOSED'));
  t.equal(FlatBuffer.allocate(0).length, 0, 'empty buffers are fine');
});

t.test('ParamSet', async (t) => {
  t.throws(() => new ParamSet({}), code('ERR_INVALID_ARGUMENT'));
  t.throws(() => new ParamSet({ w: [-1] }), code('ERR_INVALID_ARGUMENT'));
  t.throws(() => new ParamSet({ w: [2.5] }), code('ERR_INVALID_ARGUMENT'));
  t.throws(() => new ParamSet({ w: 'x' as unknown as number[] }), code('ERR_INVALID_ARGUMENT'));
  t.throws(() => new ParamSet([['w', [1]], ['w', [2]]]), code('ERR_INVALID_ARGUMENT'), 'duplicate names');
  t.throws(() => new ParamSet([['', [1]]]), code('ERR_INVALID_ARGUMENT'));
  const p = new ParamSet({ w: [4] });
  t.throws(() => p.get('nope'), code('ERR_INVALID_ARGUMENT'));
  t.throws(() => p.view(FlatBuffer.allocate(3), 'w'), code('ERR_SIZE_MISMATCH'));
  p.dispose();
  t.throws(() => p.get('w'), code('ERR_DISPOSED'));
  t.throws(() => p.zeroGrad(), code('ERR_DISPOSED'));
  t.throws(() => new SGD(p, { lr: 0.1 }), code('ERR_DISPOSED'));
});

t.test('ParamSet memory: a MemorySource supplies weights, gradients and optimizer state; a bad one is refused', async (t) => {
  for (const bad of [null, 3, {}, { allocate: 1 }])
    t.throws(() => new ParamSet({ w: [4] }, { memory: bad as never }), code('ERR_INVALID_ARGUMENT'), `memory ${JSON.stringify(bad)}`);
  t.throws(() => new ParamSet({ w: [4] }, null as never), code('ERR_INVALID_ARGUMENT'));
  const wrong = FlatBuffer.allocate(3);
  t.throws(() => new ParamSet({ w: [4] }, { memory: { allocate: () => wrong } }), code('ERR_INVALID_ARGUMENT'), 'a buffer of the wrong length');
  t.equal(wrong.disposed, true, 'and that buffer is freed');
  t.throws(() => new ParamSet({ w: [4] }, { memory: { allocate: () => new Float32Array(16) as never } }), code('ERR_INVALID_ARGUMENT'), 'not a FlatBuffer');
  const given: FlatBuffer[] = [];
  const memory = { allocate: (n: number): FlatBuffer => (given.push(FlatBuffer.allocate(n)), given[given.length - 1]!) };
  const p = new ParamSet({ w: [4], b: [2] }, { memory });
  t.equal(given.length, 2);
  t.equal(p.weights, given[0]);
  t.equal(p.grads, given[1]);
  const opt = new SGD(p, { lr: 0.1, momentum: 0.9, prediction: { kind: 'linear', steps: 1 } });
  t.equal(given.length, 4, 'momentum and predicted weights come from it too');
  t.equal(opt.stateBuffer('predicted'), given[3]);
  opt.dispose();
  p.dispose();
});

t.test('optimizer options', async (t) => {
  const p = new ParamSet({ w: [8] });
  const bad: [string, () => unknown][] = [
    ['no params', () => new SGD({} as ParamSet, { lr: 0.1 })],
    ['no options', () => new SGD(p, undefined as unknown as { lr: number })],
    ['NaN lr', () => new SGD(p, { lr: NaN })],
    ['negative lr', () => new SGD(p, { lr: -1 })],
    ['momentum 1', () => new SGD(p, { lr: 0.1, momentum: 1 })],
    ['negative momentum', () => new SGD(p, { lr: 0.1, momentum: -0.1 })],
    ['dampening 2', () => new SGD(p, { lr: 0.1, momentum: 0.9, dampening: 2 })],
    ['nesterov without momentum', () => new SGD(p, { lr: 0.1, nesterov: true })],
    ['nesterov with dampening', () => new SGD(p, { lr: 0.1, momentum: 0.9, dampening: 0.1, nesterov: true })],
    ['spike without momentum', () => new SGD(p, { lr: 0.1, spikeCompensation: { delay: 2 } })],
    ['spike delay -1', () => new SGD(p, { lr: 0.1, momentum: 0.9, spikeCompensation: { delay: -1 } })],
    ['negative weight decay', () => new Adam(p, { lr: 0.1, weightDecay: -1 })],
    ['beta 1', () => new Adam(p, { lr: 0.1, betas: [1, 0.999] })],
    ['beta NaN', () => new AdamW(p, { lr: 0.1, betas: [0.9, NaN] })],
    ['eps 0', () => new Adam(p, { lr: 0.1, eps: 0 })],
    ['gradScale 0', () => new Adam(p, { lr: 0.1, gradScale: 0 })],
    ['lambda negative', () => new SGD(p, { lr: 0.1, compensation: { lambda: -0.1 } })],
    ['lambda NaN', () => new SGD(p, { lr: 0.1, compensation: { lambda: NaN } })],
    ['unknown compensation', () => new SGD(p, { lr: 0.1, compensation: { kind: 'x' as 'adaptive' } })],
    ['unknown prediction', () => new SGD(p, { lr: 0.1, prediction: { kind: 'x' } as never })],
    ['unknown estimate', () => new SGD(p, { lr: 0.1, prediction: { kind: 'sapipe', estimate: 'x' as 'local' } })],
    ['compensated estimate without compensation', () => new SGD(p, { lr: 0.1, prediction: { kind: 'sapipe', estimate: 'local', compensate: true } })],
    ['worldSize 0', () => new SGD(p, { lr: 0.1, prediction: { kind: 'sapipe', estimate: 'local-prev-sync', worldSize: 0 } })],
    ['stage out of range', () => new SGD(p, { lr: 0.1, prediction: { kind: 'pipeoptim', stage: 4, stages: 4 } })],
    ['negative linear steps', () => new SGD(p, { lr: 0.1, prediction: { kind: 'linear', steps: -1 } })],
  ];
  for (const [what, fn] of bad) t.throws(fn, code('ERR_INVALID_ARGUMENT'), what);
  const opt = new SGD(p, { lr: 0.1 });
  t.throws(() => {
    opt.lr = NaN;
  }, code('ERR_INVALID_ARGUMENT'));
  t.equal(opt.lr, 0.1, 'a rejected lr leaves the old one');
  opt.dispose();
  p.dispose();
});

t.test('step inputs', async (t) => {
  const p = new ParamSet({ w: [8] });
  const local = new SGD(p, { lr: 0.1, momentum: 0.9, prediction: { kind: 'sapipe', estimate: 'local' } });
  t.throws(() => local.stepSync(), code('ERR_INVALID_ARGUMENT'), 'local estimate without localGrad');
  t.throws(() => local.stepSync({ localGrad: FlatBuffer.allocate(3) }), code('ERR_SIZE_MISMATCH'));
  t.throws(() => local.stepSync({ localGrad: new Float32Array(16) as unknown as FlatBuffer }), code('ERR_INVALID_ARGUMENT'));
  t.throws(() => local.stepSync({ grad: p.weights }), code('ERR_INVALID_ARGUMENT'), 'still needs localGrad');
  t.throws(() => local.stepSync({ grad: p.weights, localGrad: FlatBuffer.allocate(16) }), code('ERR_ALIASING'), 'grad aliasing the weights');
  const g = FlatBuffer.allocate(16);
  t.throws(() => local.stepSync({ localGrad: g, grad: g }), code('ERR_ALIASING'), 'grad aliasing the local grad');
  const disposed = FlatBuffer.allocate(16);
  disposed.dispose();
  t.throws(() => local.stepSync({ localGrad: disposed }), code('ERR_DISPOSED'));
  await t.rejects(local.step({ localGrad: disposed }), code('ERR_DISPOSED'));
  t.throws(() => local.stepSync(null as unknown as object), code('ERR_INVALID_ARGUMENT'));
  t.equal(local.steps, 0, 'no rejected call stepped');
  local.dispose();
  t.throws(() => local.stepSync({ localGrad: g }), code('ERR_DISPOSED'), 'disposed optimizer');
  t.throws(() => local.exportState(), code('ERR_DISPOSED'));
  p.dispose();
});

t.test('ops', async (t) => {
  const a = FlatBuffer.allocate(8);
  const b = FlatBuffer.allocate(8);
  const c = FlatBuffer.allocate(9);
  t.throws(() => elasticAverage(a, c, 0.5), code('ERR_SIZE_MISMATCH'));
  t.throws(() => elasticAverage(a, a, 0.5), code('ERR_ALIASING'));
  t.throws(() => elasticAverage(a, b, 1.5), code('ERR_INVALID_ARGUMENT'));
  t.throws(() => elasticAverage(a, b, NaN), code('ERR_INVALID_ARGUMENT'));
  t.throws(() => sum(a, []), code('ERR_INVALID_ARGUMENT'));
  t.throws(() => sum(a, [b, a]), code('ERR_ALIASING'));
  t.throws(() => sum(a, [c]), code('ERR_SIZE_MISMATCH'));
  t.throws(() => axpy(a, 1, c), code('ERR_SIZE_MISMATCH'));
  t.throws(() => axpy(a, NaN, b), code('ERR_INVALID_ARGUMENT'));
  t.throws(() => scale(a, Infinity), code('ERR_INVALID_ARGUMENT'));
  t.throws(() => squaredNorm({} as FlatBuffer), code('ERR_INVALID_ARGUMENT'));
  t.throws(() => countNonFinite(null as unknown as FlatBuffer), code('ERR_INVALID_ARGUMENT'));
  t.throws(() => clipByNorm(a, 0), code('ERR_INVALID_ARGUMENT'));
});

t.test('the native layer checks again, with typed errors, whatever the TS layer let through', async (t) => {
  const addon = nativeAddon();
  const w = new addon.NativeBuffer(8);
  const g = new addon.NativeBuffer(8);
  const short = new addon.NativeBuffer(7);
  const queue = new ExecutionQueue();
  const cases: [string, () => unknown, string][] = [
    ['no config', () => addon.update(undefined as never, { weights: w, grad: g }), 'ERR_INVALID_ARGUMENT'],
    ['unknown optimizer', () => addon.update({ optimizer: 7, lr: 0.1 }, { weights: w, grad: g }), 'ERR_INVALID_ARGUMENT'],
    ['lr as string', () => addon.update({ optimizer: 0, lr: '1' as unknown as number }, { weights: w, grad: g }), 'ERR_INVALID_ARGUMENT'],
    ['negative lr', () => addon.update({ optimizer: 0, lr: -1 }, { weights: w, grad: g }), 'ERR_INVALID_ARGUMENT'],
    ['adam without state', () => addon.update({ optimizer: 1, lr: 0.1 }, { weights: w, grad: g }), 'ERR_INVALID_ARGUMENT'],
    ['short grad', () => addon.update({ optimizer: 0, lr: 0.1 }, { weights: w, grad: short }), 'ERR_SIZE_MISMATCH'],
    ['offset past the end', () => addon.update({ optimizer: 0, lr: 0.1 }, { weights: w, grad: g, offset: 6, count: 4 }), 'ERR_SIZE_MISMATCH'],
    ['grad is weights', () => addon.update({ optimizer: 0, lr: 0.1 }, { weights: w, grad: w }), 'ERR_ALIASING'],
    ['not a buffer', () => addon.update({ optimizer: 0, lr: 0.1 }, { weights: w, grad: {} as never }), 'ERR_INVALID_ARGUMENT'],
    ['step 0', () => addon.update({ optimizer: 0, lr: 0.1, step: 0 }, { weights: w, grad: g }), 'ERR_INVALID_ARGUMENT'],
    ['sum of nothing', () => addon.sum(w, [], 1), 'ERR_INVALID_ARGUMENT'],
    ['queue is not a queue', () => addon.updateAsync({} as never, { optimizer: 0, lr: 0.1 }, { weights: w, grad: g }), 'ERR_INVALID_ARGUMENT'],
    ['buffer length -1', () => new addon.NativeBuffer(-1), 'ERR_INVALID_ARGUMENT'],
    ['a gate of 1 float', () => addon.updateAsync(queue.handle, { optimizer: 0, lr: 0.1 }, { weights: w, grad: g }, undefined, new addon.NativeBuffer(1)), 'ERR_SIZE_MISMATCH'],
    ['the gate is the weights', () => addon.updateAsync(queue.handle, { optimizer: 0, lr: 0.1 }, { weights: w, grad: g }, undefined, w), 'ERR_ALIASING'],
    ['a gate with a clip', () => addon.updateAsync(queue.handle, { optimizer: 0, lr: 0.1 }, { weights: w, grad: g }, { maxNorm: 1, base: 1, unscale: 1 }, short), 'ERR_INVALID_ARGUMENT'],
    ['guard: a gate of 1 float', () => addon.guardAsync(queue.handle, g, new addon.NativeBuffer(1), 2), 'ERR_SIZE_MISMATCH'],
    ['guard: the gate is the gradient', () => addon.guardAsync(queue.handle, g, g, 2), 'ERR_ALIASING'],
    ['guard: size 0', () => addon.guardAsync(queue.handle, g, short, 0), 'ERR_INVALID_ARGUMENT'],
  ];
  for (const [what, fn, expected] of cases) {
    try {
      fn();
      t.fail(`${what}: did not throw`);
    } catch (error) {
      t.equal((error as { code?: string }).code, expected, what);
    }
  }
  t.ok(new SapipeError('ERR_INTERNAL', 'x') instanceof Error);
});

t.test('a gated update runs only on an all-zero verdict; the queued guard writes the verdict', async (t) => {
  const addon = nativeAddon();
  const queue = new ExecutionQueue();
  const w = FlatBuffer.from([1, 2, 3, 4]);
  const g = FlatBuffer.from([1, 1, 1, 1]);
  const gate = FlatBuffer.allocate(16);
  await addon.guardAsync(queue.handle, g.handle, gate.handle, 3);
  t.same([gate.array[0], gate.array[1]], [0, 0], 'a small finite gradient: no non-finite element, no overflow risk');
  const applied = await addon.updateAsync(queue.handle, { optimizer: 0, lr: 0.5, gradChecked: true }, { weights: w.handle, grad: g.handle }, undefined, gate.handle);
  t.same(applied, { applied: true, nonFiniteCount: 0 });
  t.same(Array.from(w.array), [0.5, 1.5, 2.5, 3.5], 'the update ran');
  g.array.set([1, Number.NaN, Infinity, 1]);
  await addon.guardAsync(queue.handle, g.handle, gate.handle, 3);
  t.same([gate.array[0], gate.array[1]], [2, 0], 'two non-finite elements counted');
  const skipped = await addon.updateAsync(queue.handle, { optimizer: 0, lr: 0.5, gradChecked: true }, { weights: w.handle, grad: g.handle }, undefined, gate.handle);
  t.same(skipped, { applied: false, nonFiniteCount: 2 }, 'skipped, reporting the verdict');
  t.same(Array.from(w.array), [0.5, 1.5, 2.5, 3.5], 'nothing written');
  g.array.set([1e38, 1, 1, 1]);
  await addon.guardAsync(queue.handle, g.handle, gate.handle, 3);
  t.same([gate.array[0], gate.array[1]], [0, 1], 'finite, but three such gradients could overflow a sum');
  await addon.guardAsync(queue.handle, g.handle, gate.handle, 1);
  t.same([gate.array[0], gate.array[1]], [0, 0], 'one rank: no sum to overflow');
  for (const b of [w, g, gate]) b.dispose();
});

t.test('an update waiting on a latch runs once another queue signals it, and times out otherwise', async (t) => {
  const addon = nativeAddon();
  const [updates, signals] = [new ExecutionQueue(), new ExecutionQueue()];
  const w = FlatBuffer.from([1, 2, 3, 4]);
  const g = FlatBuffer.from([1, 1, 1, 1]);
  const latch = FlatBuffer.allocate(16);
  const config = { optimizer: 0, lr: 0.5, gradChecked: true };
  let settled = false;
  const waiting = addon.updateAsync(updates.handle, config, { weights: w.handle, grad: g.handle }, undefined, undefined, { latch: latch.handle, slot: 3, timeoutMs: 10_000 });
  void waiting.then(() => (settled = true));
  await new Promise((resolve) => setTimeout(resolve, 50));
  t.equal(settled, false, 'the update waits for its slot');
  await addon.latchSignalAsync(signals.handle, latch.handle, 3);
  t.same(await waiting, { applied: true, nonFiniteCount: 0 }, 'and runs once it is signalled');
  t.same(Array.from(w.array), [0.5, 1.5, 2.5, 3.5]);
  const error = await addon
    .updateAsync(updates.handle, config, { weights: w.handle, grad: g.handle }, undefined, undefined, { latch: latch.handle, slot: 4, timeoutMs: 30 })
    .then(() => undefined, (e: unknown) => e);
  t.equal((error as { code?: string }).code, 'ERR_TIMEOUT', 'a slot never signalled fails the update within its timeout');
  t.same(Array.from(w.array), [0.5, 1.5, 2.5, 3.5], 'and writes nothing');

  // A signal behind a failed operation on its queue (here an update that timed out; in a step, a
  // reduction) fails its waiters instead of releasing them, and so does every later slot's signal.
  const chain = FlatBuffer.allocate(16);
  const waitOn = (slot: number): Promise<unknown> =>
    addon.updateAsync(updates.handle, config, { weights: w.handle, grad: g.handle }, undefined, undefined, { latch: chain.handle, slot, timeoutMs: 10_000 }).then(
      (r) => r,
      (e: unknown) => (e as { code?: string }).code,
    );
  const failing = addon.updateAsync(signals.handle, config, { weights: g.handle, grad: w.handle }, undefined, undefined, { latch: latch.handle, slot: 5, timeoutMs: 10 });
  void failing.catch(() => undefined);
  void addon.latchSignalAsync(signals.handle, chain.handle, 1);
  void addon.latchSignalAsync(signals.handle, chain.handle, 2);
  t.equal(await waitOn(1), 'ERR_DISPOSED', 'a signal behind a failed operation fails the update waiting on it');
  t.equal(await waitOn(2), 'ERR_DISPOSED', 'and the next slot, signalled behind a successful one, fails too');
  t.same(Array.from(w.array), [0.5, 1.5, 2.5, 3.5], 'neither wrote anything');
  await addon.latchSignalAsync(signals.handle, chain.handle, 5);
  t.same(await waitOn(5), { applied: true, nonFiniteCount: 0 }, 'a slot whose predecessor was never signalled is released');
  chain.dispose();

  const code = (fn: () => unknown): string | undefined => {
    try {
      fn();
    } catch (e) {
      return (e as { code?: string }).code;
    }
    return undefined;
  };
  t.equal(code(() => addon.latchSignalAsync(signals.handle, latch.handle, 16)), 'ERR_SIZE_MISMATCH', 'a slot past the latch');
  t.equal(code(() => addon.updateAsync(updates.handle, config, { weights: w.handle, grad: g.handle }, undefined, undefined, { latch: latch.handle, slot: 16, timeoutMs: 10 })), 'ERR_SIZE_MISMATCH');
  t.equal(code(() => addon.updateAsync(updates.handle, config, { weights: w.handle, grad: g.handle }, undefined, undefined, { latch: w.handle, slot: 0, timeoutMs: 10 })), 'ERR_ALIASING', 'the latch is a written buffer');
  for (const b of [w, g, latch]) b.dispose();
});

t.test('hostile values: typed errors whose messages format the value safely', async (t) => {
  const cases: [string, () => unknown, RegExp][] = [
    ['ParamSet(null)', () => new ParamSet(null as never), /got null/],
    ['ParamSet with a BigInt dimension', () => new ParamSet({ a: [1n as unknown as number] }), /the BigInt 1n/],
    ['ParamSet with a BigInt spec', () => new ParamSet(1n as never), /the BigInt 1n/],
    ['ParamSet with a Symbol dimension', () => new ParamSet({ a: [Symbol('d') as unknown as number] }), /Symbol\(d\)/],
    ['ParamSet with an unknown option', () => new ParamSet({ a: [1] }, { memroy: 1 } as never), /unknown option 'memroy'/],
  ];
  const p = new ParamSet({ a: [3] });
  cases.push(
    ['view(null, name)', () => p.view(null as never, 'a'), /must be a FlatBuffer, got null/],
    ['view(undefined, name)', () => p.view(undefined as never, 'a'), /got undefined/],
    ['get(Symbol)', () => p.get(Symbol('q') as never), /no tensor a Symbol\(q\)/],
    ['get(null)', () => p.get(null as never), /no tensor null/],
  );
  for (const [what, fn, message] of cases) {
    const error = (() => {
      try {
        fn();
      } catch (e) {
        return e;
      }
      return undefined;
    })();
    t.ok(error instanceof SapipeError, `${what}: a SapipeError`);
    t.equal((error as SapipeError | undefined)?.code, 'ERR_INVALID_ARGUMENT', what);
    t.match((error as Error | undefined)?.message, message, what);
  }
  p.dispose();
});

t.test('number messages say the range plainly and name a string passed for a number', async (t) => {
  const p = new ParamSet({ a: [3] });
  t.throws(() => new SGD(p, { lr: -1 }), { code: 'ERR_INVALID_ARGUMENT', message: /lr must be >= 0, got -1$/ }, 'no 1.79e308 upper bound');
  t.throws(() => new SGD(p, { lr: '0.1' as unknown as number }), {
    code: 'ERR_INVALID_ARGUMENT',
    message: /lr must be a finite number, got the string "0.1" \(pass the number 0.1, not a string\)/,
  });
  t.throws(() => new SGD(p, { lr: 1n as unknown as number }), { message: /got the BigInt 1n \(pass a Number, not a BigInt\)/ });
  p.dispose();
});
