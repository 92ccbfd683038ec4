/**
 * Small cases worked out by hand from ALGORITHMS.md, one element each (element 0 of a one-tensor
 * ParamSet; the rest is padding). Tolerance 1e-6 absolute: the values are O(1) and fp32 rounding
 * is ~1e-7.
 */
import t from 'tap';

import { Adam, AdamW, FlatBuffer, ParamSet, SGD, pipelinedBackpropDelay, type Optimizer } from '../../dist/index.js';

const TOL = 1e-6;

function single(w0: number): ParamSet {
  const p = new ParamSet({ w: [1] });
  p.get('w').data[0] = w0;
  return p;
}

function stepWith(opt: Optimizer, g: number, local?: number): void {
  opt.params.get('w').grad[0] = g;
  let localGrad: FlatBuffer | undefined;
  if (local !== undefined) {
    localGrad = FlatBuffer.allocate(opt.params.length);
    localGrad.array[0] = local;
  }
  const r = opt.stepSync(localGrad ? { localGrad } : {});
  localGrad?.dispose();
  if (!r.applied) throw new Error('step skipped');
}

const w = (opt: Optimizer): number => opt.params.get('w').data[0]!;
const wHat = (opt: Optimizer): number => opt.forwardView('w')[0]!;

t.test('delay compensation, elementwise: first step uncompensated, then g + lambda*g*g*(w - w_prev)', async (t) => {
  const opt = new SGD(single(1), { lr: 0.1, compensation: { lambda: 0.5 } });
  stepWith(opt, 2); // w = 1 - 0.2
  t.equal(w(opt), Math.fround(0.8));
  t.equal(opt.stateBuffer('backup')!.array[0], 1, 'backup rotated to the pre-update weights');
  stepWith(opt, 1); // g~ = 1 + 0.5*1*(0.8 - 1) = 0.9; w = 0.8 - 0.09
  t.ok(Math.abs(w(opt) - 0.71) < TOL, `w = ${w(opt)}`);
  t.ok(Math.abs(opt.stateBuffer('backup')!.array[0]! - 0.8) < TOL);
});

t.test('delay compensation, adaptive: the term divided by sqrt(g*g + eps)', async (t) => {
  const opt = new SGD(single(1), { lr: 0.1, compensation: { kind: 'adaptive', lambda: 0.5 } });
  stepWith(opt, 2);
  stepWith(opt, 2); // g~ = 2 + 0.5*4*(-0.2)/2 = 1.8; w = 0.8 - 0.18
  t.ok(Math.abs(w(opt) - 0.62) < TOL, `w = ${w(opt)}`);
});

t.test('SAPipe weight prediction, each estimate (SGD, momentum 0.5, lr 0.1)', async (t) => {
  // Step 1: A = 2, local = 4: m = 2, w = 0.8.
  const local = new SGD(single(1), { lr: 0.1, momentum: 0.5, prediction: { kind: 'sapipe', estimate: 'local' } });
  stepWith(local, 2, 4); // shadow: m' = 0.5*2 + 4 = 5; w_hat = 0.8 - 0.5
  t.ok(Math.abs(w(local) - 0.8) < TOL);
  t.ok(Math.abs(wHat(local) - 0.3) < TOL, `local: w_hat = ${wHat(local)}`);

  const prev = new SGD(single(1), { lr: 0.1, momentum: 0.5, prediction: { kind: 'sapipe', estimate: 'prev-sync' } });
  stepWith(prev, 2); // shadow with A: m' = 1 + 2 = 3; w_hat = 0.8 - 0.3
  t.ok(Math.abs(wHat(prev) - 0.5) < TOL, `prev-sync: w_hat = ${wHat(prev)}`);

  const lps = new SGD(single(1), {
    lr: 0.1,
    momentum: 0.5,
    prediction: { kind: 'sapipe', estimate: 'local-prev-sync', worldSize: 2 },
  });
  stepWith(lps, 2, 4); // no g_{t-1} yet: falls back to prev-sync
  t.ok(Math.abs(wHat(lps) - 0.5) < TOL, `local-prev-sync, first: w_hat = ${wHat(lps)}`);
  t.equal(lps.stateBuffer('prevLocalGrad')!.array[0], 4, 'g_t stored for the next step');
  stepWith(lps, 1, 6); // m = 0.5*2 + 1 = 2, w = 0.6; g_est = 1 + (6 - 4)/2 = 2; m' = 1 + 2 = 3; w_hat = 0.3
  t.ok(Math.abs(w(lps) - 0.6) < TOL);
  t.ok(Math.abs(wHat(lps) - 0.3) < TOL, `local-prev-sync: w_hat = ${wHat(lps)}`);
});

t.test('SAPipe prediction with a compensated estimate', async (t) => {
  // lambda 0.5, prev-sync. Step 1 (g = 2): w 1 -> 0.8, backup = 1; estimate 2 compensated against
  // the move 0.8 - 1: 2 + 0.5*4*(-0.2) = 1.6; plain SGD shadow: w_hat = 0.8 - 0.16 = 0.64.
  const opt = new SGD(single(1), {
    lr: 0.1,
    compensation: { lambda: 0.5 },
    prediction: { kind: 'sapipe', estimate: 'prev-sync', compensate: true },
  });
  stepWith(opt, 2);
  t.ok(Math.abs(wHat(opt) - 0.64) < TOL, `w_hat = ${wHat(opt)}`);
});

