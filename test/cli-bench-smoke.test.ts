/**
 * Every `sapipe bench` command no other test runs, in a short form, as a user runs it (a real
 * `node bin/sapipe.js` process on dist/): exit code 0 and the shape of its --json. A command that
 * crashes at a documented setting (bench pipeline once did at an even --rounds, its default) fails here.
 */
import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import t from 'tap';

const run = promisify(execFile);
const bin = fileURLToPath(new URL('../bin/sapipe.js', import.meta.url));
const sapipe = async (...args: string[]): Promise<unknown> => JSON.parse((await run(process.execPath, [bin, ...args], { maxBuffer: 1 << 24 })).stdout) as unknown;
const finitePositive = (x: unknown): boolean => typeof x === 'number' && Number.isFinite(x) && x > 0;

t.test('bench pipeline --json at an even number of rounds (its default is 20), with no warm-up', async (t) => {
  const rows = (await sapipe('bench', 'pipeline', '--schedules', '1f1b,pipeoptim', '--stages', '2', '--microbatches', '2', '--microbatch-size', '4', '--layers', '784,16,10', '--rounds', '2', '--warmup', '0', '--json')) as {
    schedule: string;
    measuredMs: number;
    simulatedMs: number;
    bubbleMeasured: number;
    ratio: number;
    messageCpuMs: number[];
  }[];
  t.same(rows.map((x) => x.schedule), ['1f1b', 'pipeoptim'], 'a row per schedule');
  for (const x of rows) {
    t.ok(finitePositive(x.measuredMs) && finitePositive(x.simulatedMs) && finitePositive(x.ratio), `${x.schedule}: times and their ratio`);
    t.ok(x.bubbleMeasured >= 0 && x.bubbleMeasured < 1, `${x.schedule}: the median round's bubble`);
    t.ok(x.messageCpuMs.length === 2 && x.messageCpuMs.every(finitePositive), `${x.schedule}: what a message costs the cores, per part (${x.messageCpuMs.map((ms) => ms.toFixed(3)).join(', ')} ms)`);
  }
});

t.test('bench pipeline --json: AvgPipe worker per replica and Wavelet data-parallel, each worker on a kernel thread of its own', async (t) => {
  const rows = (await sapipe('bench', 'pipeline', '--schedules', 'avgpipe,wavelet', '--averaging-layout', 'worker-per-replica', '--form', 'data-parallel', '--kernel-threads', '1', '--stages', '2', '--microbatches', '2', '--microbatch-size', '4', '--layers', '784,16,10', '--rounds', '2', '--warmup', '0', '--json')) as {
    schedule: string;
    ratioShared: number;
    ratioMachine: number;
    kernelThreads: number | 'shared';
  }[];
  t.same(rows.map((x) => x.schedule), ['avgpipe', 'wavelet']);
  for (const x of rows) {
    t.ok(finitePositive(x.ratioShared) && finitePositive(x.ratioMachine), `${x.schedule}: measured against both shared-cores simulations`);
    t.equal(x.kernelThreads, 1, `${x.schedule}: the workers' kernel threads as asked`);
  }
  await t.rejects(sapipe('bench', 'pipeline', '--averaging-layout', 'sideways', '--json'), /averaging-layout/);
});

t.test('bench gemm --json', async (t) => {
  const r = (await sapipe('bench', 'gemm', '--m', '37', '--n', '29', '--k', '53', '--reps', '2', '--warmup', '1', '--json')) as Record<string, unknown>;
  t.ok(Object.values(r).some(finitePositive), `some positive figure: ${JSON.stringify(r).slice(0, 200)}`);
  t.match(JSON.stringify(r), /gflops/i, 'GFLOP/s reported');
});

t.test('bench allreduce --json on the local backend', async (t) => {
  const r = await sapipe('bench', 'allreduce', '--nproc', '2', '--min', '1K', '--max', '4K', '--reps', '2', '--warmup', '1', '--fused-size', '4K', '--json');
  t.match(JSON.stringify(r), /busGbps|algGbps|gbps/i, 'bandwidth figures');
});

t.test('bench overlap --json', async (t) => {
  const r = await sapipe('bench', 'overlap', '--nproc', '2', '--size', '64K', '--steps', '3', '--warmup', '1', '--modes', 'sapipe-wp', '--json');
  t.match(JSON.stringify(r), /sapipe-wp/, 'the mode asked for');
});
