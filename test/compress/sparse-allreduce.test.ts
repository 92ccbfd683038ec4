/**
 * sparseAllreduce over real local ranks (worker threads), against a plain-TypeScript reference of
 * the exchange: every rank's output is the fp32 sum, in rank order, of each rank's selected
 * elements of x = g + r scaled by 1/size; the selection has exactly k elements, recall >= 0.95
 * against the exact top-k of x; with error feedback the residual is x with the sent elements
 * zeroed (checked bit for bit), over 20 steps on 1-4 ranks. A NaN on one rank puts it at its place in
 * every rank's output (every other element finite), leaves that rank's residual as it was and puts the others' selections back into
 * theirs. A bad residual on one rank is refused on that rank before the exchange, and its peers
 * fail with a typed error instead of waiting forever.
 */
import t from 'tap';

import { spawnLocalRanks } from '../../dist/index.js';
import { exactTopk, scatterAddRef } from '../reference/topk.js';

const FIXTURE = new URL('../fixtures/compress/sparse-rank.mjs', import.meta.url);

interface StepMessage {
  step: number;
  grad?: number[];
  residualBefore?: number[];
  residualAfter?: number[];
  out?: number[];
  result?: { nonFiniteCount: number; k: number; bytes: number };
  error?: string;
  done?: boolean;
}

async function run(size: number, data: Record<string, unknown>): Promise<StepMessage[][]> {
  const workers = spawnLocalRanks(FIXTURE, size, { workerData: data });
  const out: StepMessage[][] = workers.map(() => []);
  await Promise.all(
    workers.map(
      (w, rank) =>
        new Promise<void>((resolve) => {
          w.on('message', (m: StepMessage) => {
            if (m.done) resolve();
            else out[rank]!.push(m);
          });
          w.on('error', (e) => {
            out[rank]!.push({ step: -1, error: String(e) });
            resolve();
          });
          w.on('exit', () => resolve());
        }),
    ),
  );
  await Promise.all(workers.map((w) => w.terminate()));
  return out;
}

const LENGTH = 4099; // odd: vector tails
const DENSITY = 0.01;
const K = Math.round(DENSITY * LENGTH);

for (const size of [1, 2, 3, 4]) {
  for (const errorFeedback of [true, false]) {
    t.test(`${size} rank(s), ${errorFeedback ? 'with' : 'without'} error feedback: 20 steps equal the reference exchange`, async (t) => {
      const steps = 20;
      const ranks = await run(size, { length: LENGTH, density: DENSITY, steps, errorFeedback });
      for (let step = 0; step < steps; step++) {
        const msgs = ranks.map((r) => r[step]!);
        t.ok(msgs.every((m) => m && !m.error), `step ${step}: every rank finished (${msgs.map((m) => m?.error).filter(Boolean).join(', ')})`);
        if (!msgs.every((m) => m && !m.error)) return;
        const expected = new Float32Array(LENGTH);
        let sentOk = true;
        let recallOk = true;
        let residualOk = true;
        for (const m of msgs) {
          const x = Float32Array.from(m.grad!, (g, i) => Math.fround(g + (m.residualBefore?.[i] ?? 0)));
          // What was sent: known exactly with a residual (zeroed there); without one, recomputed
          // from the output below through the reference top-k's candidates.
          let sent: number[];
          if (errorFeedback) {
            sent = [];
            for (let i = 0; i < LENGTH; i++) if (m.residualAfter![i] !== x[i]) sent.push(i);
            for (let i = 0; i < LENGTH; i++) {
              const kept = sent.includes(i) ? 0 : x[i]!;
              if (!Object.is(m.residualAfter![i], kept)) residualOk = false;
            }
          } else {
            // Without a residual every x value at a selected index is sent; with size 1 the output is exactly x there.
            sent = [];
            if (size === 1) for (let i = 0; i < LENGTH; i++) if (m.out![i] !== 0) sent.push(i);
          }
          if (errorFeedback || size === 1) {
            if (sent.length !== K) sentOk = false;
            const exact = new Set(exactTopk(x, K));
            if (sent.filter((i) => exact.has(i)).length / K < 0.95) recallOk = false;
            scatterAddRef(expected, sent, sent.map((i) => x[i]!), 1 / size);
          }
        }
        if (!(errorFeedback || size === 1)) {
          // Without error feedback the selections are not observable on each rank; the outputs must still agree.
          t.ok(msgs.every((m) => m.out!.every((v, i) => Object.is(v, msgs[0]!.out![i]))), `step ${step}: every rank holds the same average`);
          t.ok(msgs[0]!.out!.filter((v) => v !== 0).length <= size * K, `step ${step}: at most size x k elements are non-zero`);
          continue;
        }
        t.ok(sentOk, `step ${step}: every rank sent exactly k = ${K}`);
        t.ok(recallOk, `step ${step}: recall >= 0.95 on every rank`);
        t.ok(residualOk, `step ${step}: every residual is x with the sent elements zeroed, bit for bit`);
        let worst = 0;
        for (const m of msgs) for (let i = 0; i < LENGTH; i++) if (!Object.is(m.out![i], expected[i])) worst++;
        t.equal(worst, 0, `step ${step}: every rank's output equals the reference sum in rank order, bit for bit`);
        t.same(msgs.map((m) => m.result), msgs.map(() => ({ nonFiniteCount: 0, k: K, bytes: (2 * K + 3) * size * 4 })), `step ${step}: results`);
      }
    });
  }
}

