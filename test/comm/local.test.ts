/**
 * The local backend with real worker threads: every collective against a plain reference for
 * sizes 0, 1, odd and large and world sizes 1-4, point-to-point ordering, size mismatches, use
 * after destroy(), a rank terminated mid-collective, and the fused all-reduce + update against the
 * reference update of the all-reduced average.
 */
import t from 'tap';

import { emulatedMs, FlatBuffer, InvalidArgumentError, LocalCommunicator, TimeoutError } from '../../dist/index.js';
import { fusedReference, worstRatio } from '../helpers/fused-reference.js';
import { runRanks, type RankMessage } from '../helpers/local-ranks.js';

type Msg = RankMessage;

const fill = (len: number, r: number, salt: number): number[] => Array.from({ length: len }, (_, i) => ((i * 7 + r * 13 + salt) % 101) - 50);

t.test('every collective is correct for sizes 0, 1, odd and large on 1-4 ranks', async (t) => {
  const sizes = [0, 1, 17, 1001, 70_003];
  for (const n of [1, 2, 3, 4]) {
    const results = await runRanks(n, { scenario: 'collectives', sizes });
    for (let rank = 0; rank < n; rank++) {
      const msgs = results[rank]!.filter((m) => 'n' in m);
      t.equal(msgs.length, sizes.length, `world ${n} rank ${rank}: every size ran (${JSON.stringify(results[rank]!.find((m) => m.error))})`);
      for (const m of msgs) {
        const len = m.n as number;
        const ranks = Array.from({ length: n }, (_, r) => r);
        const sumOf = (l: number, salt: number): number[] => {
          const per = ranks.map((r) => fill(l, r, salt));
          return per[0]!.map((_, i) => per.reduce((a, p) => a + p[i]!, 0));
        };
        const sum = (salt: number): number[] => sumOf(len, salt);
        t.same(m.allreduce, sum(1), `allreduce sum n=${n} len=${len}`);
        t.equal(m.nonFinite, 0);
        const avg = sum(2).map((v) => Math.fround(v * Math.fround(1 / n)));
        const got = m.avg as number[];
        t.ok(got.every((v, i) => Math.abs(v - avg[i]!) <= 1e-6 * Math.max(1, Math.abs(avg[i]!))), `allreduce avg n=${n} len=${len}`);
        const rsFull = sumOf(len * n, 3);
        t.same(m.rs, rsFull.slice(rank * len, (rank + 1) * len), `reduceScatter n=${n} len=${len}`);
        t.same(m.ag, ranks.flatMap((r) => fill(len, r, 4)), `allgather n=${n} len=${len}`);
        t.same(m.bc, fill(len, n - 1, 5), `broadcast n=${n} len=${len}`);
      }
    }
  }
});

t.test('the ring algorithm over the local channels agrees with the direct one', async (t) => {
  const sizes = [0, 1, 33, 5003];
  for (const n of [2, 3]) {
    const results = await runRanks(n, { scenario: 'ring', sizes });
    for (let rank = 0; rank < n; rank++) {
      const msgs = results[rank]!.filter((m) => 'n' in m);
      t.equal(msgs.length, sizes.length, `ring world ${n}: ${JSON.stringify(results[rank]!.find((m) => m.error))}`);
      for (const m of msgs) {
        const len = m.n as number;
        const per = Array.from({ length: n }, (_, r) => fill(len, r, 1));
        t.same(m.allreduce, per[0]!.map((_, i) => per.reduce((a, p) => a + p[i]!, 0)));
      }
    }
  }
});

t.test('point-to-point messages arrive in order and intact', async (t) => {
  const results = await runRanks(3, { scenario: 'p2p' });
  for (const peer of [1, 2]) {
    const got = results[peer]!.find((m) => 'got' in m)?.got;
    t.same(got, Array.from({ length: 5 }, (_, k) => Array.from({ length: k + 1 }, (_, i) => peer * 100 + k * 10 + i)), `rank ${peer}`);
  }
});

t.test('a rank that leaves fails what waits on it, not the messages between the ranks that stay', async (t) => {
  // (A ring collective that the leaving rank has finished may still be finishing between the others.)
  const results = await runRanks(3, { scenario: 'leave' });
  const find = (rank: number, key: string): Record<string, unknown> | undefined => results[rank]!.find((m) => key in m);
  t.equal(find(2, 'send')?.send, 'none', 'rank 2 -> rank 0 still works after rank 1 left');
  t.equal(find(0, 'recv')?.recv, 'none');
  t.same(find(0, 'got')?.got, [7, 8, 9], 'and the message arrives intact');
  t.equal(find(2, 'recvFromGone')?.recvFromGone, 'ERR_PEER_LOST', 'a receive from the rank that left fails');
  t.equal(find(0, 'sendToGone')?.sendToGone, 'ERR_PEER_LOST', 'a send to it fails');
  for (const rank of [0, 2]) t.equal(find(rank, 'collective')?.collective, 'ERR_PEER_LOST', `rank ${rank}: a collective fails`);
});

