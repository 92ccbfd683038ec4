/**
 * A pool of long-lived local ranks (worker threads) of a scenario fixture such as
 * test/fixtures/dataparallel/rank.ts: each rank posts one message when it is ready, then answers
 * every scenario posted to it with a message carrying the scenario's id. One pool serves a whole
 * test file; each scenario gets a fresh communicator group.
 */
import type { Worker } from 'node:worker_threads';

import { spawnLocalRanks } from '../../dist/index.js';

export type RankReply = Record<string, unknown>;

export interface ScenarioPool<S> {
  /** Posts `s` (with a fresh id and group) to every rank; resolves with each rank's reply, in rank order. */
  run(s: S): Promise<RankReply[]>;
  terminate(): Promise<unknown>;
}

let nextId = 0;

export function scenarioPool<S extends object>(fixture: URL, n: number, groupPrefix: string): ScenarioPool<S> {
  const workers: Worker[] = spawnLocalRanks(fixture, n);
  const ready = Promise.all(workers.map((w) => new Promise<void>((resolve) => w.once('message', () => resolve()))));
  return {
    async run(s) {
      await ready;
      const id = nextId++;
      const scenario = { ...s, id, group: `${groupPrefix}-${process.pid}-${id}` };
      return Promise.all(
        workers.map(
          (w) =>
            new Promise<RankReply>((resolve) => {
              const onMessage = (m: RankReply): void => {
                if (m.id !== id) return;
                w.off('message', onMessage);
                resolve(m);
              };
              w.on('message', onMessage);
              w.postMessage(scenario);
            }),
        ),
      );
    },
    terminate: () => Promise.all(workers.map((w) => w.terminate())),
  };
}