t.test('a NaN on one rank: at its place on every rank, its residual unchanged, the others keep what they selected', async (t) => {
  const size = 3;
  const ranks = await run(size, { length: LENGTH, density: DENSITY, steps: 3, errorFeedback: true, nanAt: { step: 1, rank: 2, index: 77 } });
  const at = ranks.map((r) => r[1]!);
  t.ok(at.every((m) => m.result?.nonFiniteCount === 1), 'every rank counts the one NaN');
  t.ok(at.every((m) => Number.isNaN(m.out![77]) && m.out!.every((v, i) => i === 77 || Number.isFinite(v))), 'every rank\'s average holds the NaN where it was and nothing else non-finite, so every guard skips the step');
  t.ok(at[2]!.residualAfter!.every((v, i) => Object.is(v, at[2]!.residualBefore![i])), 'the rank with the NaN left its residual as it was');
  for (const r of [0, 1]) {
    const m = at[r]!;
    const x = Float32Array.from(m.grad!, (g, i) => Math.fround(g + m.residualBefore![i]!));
    t.ok(m.residualAfter!.every((v, i) => Object.is(v, x[i])), `rank ${r}: its residual holds all of x (nothing was sent)`);
  }
  t.ok(ranks.every((r) => r[2] && !r[2].error && r[2].result!.nonFiniteCount === 0), 'the next step runs normally on every rank');
});

t.test('a bad residual on one rank is refused there before the exchange; its peers fail typed, not hang', async (t) => {
  const started = Date.now();
  const ranks = await run(2, { length: 257, density: 0.05, steps: 1, errorFeedback: true, badResidualRank: 1 });
  t.equal(ranks[1]![0]!.error, 'ERR_SIZE_MISMATCH', 'the bad rank: ERR_SIZE_MISMATCH');
  t.match(ranks[0]![0]!.error, /^ERR_(PEER_LOST|TIMEOUT)$/, `its peer: ${ranks[0]![0]!.error}`);
  t.ok(Date.now() - started < 20_000, 'within the timeout');
});

