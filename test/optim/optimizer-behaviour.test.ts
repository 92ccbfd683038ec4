/**
 * Optimizer behaviour beyond the arithmetic: the non-finite guard, async and sync paths agreeing
 * bit for bit, state export/import, and the ParamSet layout.
 */
import t from 'tap';

import { Adam, AdamW, FlatBuffer, ParamSet, SGD, type Optimizer } from '../../dist/index.js';
import { fillNormal, fillUniform, rng } from '../helpers/random.js';

const SPEC = { 'fc1.weight': [33, 7], 'fc1.bias': [7], 'fc2.weight': [7, 3], 'fc2.bias': [3] } as const;

function bits(a: Float32Array): Uint32Array {
  return new Uint32Array(a.buffer, a.byteOffset, a.length).slice();
}

function makeParams(seed: number): ParamSet {
  const p = new ParamSet(SPEC);
  const next = rng(seed);
  for (const tensor of p.tensors) fillUniform(tensor.data, next);
  return p;
}

function fillGrads(p: ParamSet, next: () => number): void {
  for (const tensor of p.tensors) fillNormal(tensor.grad, next);
}

type Factory = (p: ParamSet) => Optimizer;
const FACTORIES: [string, Factory][] = [
  ['sgd-momentum+dc+wp', (p) => new SGD(p, { lr: 0.05, momentum: 0.9, compensation: {}, prediction: { kind: 'sapipe', estimate: 'local-prev-sync', worldSize: 4 } })],
  ['adam+dc+wp-local', (p) => new Adam(p, { lr: 1e-3, compensation: { kind: 'adaptive' }, prediction: { kind: 'sapipe', estimate: 'local', compensate: true } })],
  ['adamw+pipeoptim', (p) => new AdamW(p, { lr: 1e-3, weightDecay: 0.01, prediction: { kind: 'pipeoptim', stage: 1, stages: 4 } })],
  ['sgd-spike', (p) => new SGD(p, { lr: 0.05, momentum: 0.9, spikeCompensation: { delay: 3 }, weightDecay: 1e-3 })],
];

function allBuffers(opt: Optimizer): Float32Array[] {
  const list = [opt.params.weights.array, opt.params.grads.array];
  for (const name of ['momentum', 'secondMoment', 'backup', 'predicted', 'prevLocalGrad'] as const) {
    const b = opt.stateBuffer(name);
    if (b) list.push(b.array);
  }
  return list;
}

