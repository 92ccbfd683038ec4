/**
 * createCommunicator (the init_process_group of sapipe) and runLocalRanks (its mp.spawn): real
 * worker-thread ranks and real launched processes.
 */
import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import t from 'tap';

import { backendStatuses, createCommunicator, RankFailedError, runLocalRanks } from '../../dist/index.js';

const rankScript = new URL('../fixtures/comm/create-rank.mjs', import.meta.url);

t.test('runLocalRanks: three ranks join with createCommunicator() and all-reduce', async (t) => {
  await t.resolves(runLocalRanks(rankScript, 3, { workerData: { behaviour: 'ok' }, timeoutMs: 60_000 }));
});

t.test('runLocalRanks: a rank that throws fails the run with its rank and error; the rest are stopped', async (t) => {
  const error = await runLocalRanks(rankScript, 3, { workerData: { behaviour: 'throw' }, timeoutMs: 60_000 }).catch((e: unknown) => e);
  t.ok(error instanceof RankFailedError);
  t.equal((error as RankFailedError).code, 'ERR_RANK_FAILED');
  t.equal((error as RankFailedError).rank, 1);
  t.match((error as Error).message, /rank 1 of 3 threw: rank 1 failed on purpose/);
  t.match(((error as Error).cause as Error).message, /failed on purpose/);
});

t.test('runLocalRanks: a rank that exits with a code fails the run', async (t) => {
  await t.rejects(runLocalRanks(rankScript, 2, { workerData: { behaviour: 'exit' }, timeoutMs: 60_000 }), {
    code: 'ERR_RANK_FAILED',
    rank: 1,
    message: /rank 1 of 2 exited with code 3/,
  });
});

t.test('runLocalRanks: a job that has not ended by timeoutMs is stopped', async (t) => {
  const started = Date.now();
  await t.rejects(runLocalRanks(rankScript, 2, { workerData: { behaviour: 'hang' }, timeoutMs: 1500 }), {
    code: 'ERR_RANK_FAILED',
    message: /had not ended after 1500 ms/,
  });
  t.ok(Date.now() - started < 30_000, 'bounded');
});

t.test('runLocalRanks: bad arguments', async (t) => {
  await t.rejects(runLocalRanks(rankScript, 0), { code: 'ERR_INVALID_ARGUMENT' });
  await t.rejects(runLocalRanks(rankScript, 2, { timeout: 5 } as never), { code: 'ERR_INVALID_ARGUMENT', message: /did you mean 'timeoutMs'/ });
  await t.rejects(runLocalRanks(null as never, 2), { code: 'ERR_INVALID_ARGUMENT' });
});

t.test('createCommunicator outside any launcher says how to start the ranks', async (t) => {
  for (const backend of ['auto', 'local', 'ucx'] as const)
    await t.rejects(createCommunicator(backend), { code: 'ERR_INVALID_ARGUMENT', message: /sapipe launch --nproc N script\.js.*runLocalRanks/ }, backend);
  await t.rejects(createCommunicator('gloo' as never), { code: 'ERR_INVALID_ARGUMENT' });
});

const ucx = backendStatuses().find((s) => s.name === 'ucx');
t.test('createCommunicator() in processes started by sapipe launch picks ucx', async (t) => {
  const bin = fileURLToPath(new URL('../../bin/sapipe.js', import.meta.url));
  const { code, stdout, stderr } = await new Promise<{ code: number; stdout: string; stderr: string }>((resolve) =>
    execFile(process.execPath, [bin, 'launch', '--nproc', '2', fileURLToPath(rankScript)], { timeout: 120_000 }, (error, stdout, stderr) =>
      resolve({ code: error ? Number((error as { code?: number }).code ?? 1) : 0, stdout, stderr }),
    ),
  );
  if (ucx?.available) {
    t.equal(code, 0, stderr);
    t.match(stdout, /rank 0 backend ucx sum 3/);
    t.match(stdout, /rank 1 backend ucx sum 3/);
  } else {
    // Where the plugin is missing (never under CI, which installs UCX), the error says what to do.
    t.not(code, 0);
    t.match(stderr, /needs the ucx backend.*npm run build:native/s);
  }
});
