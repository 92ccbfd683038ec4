/** Runs a scenario of test/fixtures/comm/rank.ts on n local ranks (worker threads). */
import type { Worker } from 'node:worker_threads';

import { spawnLocalRanks } from '../../dist/index.js';

const FIXTURE = new URL('../fixtures/comm/rank.ts', import.meta.url);

export type RankMessage = Record<string, unknown>;

/** Resolves with every rank's messages once each posts `done` or an error (or exits). */
export function runRanks(
  n: number,
  workerData: Record<string, unknown>,
  onMessage?: (rank: number, msg: RankMessage, workers: Worker[]) => void,
): Promise<RankMessage[][]> {
  const workers = spawnLocalRanks(FIXTURE, n, { workerData });
  const out: RankMessage[][] = workers.map(() => []);
  return Promise.all(
    workers.map(
      (w, rank) =>
        new Promise<void>((resolve) => {
          w.on('message', (msg: RankMessage) => {
            out[rank]!.push(msg);
            onMessage?.(rank, msg, workers);
            if (msg.done || msg.error) resolve();
          });
          w.on('exit', () => resolve());
          w.on('error', (e) => {
            out[rank]!.push({ error: String(e) });
            resolve();
          });
        }),
    ),
  ).then(async () => {
    await Promise.all(workers.map((w) => w.terminate()));
    return out;
  });
}
