/**
 * The communicator contract: what every backend must do alike, written once and run against each
 * (test/comm/contract.test.ts). On a group of one rank, so it runs in one process: results of
 * every collective, the non-finite count, and the typed error of every kind of bad call, then use
 * after destroy(). Multi-rank behaviour (sums across ranks, ordering, lost peers) stays in each
 * backend's own tests, where ranks are threads or processes.
 */
import type { Test } from 'tap';

import { AliasingError, type Communicator, DisposedError, FlatBuffer, InvalidArgumentError, SizeMismatchError } from '../../dist/index.js';

export async function communicatorContract(t: Test, comm: Communicator<FlatBuffer>): Promise<void> {
  t.equal(comm.rank, 0);
  t.equal(comm.size, 1);
  const b = FlatBuffer.from([1, 2, 3]);
  t.same((await comm.allreduce(b, { op: 'avg' })).nonFiniteCount, 0, 'allreduce of one rank: no non-finite value');
  t.same(Array.from(b.array), [1, 2, 3], 'allreduce of one rank leaves the buffer');
  t.same((await comm.allreduce(b, { offset: 1, count: 1 })).nonFiniteCount, 0, 'a range');
  const out = FlatBuffer.allocate(3);
  await comm.allgather(b, out);
  t.same(Array.from(out.array), [1, 2, 3], 'allgather of one rank copies');
  out.fill(0);
  await comm.reduceScatter(b, out);
  t.same(Array.from(out.array), [1, 2, 3], 'reduceScatter of one rank copies');
  await comm.broadcast(b, 0);
  await comm.barrier();
  b.array[1] = NaN;
  t.equal((await comm.allreduce(b)).nonFiniteCount, 1, 'a NaN is counted');

  const bad: [string, () => Promise<unknown>, new (...args: never[]) => Error][] = [
    ['an unknown op', () => comm.allreduce(b, { op: 'max' as 'sum' }), InvalidArgumentError],
    ['a range past the end', () => comm.allreduce(b, { offset: 2, count: 5 }), SizeMismatchError],
    ['a negative offset', () => comm.allreduce(b, { offset: -1 }), InvalidArgumentError],
    ['reduceScatter into the wrong size', () => comm.reduceScatter(b, FlatBuffer.allocate(2)), SizeMismatchError],
    ['allgather into the wrong size', () => comm.allgather(b, FlatBuffer.allocate(5)), SizeMismatchError],
    ['allgather in place', () => comm.allgather(b, b), AliasingError],
    ['reduceScatter in place', () => comm.reduceScatter(b, b), AliasingError],
    ['broadcast from a root outside the group', () => comm.broadcast(b, 1), InvalidArgumentError],
    ['send to oneself', () => comm.send(b, 0), InvalidArgumentError],
    ['recv from a rank outside the group', () => comm.recv(b, 5), InvalidArgumentError],
    ['something that is not a buffer', () => comm.allreduce({} as FlatBuffer), InvalidArgumentError],
  ];
  for (const [what, call, Type] of bad) await t.rejects(call(), Type, what);
  const disposed = FlatBuffer.allocate(4);
  disposed.dispose();
  await t.rejects(comm.allreduce(disposed), DisposedError, 'a disposed buffer');

  comm.destroy();
  comm.destroy();
  const after: [string, () => Promise<unknown>][] = [
    ['allreduce', () => comm.allreduce(b)],
    ['barrier', () => comm.barrier()],
    ['recv', () => comm.recv(b, 0)],
    ['allgather', () => comm.allgather(b, FlatBuffer.allocate(3))],
  ];
  for (const [what, call] of after) await t.rejects(call(), DisposedError, `${what} after destroy()`);
}
