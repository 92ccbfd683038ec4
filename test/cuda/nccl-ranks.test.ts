/**
 * Two ranks of an NCCL job, as two processes on two GPUs (test/fixtures/cuda/nccl-rank.mjs, which
 * imports dist/: run `npm run build` first): the unique id through the rendezvous store, every
 * collective, the fused replicated and sharded steps against the host step on the averaged
 * gradient, and a peer that dies (the survivor's collective rejects with ERR_PEER_LOST or
 * ERR_TIMEOUT within the timeout, and every later one with ERR_PEER_LOST). Needs two GPUs and
 * NCCL, or the CUDA plugin over host memory (nccl-ranks-emulated.test.ts runs this file on it:
 * each process's cuda:0 is its own host memory, the ranks meet over Unix sockets); elsewhere each
 * test asserts why it cannot run.
 */
import { execFile } from 'node:child_process';
import { createServer } from 'node:net';
import { fileURLToPath } from 'node:url';
import t, { type Test } from 'tap';

import { cudaStatus, probeNccl } from '../../dist/device/index.js';

const fixture = fileURLToPath(new URL('../fixtures/cuda/nccl-rank.mjs', import.meta.url));
const status = cudaStatus();
const nccl = probeNccl();
const usableGpus = status.devices?.filter((d) => d.kernelsAvailable).length ?? 0;
// The host-memory plugin's NCCL joins processes that each have only cuda:0.
const emulated = status.architectures === 'host-memory emulation';

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      server.close(() => (typeof address === 'object' && address ? resolve(address.port) : reject(new Error('no port'))));
    });
  });
}

async function runRanks(scenario: string): Promise<Record<string, unknown>[]> {
  const port = await freePort();
  return Promise.all(
    [0, 1].map(
      (rank) =>
        new Promise<Record<string, unknown>>((resolve) => {
          const env = { ...process.env, RANK: String(rank), WORLD_SIZE: '2', MASTER_PORT: String(port), ...(emulated ? { SAPIPE_TEST_DEVICE: 'cuda:0' } : {}) };
          execFile(process.execPath, [fixture, scenario], { env, timeout: 60_000 }, (error, stdout) => {
            const line = stdout.trim().split('\n').pop() ?? '';
            try {
              resolve(JSON.parse(line) as Record<string, unknown>);
            } catch {
              resolve({ rank, error: `no result (${String(error)}): ${stdout}` });
            }
          });
        }),
    ),
  );
}

function twoGpuTest(name: string, fn: (t: Test) => Promise<void>): void {
  t.test(name, async (t) => {
    if (!emulated && (usableGpus < 2 || !nccl.available)) {
      // Not a silent pass: say exactly what is missing.
      if (!status.available) t.match(status.reason, /plugin|libcuda|device/, `no usable GPU: ${status.reason ?? ''}`);
      else if (usableGpus < 2) t.ok(usableGpus < 2, `only ${usableGpus} usable GPU(s): two are needed`);
      else t.match(nccl.reason, /NCCL/, `NCCL unavailable: ${nccl.reason ?? ''}`);
      return;
    }
    await fn(t);
  });
}

twoGpuTest('two ranks: every collective', async (t) => {
  const [r0, r1] = await runRanks('allreduce');
  for (const r of [r0!, r1!]) {
    t.notOk(r.error, `rank ${String(r.rank)}: ${String(r.error ?? 'ok')}`);
    t.equal(r.sum, 3, 'allreduce sum');
    // Both ranks hold 3s after the all-reduce: each part of the reduce-scatter sums two of them.
    t.equal(r.scattered, 6, 'reduceScatter');
    t.equal(r.gathered, 6, 'allgather');
    t.equal(r.broadcast, 1, 'broadcast from rank 1');
    t.equal(r.p2p, 10, 'send from 0 to 1');
  }
});

twoGpuTest('two ranks: the fused steps equal the host step on the average gradient', async (t) => {
  for (const r of await runRanks('step')) {
    t.notOk(r.error, `rank ${String(r.rank)}: ${String(r.error ?? 'ok')}`);
    t.ok((r.replicated as number) <= 1, `replicated within tolerance (${String(r.replicated)})`);
    t.ok((r.sharded as number) <= 1, `sharded within tolerance (${String(r.sharded)})`);
  }
});

twoGpuTest('two ranks: DataParallelTrainer reducing each bucket behind the backward equals the one waiting for it, on every rank', async (t) => {
  const [r0, r1] = await runRanks('trainer');
  for (const r of [r0!, r1!]) t.notOk(r.error, `rank ${String(r.rank)}: ${String(r.error ?? 'ok')}`);
  for (const mode of ['sync', 'sapipe-dc']) {
    type Run = { weights: number[]; skipped: number[]; follows: boolean };
    const [behind0, after0, behind1, after1] = [r0, r0, r1, r1].map((r, i) => (r![`${mode} ${i % 2 === 0 ? 'behind' : 'after'}`] as Run | undefined) ?? { weights: [], skipped: [], follows: false });
    t.ok(behind0!.follows && !after0!.follows, `${mode}: one trainer follows the backward, the other waits for it`);
    t.same(behind0!.skipped, [mode === 'sync' ? 4 : 5], `${mode}: rank 1's NaN skipped the update on every rank`);
    t.same(behind1!.skipped, behind0!.skipped, `${mode}: rank 1 skipped it too`);
    t.ok(behind0!.weights.length > 0, `${mode}: weights reported`);
    t.same(behind0!.weights, after0!.weights, `${mode}: the same weights either way, bit for bit`);
    t.same(behind1!.weights, behind0!.weights, `${mode}: and on both ranks`);
    t.same(after1!.weights, after0!.weights, `${mode}: (the trainer waiting for the backward too)`);
  }
  for (const r of [r0!, r1!])
    t.match(r.mixed, /^ERR_INVALID_ARGUMENT: DataParallelTrainer\.create: rank 0 reduces each bucket behind the backward and rank 1 does not/, `rank ${String(r.rank)}: ranks that chose differently are refused on every rank`);
});

twoGpuTest('two ranks: a peer that dies fails the survivor within the timeout, never a hang', async (t) => {
  const [r0] = await runRanks('peer-lost');
  t.notOk(r0!.error, String(r0!.error ?? 'ok'));
  t.match(r0!.first, /^ERR_(PEER_LOST|TIMEOUT)$/);
  t.equal(r0!.second, 'ERR_PEER_LOST', 'the aborted communicator refuses later operations');
});