for (const [name, make] of FACTORIES) {
  t.test(`${name}: a non-finite gradient skips the whole step and leaves every buffer bit-identical`, async (t) => {
    const opt = make(makeParams(1));
    const local = FlatBuffer.allocate(opt.params.length);
    const next = rng(2);
    for (let i = 0; i < 3; i++) {
      fillGrads(opt.params, next);
      fillNormal(local.array, next);
      t.ok(opt.stepSync({ localGrad: local }).applied);
    }
    for (const bad of [NaN, Infinity, -Infinity]) {
      fillGrads(opt.params, next);
      const index = opt.params.layout('fc2.weight').offset + 5;
      opt.params.grads.array[index] = bad;
      opt.params.grads.array[3] = bad;
      const before = allBuffers(opt).map(bits);
      const r = opt.stepSync({ localGrad: local });
      t.equal(r.applied, false, `${bad}: skipped`);
      t.equal(r.nonFiniteCount, 2);
      t.equal(r.step, 3, 'the step count does not advance');
      const after = allBuffers(opt).map(bits);
      t.same(after, before, `${bad}: every buffer unchanged`);
    }
    t.equal(opt.skippedSteps, 3);
    if (opt.prediction?.kind === 'sapipe' && opt.prediction.estimate !== 'prev-sync') {
      fillGrads(opt.params, next);
      local.array[0] = NaN;
      const before = allBuffers(opt).map(bits);
      const r = await opt.step({ localGrad: local });
      t.equal(r.applied, false, 'a non-finite local gradient also skips the step');
      t.same(allBuffers(opt).map(bits), before);
    }
    opt.dispose();
    local.dispose();
    opt.params.dispose();
  });

  t.test(`${name}: step() and stepSync() give bit-identical results over 50 steps`, async (t) => {
    const a = make(makeParams(3));
    const b = make(makeParams(3));
    const la = FlatBuffer.allocate(a.params.length);
    const lb = FlatBuffer.allocate(b.params.length);
    const next = rng(4);
    for (let i = 0; i < 50; i++) {
      fillGrads(a.params, next);
      b.params.grads.array.set(a.params.grads.array);
      fillNormal(la.array, next);
      lb.array.set(la.array);
      a.stepSync({ localGrad: la });
      const r = await b.step({ localGrad: lb });
      t.equal(r.step, i + 1);
    }
    const [x, y] = [allBuffers(a).map(bits), allBuffers(b).map(bits)];
    t.same(y, x);
    for (const o of [a, b]) {
      o.dispose();
      o.params.dispose();
    }
    la.dispose();
    lb.dispose();
  });

  t.test(`${name}: exportState/importState resume exactly`, async (t) => {
    const a = make(makeParams(5));
    const local = FlatBuffer.allocate(a.params.length);
    const next = rng(6);
    const grads: Float32Array[] = [];
    const locals: Float32Array[] = [];
    for (let i = 0; i < 10; i++) {
      const g = new Float32Array(a.params.length);
      const l = new Float32Array(a.params.length);
      // only the tensors' elements: padding stays zero
      fillGrads(a.params, next);
      g.set(a.params.grads.array);
      fillNormal(l, next);
      grads.push(g);
      locals.push(l);
    }
    const run = (o: Optimizer, from: number, to: number): void => {
      for (let i = from; i < to; i++) {
        o.params.grads.array.set(grads[i]!);
        local.array.set(locals[i]!);
        o.stepSync({ localGrad: local });
      }
    };
    run(a, 0, 5);
    const state = a.exportState();
    const weights = a.params.weights.array.slice();
    run(a, 5, 10);
    const b = make(new ParamSet(SPEC));
    b.params.weights.array.set(weights);
    b.importState(state);
    t.equal(b.steps, 5);
    run(b, 5, 10);
    t.same(allBuffers(b).map(bits), allBuffers(a).map(bits));
    t.throws(() => b.importState({ ...state, kind: state.kind === 'sgd' ? 'adam' : 'sgd' }), { code: 'ERR_INVALID_ARGUMENT' });
    t.throws(() => b.importState({ ...state, length: 3 }), { code: 'ERR_SIZE_MISMATCH' });
    const short = { ...state, buffers: { ...state.buffers } };
    const firstKey = Object.keys(short.buffers)[0] as keyof typeof short.buffers;
    short.buffers[firstKey] = new Float32Array(3);
    const before = allBuffers(b).map(bits);
    t.throws(() => b.importState(short), { code: 'ERR_SIZE_MISMATCH' });
    t.same(allBuffers(b).map(bits), before, 'a rejected import changes nothing');
    local.dispose();
    for (const o of [a, b]) {
      o.dispose();
      o.params.dispose();
    }
  });
}

t.test('ParamSet: aligned views per tensor, padding that stays zero', async (t) => {
  const p = makeParams(7);
  t.same(p.names, ['fc1.weight', 'fc1.bias', 'fc2.weight', 'fc2.bias']);
  t.equal(p.numParams, 33 * 7 + 7 + 21 + 3);
  t.equal(p.length, 240 + 16 + 32 + 16);
  for (const tensor of p.tensors) {
    t.equal(tensor.data.byteOffset % 64, 0, `${tensor.name} is 64-byte aligned`);
    t.equal(tensor.data.length, tensor.size);
    t.equal(tensor.data.buffer, p.weights.array.buffer, 'zero-copy view of the flat buffer');
  }
  const opt = new AdamW(p, { lr: 0.1, weightDecay: 0.1 });
  const next = rng(8);
  for (let i = 0; i < 5; i++) {
    fillGrads(p, next);
    opt.stepSync();
  }
  const w = p.weights.array;
  const l = p.layout('fc1.bias');
  for (let i = l.offset + l.size; i < p.layout('fc2.weight').offset; i++) t.equal(w[i], 0, 'padding stays zero');
  p.get('fc2.bias').data[1] = 42;
  t.equal(w[p.layout('fc2.bias').offset + 1], 42, 'writes through a view reach the flat buffer');
  opt.dispose();
  p.dispose();
  t.equal(p.disposed, true);
});

t.test('step() while another step() is in flight is refused; the queue runs steps in order', async (t) => {
  const p = makeParams(9);
  const opt = new SGD(p, { lr: 0.1 });
  const first = opt.step();
  t.throws(() => opt.stepSync(), { code: 'ERR_BUSY' });
  await t.rejects(opt.step(), { code: 'ERR_BUSY' });
  t.throws(() => opt.dispose(), { code: 'ERR_BUSY' });
  t.throws(() => p.weights.dispose(), { code: 'ERR_BUSY' }, 'memory in use by the queue cannot be freed');
  const r = await first;
  t.equal(r.applied, true);
  opt.dispose();
  p.dispose();
});
