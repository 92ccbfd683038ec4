/**
 * What test/fixtures/packaging/user-loop.mjs must end with, computed in plain TypeScript (float64):
 * two ranks, two accumulated micro-batches per update, the averaged gradient clipped to norm 1,
 * PyTorch's momentum SGD, and the schedule warm-up (2 steps from 0.5) then cosine (4 steps to 0.1).
 * In `sapipe-wp` each gradient is applied one update late, by the overlapped update (the default,
 * clipping included) that its own step() started, so with the learning rate in force at that
 * step(): the same rate as in `sync`. The gradients here do not depend on the weights, so the
 * weights end equal to sync's (the update at step(), `overlapUpdate: false`, would use the rate
 * one scheduler step later).
 */
const N = 8, UPDATES = 6, MICRO = 2, RANKS = 2, CLIP = 1, LR = 0.1, MU = 0.9;
const gradient = (rank: number, u: number, m: number, i: number): number => Math.sin(1 + 0.5 * i + 1.1 * rank + 0.7 * u + 0.3 * m);

function factor(t: number): number {
  if (t < 2) return 0.5 + (0.5 * t) / 2;
  const s = t - 2;
  return s >= 4 ? 0.1 : 0.1 + (0.9 * (1 + Math.cos((Math.PI * s) / 4))) / 2;
}

function appliedGradient(u: number): number[] {
  const g = Array.from({ length: N }, (_, i) => {
    let sum = 0;
    for (let r = 0; r < RANKS; r++) for (let m = 0; m < MICRO; m++) sum += gradient(r, u, m, i);
    return sum / (RANKS * MICRO);
  });
  const norm = Math.sqrt(g.reduce((a, x) => a + x * x, 0));
  return norm > CLIP ? g.map((x) => (x * CLIP) / (norm + 1e-6)) : g;
}

export function referenceUserLoop(mode: 'sync' | 'sapipe-wp'): number[] {
  const w = new Array<number>(N).fill(0.5);
  let m: number[] | undefined;
  const step = (g: number[], lr: number): void => {
    m = m === undefined ? [...g] : m.map((x, i) => MU * x + g[i]!);
    for (let i = 0; i < N; i++) w[i]! -= lr * m[i]!;
  };
  // sync: update u at its step(), lr factor(u). sapipe-wp: update u started at the step() of
  // iteration u with lr factor(u), put in place at the next step() (the last by flush()).
  void mode;
  for (let u = 0; u < UPDATES; u++) step(appliedGradient(u), LR * factor(u));
  return w;
}
