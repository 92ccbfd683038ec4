/**
 * Pruning old checkpoints never removes the step being saved: a job started afresh in a directory
 * holding newer steps of an earlier run saves its first steps below them, and rank 0's pruning once
 * removed the step the other ranks were still writing (their save failed with ENOENT).
 */
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import t from 'tap';

import { pruneSteps, saveRankFile, stepDirectory } from '../../dist/checkpoint/store.js';

t.test('a step older than the kept ones, being saved, survives rank 0 pruning', async (t) => {
  const dir = mkdtempSync(path.join(tmpdir(), 'sapipe-prune-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const bytes = [new Uint8Array([1, 2, 3])];
  // An earlier run's complete steps 2 and 3 (two ranks), and the new run's step 1: rank 0 done, rank 1 still writing.
  for (const step of [2, 3]) for (const rank of [0, 1]) await saveRankFile(dir, step, rank, 2, 'test', bytes);
  await saveRankFile(dir, 1, 0, 2, 'test', bytes);
  await pruneSteps(dir, 2, 2, 1);
  t.ok(existsSync(stepDirectory(dir, 1)), 'the step being saved is still there');
  await saveRankFile(dir, 1, 1, 2, 'test', bytes);
  t.ok(existsSync(path.join(stepDirectory(dir, 1), 'rank-1.json')), "and rank 1's save of it completes");
  // The usual case: the newest step saved, older ones beyond `keep` go.
  for (const rank of [0, 1]) await saveRankFile(dir, 4, rank, 2, 'test', bytes);
  await pruneSteps(dir, 2, 2, 4);
  t.same([1, 2, 3, 4].filter((s) => existsSync(stepDirectory(dir, s))), [3, 4], 'keeps the newest two complete steps');
});