t.test('SAPipe prediction for Adam is a full Adam step at t + 1 on copies of m, v', async (t) => {
  // betas (0.5, 0.5), lr 0.1. Step 1, g = 2: m = 1, v = 2, m_hat = 2, v_hat = 4: w = 1 - 0.1 = 0.9.
  // Shadow at t = 2 with g_est = 2: m' = 0.5 + 1 = 1.5, v' = 1 + 2 = 3; m_hat = 1.5/0.75 = 2,
  // v_hat = 3/0.75 = 4: w_hat = 0.9 - 0.1*2/2 = 0.8.
  const opt = new Adam(single(1), { lr: 0.1, betas: [0.5, 0.5], eps: 1e-12, prediction: { kind: 'sapipe', estimate: 'prev-sync' } });
  stepWith(opt, 2);
  t.ok(Math.abs(w(opt) - 0.9) < TOL);
  t.ok(Math.abs(wHat(opt) - 0.8) < TOL, `w_hat = ${wHat(opt)}`);
  t.equal(opt.stateBuffer('momentum')!.array[0], 1, 'the shadow step left m alone');
  t.equal(opt.stateBuffer('secondMoment')!.array[0], 2, 'the shadow step left v alone');
});

t.test('PipeOptim: stage k of S predicts S-k-1 steps along the optimizer direction', async (t) => {
  const sgd = new SGD(single(1), { lr: 0.1, momentum: 0.5, prediction: { kind: 'pipeoptim', stage: 0, stages: 4 } });
  stepWith(sgd, 2); // m = 2, w = 0.8, w_hat = 0.8 - 0.1*3*2
  t.ok(Math.abs(wHat(sgd) - 0.2) < TOL, `sgd: ${wHat(sgd)}`);

  const adam = new Adam(single(1), { lr: 0.1, betas: [0.5, 0.5], eps: 1e-12, prediction: { kind: 'pipeoptim', stage: 0, stages: 4 } });
  stepWith(adam, 2); // w = 0.9, D = m_hat/sqrt(v_hat) = 1: w_hat = 0.9 - 0.3
  t.ok(Math.abs(wHat(adam) - 0.6) < TOL, `adam: ${wHat(adam)}`);

  const adamw = new AdamW(single(1), {
    lr: 0.1,
    weightDecay: 0.5,
    betas: [0.5, 0.5],
    eps: 1e-12,
    prediction: { kind: 'pipeoptim', stage: 0, stages: 4 },
  });
  stepWith(adamw, 2); // w = 0.95 - 0.1 = 0.85; w_hat = 0.85*0.95^3 - 0.3
  t.ok(Math.abs(w(adamw) - 0.85) < TOL);
  t.ok(Math.abs(wHat(adamw) - (0.85 * 0.95 ** 3 - 0.3)) < TOL, `adamw: ${wHat(adamw)}`);

  const last = new SGD(single(1), { lr: 0.1, momentum: 0.5, prediction: { kind: 'pipeoptim', stage: 3, stages: 4 } });
  stepWith(last, 2);
  t.equal(wHat(last), w(last), 'the last stage predicts nothing');
});

t.test('SpecTrain: forward s = floor(k/2) + S-k-1, backward s = floor(k/2)', async (t) => {
  const fwd = new SGD(single(1), { lr: 0.1, momentum: 0.5, prediction: { kind: 'spectrain', stage: 3, stages: 6 } });
  stepWith(fwd, 2); // s = 1 + 2 = 3: w_hat = 0.8 - 0.1*3*2
  t.ok(Math.abs(wHat(fwd) - 0.2) < TOL, `forward: ${wHat(fwd)}`);
  const bwd = new SGD(single(1), { lr: 0.1, momentum: 0.5, prediction: { kind: 'spectrain', stage: 3, stages: 6, pass: 'backward' } });
  stepWith(bwd, 2); // s = 1
  t.ok(Math.abs(wHat(bwd) - 0.6) < TOL, `backward: ${wHat(bwd)}`);
});

t.test('spike compensation: a = mu^D, b = (1 - mu^D)/(1 - mu)', async (t) => {
  const sc = new SGD(single(1), { lr: 0.1, momentum: 0.5, spikeCompensation: { delay: 2 } });
  stepWith(sc, 2); // a = 0.25, b = 1.5; m = 2; w = 1 - 0.1*(0.5 + 3)
  t.ok(Math.abs(w(sc) - 0.65) < TOL, `step 1: ${w(sc)}`);
  stepWith(sc, 1); // m = 1 + 1 = 2; w = 0.65 - 0.1*(0.5 + 1.5)
  t.ok(Math.abs(w(sc) - 0.45) < TOL, `step 2: ${w(sc)}`);
});