// The hierarchical form: 2 hosts x 2 ranks (local groups stand in for hosts). Host h's ranks
// average their gradients by a reduce-scatter (rank j of the host keeps part j), select the top-k
// of their part (x = part + residual) and exchange it with the ranks of the same part on the
// other hosts; an all-gather puts the parts together.
t.test('hierarchical, 2 hosts x 2 ranks: 20 steps equal the reference (host means, top-k per part, mean over hosts), bit for bit', async (t) => {
  const hosts = 2;
  const L = 2;
  const steps = 20;
  const part = Math.ceil(LENGTH / L);
  const k = Math.round(DENSITY * part);
  const ranks = await run(hosts * L, { length: LENGTH, density: DENSITY, steps, errorFeedback: true, hosts });
  for (let step = 0; step < steps; step++) {
    const msgs = ranks.map((r) => r[step]!);
    if (!msgs.every((m) => m && !m.error)) {
      t.fail(`step ${step}: ${msgs.map((m) => m?.error).join(', ')}`);
      return;
    }
    const expected = new Float32Array(part * L);
    let ok = true;
    for (let j = 0; j < L; j++) {
      for (let h = 0; h < hosts; h++) {
        // The host's mean of part j (2 ranks: the sum's order does not matter), plus the residual of rank (h, j).
        const m = msgs[h * L + j]!;
        const mean = (i: number): number => {
          const at = j * part + i;
          if (at >= LENGTH) return 0;
          return Math.fround(Math.fround(msgs[h * L]!.grad![at]! + msgs[h * L + 1]!.grad![at]!) * 0.5);
        };
        const x = Float32Array.from({ length: part }, (_, i) => Math.fround(mean(i) + m.residualBefore![i]!));
        const sent: number[] = [];
        for (let i = 0; i < part; i++) if (m.residualAfter![i] !== x[i]) sent.push(i);
        if (sent.length !== k) ok = false;
        const exact = new Set(exactTopk(x, k));
        if (sent.filter((i) => exact.has(i)).length / k < 0.95) ok = false;
        const slice = expected.subarray(j * part, (j + 1) * part);
        scatterAddRef(slice, sent, sent.map((i) => x[i]!), 1 / hosts);
      }
    }
    t.ok(ok, `step ${step}: every rank sent exactly k = ${k} of its part, recall >= 0.95`);
    let bad = 0;
    for (const m of msgs) for (let i = 0; i < LENGTH; i++) if (!Object.is(m.out![i], expected[i])) bad++;
    t.equal(bad, 0, `step ${step}: every rank holds the reference average, bit for bit`);
    t.ok(msgs.every((m) => m.result!.k === k && m.result!.nonFiniteCount === 0), `step ${step}: results`);
  }
});

t.test('hierarchical: a NaN on one rank skips the step everywhere and every residual keeps what it selected', async (t) => {
  const ranks = await run(4, { length: LENGTH, density: DENSITY, steps: 3, errorFeedback: true, hosts: 2, nanAt: { step: 1, rank: 3, index: 5 } });
  const at = ranks.map((r) => r[1]!);
  t.ok(at.every((m) => m.result!.nonFiniteCount > 0 && at.every((o) => o.out!.every((v, i) => Object.is(v, m.out![i])))), 'every rank counts it and holds the same buffer');
  t.ok(at.every((m) => m.out!.some((v) => Number.isNaN(v))), 'which holds the NaN, so every guard skips the step');
  // Nothing was applied: each residual holds all of its x (the host's mean part plus the previous
  // residual), or, on the rank whose part holds the NaN (host 1, part 0: rank 2), is unchanged.
  const part = Math.ceil(LENGTH / 2);
  at.forEach((m, r) => {
    const [h, j] = [Math.floor(r / 2), r % 2];
    const x = Float32Array.from({ length: part }, (_, i) => {
      const g = j * part + i < LENGTH ? Math.fround(Math.fround(at[h * 2]!.grad![j * part + i]! + at[h * 2 + 1]!.grad![j * part + i]!) * 0.5) : 0;
      return Math.fround(g + m.residualBefore![i]!);
    });
    const want = x.some((v) => !Number.isFinite(v)) ? Float32Array.from(m.residualBefore!) : x;
    t.ok(m.residualAfter!.every((v, i) => Object.is(v, want[i])), `rank ${r}: its residual ${r === 2 ? 'is unchanged (its part held the NaN)' : 'holds all of x'}, bit for bit`);
  });
  t.ok(ranks.every((r) => r[2] && !r[2].error && r[2].result!.nonFiniteCount === 0), 'the next step runs normally on every rank');
});