t.test('mismatched sizes across ranks are ERR_SIZE_MISMATCH on every rank, and the group survives', async (t) => {
  const results = await runRanks(2, { scenario: 'mismatch' });
  for (const r of results) {
    t.equal(r.find((m) => 'code' in m)?.code, 'ERR_SIZE_MISMATCH');
    t.equal(r.find((m) => 'after' in m)?.after, 1);
  }
  const p2p = await runRanks(2, { scenario: 'p2p-mismatch' });
  for (const r of p2p) t.equal(r.find((m) => 'code' in m)?.code, 'ERR_SIZE_MISMATCH');
});

t.test('a rank terminated mid-collective makes the peer reject with ERR_PEER_LOST, without hanging', async (t) => {
  let waiting = false;
  let killed = false;
  const results = await runRanks(2, { scenario: 'die', timeoutMs: 10_000 }, (rank, msg, workers) => {
    if (rank === 0 && msg.waiting) waiting = true;
    if (waiting && !killed) {
      killed = true;
      // Let rank 0 enter the all-reduce before its peer disappears.
      setTimeout(() => void workers[1]!.terminate(), 100);
    }
  });
  const r0 = results[0]!.find((m) => 'codes' in m);
  t.same(r0?.codes, ['ERR_PEER_LOST', 'ERR_PEER_LOST']);
  t.ok((r0?.ms as number) < 5000, `rejected after ${String(r0?.ms)} ms, well before the 10 s timeout`);
});

t.test('a silent rank makes the others time out, and later operations fail at once', async (t) => {
  const a = await LocalCommunicator.create({ group: 'silent', rank: 0, size: 1 });
  a.destroy();
  const comm0 = LocalCommunicator.create({ group: 'silent-2', rank: 0, size: 2, timeoutMs: 300 });
  await t.rejects(comm0, TimeoutError);
});

t.test('creation options are checked (the calls every backend shares: test/comm/contract.test.ts)', async (t) => {
  await t.rejects(LocalCommunicator.create({ group: 'x', rank: 2, size: 2 }), InvalidArgumentError);
  await t.rejects(LocalCommunicator.create({ group: '', rank: 0, size: 1 }), InvalidArgumentError);
});

t.test('emulation delays a collective by the modelled ring time', async (t) => {
  t.ok(Math.abs(emulatedMs({ gbps: 8, latencyUs: 10 }, 'allreduce', 1e9, 2) - 1000.02) < 1e-6, 'all-reduce: 2(n-1)/n of the volume plus 2(n-1) latencies');
  t.ok(Math.abs(emulatedMs({ gbps: 8 }, 'broadcast', 1e6, 4) - 1) < 1e-9);
  // Two ranks on this thread (each communicator has its own native queue).
  const [a, b] = await Promise.all([0, 1].map((rank) => LocalCommunicator.create({ group: 'emu', rank, size: 2, emulate: { gbps: 1, latencyUs: 0 } })));
  const bufs = [FlatBuffer.allocate(1 << 20), FlatBuffer.allocate(1 << 20)];
  const start = performance.now();
  await Promise.all([a!.broadcast(bufs[0]!, 0), b!.broadcast(bufs[1]!, 0)]); // 4 MiB at 1 Gb/s: 33.6 ms
  t.ok(performance.now() - start >= 33, 'a 4 MiB broadcast at 1 Gb/s (emulated) takes at least 33 ms');
  a!.destroy();
  b!.destroy();
  await t.rejects(LocalCommunicator.create({ group: 'emu2', rank: 0, size: 1, emulate: { gbps: 0 } }), InvalidArgumentError);
});

t.test('the fused all-reduce + update equals all-reduce then the reference update', async (t) => {
  for (const guard of ['prescan', 'deferred'] as const) {
    const n = 3;
    const results = await runRanks(n, { scenario: 'fused', guard, nanRank: 1 });
    const ref = fusedReference(n);
    for (let rank = 0; rank < n; rank++) {
      const m = results[rank]!.find((x) => 'results' in x);
      t.ok(m, `${guard} rank ${rank}: ${JSON.stringify(results[rank]!.find((x) => x.error))}`);
      if (!m) continue;
      const res = m.results as { applied: boolean; nonFiniteCount: number }[];
      t.same(res.map((r) => r.applied), [true, true, false], `${guard}: the step with a NaN on rank 1 is skipped on every rank`);
      t.ok(res[2]!.nonFiniteCount > 0);
      const worst = worstRatio(m.weights as number[], ref.w);
      t.ok(worst <= 1, `${guard} rank ${rank}: weights within 1e-5 relative (+1e-6 absolute) of the reference (worst ratio ${worst.toFixed(3)})`);
      const worstPred = worstRatio(m.predicted as number[], ref.predicted);
      t.ok(worstPred <= 1, `${guard} rank ${rank}: predicted weights match too (worst ratio ${worstPred.toFixed(3)})`);
    }
  }
});