t.test('spike compensation with D = 0 is plain momentum and with D = 1 is Nesterov', async (t) => {
  const grads = [0.3, -1.2, 2.5, 0.7, -0.1, 1.9];
  const pairs: [SGD, SGD][] = [
    [new SGD(single(1), { lr: 0.05, momentum: 0.9, spikeCompensation: { delay: 0 } }), new SGD(single(1), { lr: 0.05, momentum: 0.9 })],
    [new SGD(single(1), { lr: 0.05, momentum: 0.9, spikeCompensation: { delay: 1 } }), new SGD(single(1), { lr: 0.05, momentum: 0.9, nesterov: true })],
  ];
  for (const [a, b] of pairs) {
    for (const g of grads) {
      stepWith(a, g);
      stepWith(b, g);
    }
    t.ok(Math.abs(w(a) - w(b)) < TOL, `${w(a)} vs ${w(b)}`);
  }
});

t.test('SC + linear weight prediction with D_k from the stage', async (t) => {
  const D = pipelinedBackpropDelay(0, 2);
  t.equal(D, 3);
  t.equal(pipelinedBackpropDelay(1, 2), 1);
  const opt = new SGD(single(1), { lr: 0.1, momentum: 0.5, spikeCompensation: { delay: D }, prediction: { kind: 'linear', steps: D } });
  stepWith(opt, 2); // a = 0.125, b = 1.75: w = 1 - 0.1*(0.25 + 3.5) = 0.625; w_hat = 0.625 - 0.1*3*2
  t.ok(Math.abs(w(opt) - 0.625) < TOL, `w = ${w(opt)}`);
  t.ok(Math.abs(wHat(opt) - 0.025) < TOL, `w_hat = ${wHat(opt)}`);
});

t.test('first-step semantics', async (t) => {
  const damp = new SGD(single(1), { lr: 0.1, momentum: 0.5, dampening: 0.5 });
  stepWith(damp, 2); // first step: m = d (no dampening), w = 0.8
  t.equal(damp.stateBuffer('momentum')!.array[0], 2);
  t.ok(Math.abs(w(damp) - 0.8) < TOL);
  stepWith(damp, 2); // m = 0.5*2 + 0.5*2 = 2; w = 0.6
  t.ok(Math.abs(w(damp) - 0.6) < TOL);

  const adam = new Adam(single(1), { lr: 0.01 });
  stepWith(adam, 123); // bias correction makes the first step lr * g/|g|
  t.ok(Math.abs(w(adam) - 0.99) < TOL, `adam first step: ${w(adam)}`);

  const predicted = new SGD(single(3), { lr: 0.1, momentum: 0.5, prediction: { kind: 'sapipe', estimate: 'prev-sync' } });
  t.equal(wHat(predicted), 3, 'before the first step the forward weights are the real weights');
  predicted.params.get('w').data[0] = 1; // weights set after the optimizer was made
  t.equal(wHat(predicted), 1);
  t.equal(predicted.steps, 0);
  stepWith(predicted, 2);
  t.equal(predicted.steps, 1);
});

t.test('the learning rate can change between steps', async (t) => {
  const opt = new SGD(single(1), { lr: 0.1 });
  stepWith(opt, 1);
  opt.lr = 0.5;
  stepWith(opt, 1);
  t.ok(Math.abs(w(opt) - 0.4) < TOL);
  t.equal(opt.lr, 0.5);
});

t.test("Pipelined Backpropagation's small-batch scaling rule, by hand", async (t) => {
  const { pipelinedBackpropScaling, InvalidArgumentError } = await import('../../dist/index.js');
  // From (lr 0.1, mu 0.9) at batch 128 to batch 1: mu = 0.9^(1/128), lr = 0.1 * (1/128) * (1 - mu) / 0.1.
  const mu = 0.9 ** (1 / 128);
  const r = pipelinedBackpropScaling({ lr: 0.1, momentum: 0.9, batch: 128 }, 1);
  t.ok(Math.abs(r.momentum - mu) < 1e-15, `momentum ${r.momentum}`);
  t.ok(Math.abs(r.lr - (0.1 / 128) * (1 - mu) / 0.1) < 1e-15, `lr ${r.lr}`);
  t.equal(r.batch, 1);
  const same = pipelinedBackpropScaling({ lr: 0.05, momentum: 0.8, batch: 32 }, 32);
  t.ok(Math.abs(same.lr - 0.05) < 1e-15 && Math.abs(same.momentum - 0.8) < 1e-15, 'the same batch keeps the hyperparameters');
  // The per-sample decay is kept: mu_b^(B/b) = mu_B.
  t.ok(Math.abs(pipelinedBackpropScaling({ lr: 1, momentum: 0.99, batch: 64 }, 4).momentum ** 16 - 0.99) < 1e-12);
  t.throws(() => pipelinedBackpropScaling({ lr: 0.1, momentum: 1, batch: 8 }, 1), InvalidArgumentError, 'momentum 1 has no rule');
  t.throws(() => pipelinedBackpropScaling({ lr: 0.1, momentum: 0.9, batch: 8 }, 0), InvalidArgumentError, 'batch 0');
});
