/**
 * Communicators, trainers and the pipeline runtime give their threads back when they are
 * destroyed, not when garbage collection runs: 2,000 create/destroy cycles keep the process's
 * thread count, open file descriptors and resident memory flat. And a thread that cannot be
 * started (a pids limit, as in a container) is a typed ResourceLimitError, never an abort.
 *
 * Bounds: the thread count returns to where it started (+2 for Node's own lazily started
 * threads); at most 16 threads above it at any point; fds +8; RSS +64 MB over 2,000 cycles
 * (each cycle that leaked its queue held a thread with an 8 MB stack reservation and ~100 KB
 * resident before this was fixed, so a leak shows as hundreds of threads).
 */
import { spawnSync } from 'node:child_process';
import { chmodSync, mkdtempSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import v8 from 'node:v8';
import vm from 'node:vm';
import t, { type Test } from 'tap';

import { DataParallelTrainer, ExecutionQueue, LocalCommunicator, ParamSet, UcxCommunicator, createRendezvous, findFreePort } from '../../dist/index.js';
import { ucxStatus } from '../../dist/comm/ucx-native.js';

const threads = (): number => Number(/Threads:\s+(\d+)/.exec(readFileSync('/proc/self/status', 'utf8'))![1]);
const fds = (): number => readdirSync('/proc/self/fd').length;
const rssMb = (): number => process.memoryUsage().rss / 2 ** 20;

const CYCLES = 2000;
/** Each starts two stage workers (about 0.4 s): enough to show a leak of whole threads or heaps. */
const PIPELINE_CYCLES = 30;
const DIST = new URL('../../dist/index.js', import.meta.url).href;

// Collected garbage before each reading: memory that is only waiting for a collection (a stage
// worker's heap, say) is not a leak; what survives one is.
v8.setFlagsFromString('--expose-gc');
const collect = vm.runInNewContext('gc') as () => void;

async function churn(t: Test, what: string, cycles: number, cycle: (i: number) => Promise<void>): Promise<void> {
  await cycle(-1); // warms up what is created once per process (the default queue, the kernels' pool)
  collect();
  const start = { threads: threads(), fds: fds(), rss: rssMb() };
  let peak = 0;
  for (let i = 0; i < cycles; i++) {
    await cycle(i);
    peak = Math.max(peak, threads());
  }
  collect();
  const end = { threads: threads(), fds: fds(), rss: rssMb() };
  t.ok(end.threads <= start.threads + 2, `${what}: ${end.threads} threads after ${cycles} cycles, ${start.threads} before`);
  t.ok(peak <= start.threads + 16, `${what}: at most ${peak} threads after any cycle (${start.threads} at the start)`);
  t.ok(end.fds <= start.fds + 8, `${what}: ${end.fds} fds after, ${start.fds} before`);
  t.ok(end.rss - start.rss < 64, `${what}: RSS grew ${(end.rss - start.rss).toFixed(1)} MB`);
}

t.test('an execution queue ends its thread on close(), after the operations submitted', async (t) => {
  await churn(t, 'ExecutionQueue', CYCLES, async () => {
    const q = new ExecutionQueue();
    await q.close();
  });
  const q = new ExecutionQueue();
  const closed = q.close();
  t.equal(q.close(), closed, 'close() is idempotent: the same Promise');
  await closed;
});

t.test('LocalCommunicator: destroy() joins its threads', async (t) => {
  await churn(t, 'LocalCommunicator size 1', CYCLES, async (i) => {
    const c = await LocalCommunicator.create({ group: `churn-1-${process.pid}-${i}`, rank: 0, size: 1 });
    await c.destroy();
  });
  // Two ranks with point-to-point traffic: the per-peer send and receive queues end too.
  await churn(t, 'LocalCommunicator size 2 with send/recv', CYCLES / 4, async (i) => {
    const group = `churn-2-${process.pid}-${i}`;
    const [a, b] = await Promise.all([0, 1].map((rank) => LocalCommunicator.create({ group, rank, size: 2 })));
    const x = a!.allocate(4);
    const y = b!.allocate(4);
    await Promise.all([a!.send(x, 1), b!.recv(y, 0), a!.allreduce(x), b!.allreduce(y)]);
    await Promise.all([a!.destroy(), b!.destroy()]);
    x.dispose();
    y.dispose();
  });
});

const ucx = ucxStatus();
t.test('UcxCommunicator: destroy() joins its threads; create after destroy on the same port', ucx.available ? {} : { skip: `the ucx plugin is unavailable: ${ucx.reason ?? 'unknown'}` }, async (t) => {
  // Its own store on MASTER_PORT each time: a port the previous one just gave up.
  const port = await findFreePort();
  const env = { RANK: process.env.RANK, WORLD_SIZE: process.env.WORLD_SIZE, MASTER_PORT: process.env.MASTER_PORT };
  Object.assign(process.env, { RANK: '0', WORLD_SIZE: '1', MASTER_PORT: String(port) });
  try {
    await churn(t, 'UcxCommunicator size 1, its own store', CYCLES / 4, async () => {
      const c = await UcxCommunicator.create({ timeoutMs: 10_000 });
      await c.destroy();
    });
  } finally {
    for (const [k, v] of Object.entries(env)) if (v === undefined) delete process.env[k];
    else process.env[k] = v;
  }
  // Over a store the caller keeps: the communicator's queues and workers end with it.
  const store = await createRendezvous({ rank: 0, worldSize: 1, addr: '127.0.0.1', port: await findFreePort() });
  await churn(t, 'UcxCommunicator size 1 over one store', CYCLES / 4, async () => {
    const c = await UcxCommunicator.create({ store, timeoutMs: 10_000 });
    await c.destroy();
  });
  await store.close();
});

t.test('destroy() lets every operation settle and refuses new ones', async (t) => {
  const group = `churn-settle-${process.pid}`;
  const [a, b] = await Promise.all([0, 1].map((rank) => LocalCommunicator.create({ group, rank, size: 2, timeoutMs: 5000 })));
  const x = a!.allocate(8);
  // Rank 1 never joins: rank 0's all-reduce is in flight when rank 0 is destroyed.
  const inFlight = a!.allreduce(x).then(
    () => 'resolved',
    (e: { code?: string }) => e.code,
  );
  const started = Date.now();
  await a!.destroy();
  t.ok(Date.now() - started < 4000, 'destroy() does not wait for the operation timeout');
  t.equal(await inFlight, 'ERR_DISPOSED', 'the operation in flight settles with DisposedError');
  await t.rejects(a!.allreduce(x), { code: 'ERR_DISPOSED' }, 'a later operation is refused');
  t.equal(a!.destroy(), a!.destroy(), 'destroy() is idempotent: the same Promise');
  await b!.destroy();
  x.dispose();
});

t.test('DataParallelTrainer: create, step and dispose with its communicator', async (t) => {
  await churn(t, 'DataParallelTrainer', CYCLES / 4, async (i) => {
    const comm = await LocalCommunicator.create({ group: `churn-dp-${process.pid}-${i}`, rank: 0, size: 1 });
    const params = new ParamSet({ w: [64] });
    const trainer = await DataParallelTrainer.create({ comm, params, mode: 'sapipe-dc', optimizer: { kind: 'sgd', lr: 0.1, momentum: 0.9 } });
    trainer.grads.array.fill(0.01);
    await trainer.step();
    await trainer.dispose();
    params.dispose();
    await comm.destroy();
  });
});

t.test('PipelineTrainer: dispose() ends its stage workers and their threads', async (t) => {
  // In a plain Node.js process: the test runner's TypeScript hooks load into every stage worker
  // and hold memory of their own, which is not what this measures.
  const dir = mkdtempSync(join(tmpdir(), 'sapipe-pipeline-churn-'));
  const script = join(dir, 'churn.mjs');
  writeFileSync(
    script,
    `import { readFileSync, readdirSync } from 'node:fs';
import { PipelineTrainer, mlpLayers } from ${JSON.stringify(DIST)};
const threads = () => Number(/Threads:\\s+(\\d+)/.exec(readFileSync('/proc/self/status', 'utf8'))[1]);
const reading = () => { gc(); return { threads: threads(), fds: readdirSync('/proc/self/fd').length, rss: process.memoryUsage().rss / 2 ** 20 }; };
const features = 6;
const inputs = new Float32Array(32 * features).map((_, i) => Math.sin(i));
const labels = new Int32Array(32).map((_, i) => i % 3);
const cycle = async () => {
  const trainer = await PipelineTrainer.create({
    schedule: '1f1b', stages: 2, microBatches: 2, microBatchSize: 4,
    model: { layers: mlpLayers([features, 8, 3]), seed: 1 }, optimizer: { kind: 'sgd', lr: 0.1 },
    data: { inputs, labels, features }, shuffle: false,
  });
  await trainer.trainRound();
  await trainer.dispose();
};
for (let i = 0; i < 3; i++) await cycle(); // the allocator's arenas for the stage threads settle
const start = reading();
let peak = 0;
for (let i = 0; i < ${PIPELINE_CYCLES}; i++) { await cycle(); peak = Math.max(peak, threads()); }
console.log(JSON.stringify({ start, end: reading(), peak }));
`,
  );
  const run = spawnSync('env', ['-i', `PATH=${process.env.PATH}`, process.execPath, '--expose-gc', script], { encoding: 'utf8', timeout: 120_000 });
  t.equal(run.status, 0, `the process exits normally (signal ${run.signal}, stderr: ${run.stderr.slice(0, 400)})`);
  type Reading = { threads: number; fds: number; rss: number };
  const { start, end, peak } = JSON.parse(run.stdout.trim().split('\n').pop() ?? '{}') as { start: Reading; end: Reading; peak: number };
  const what = `PipelineTrainer x ${PIPELINE_CYCLES}`;
  t.ok(end.threads <= start.threads + 2, `${what}: ${end.threads} threads after, ${start.threads} before`);
  t.ok(peak <= start.threads + 16, `${what}: at most ${peak} threads after any cycle`);
  t.ok(end.fds <= start.fds + 8, `${what}: ${end.fds} fds after, ${start.fds} before`);
  t.ok(end.rss - start.rss < 64, `${what}: RSS grew ${(end.rss - start.rss).toFixed(1)} MB`);
});

t.test('a thread the process may not start is ResourceLimitError, not an abort', async (t) => {
  // A separate process under a limit of 60 threads for its user (root ignores RLIMIT_NPROC, so
  // as root it runs as `nobody`): it creates queues until the limit refuses one.
  const dir = mkdtempSync(join(tmpdir(), 'sapipe-nproc-'));
  const script = join(dir, 'limit.mjs');
  writeFileSync(
    script,
    `import { ExecutionQueue, LocalCommunicator } from ${JSON.stringify(DIST)};
const queues = [];
let caught;
try { for (let i = 0; i < 1000; i++) queues.push(new ExecutionQueue()); } catch (e) { caught = e; }
await Promise.all(queues.map((q) => q.close()));
// With the threads given back, work goes on.
const c = await LocalCommunicator.create({ group: 'after', rank: 0, size: 1 });
await c.destroy();
console.log(JSON.stringify({ code: caught?.code, name: caught?.constructor.name, created: queues.length, message: caught?.message }));
`,
  );
  chmodSync(dir, 0o755); // readable by `nobody`
  // `env -i`: not the test runner's hooks (they ride in NODE_OPTIONS and write where `nobody` may not).
  const limit = ['env', '-i', `PATH=${process.env.PATH}`, 'prlimit', '--nproc=60', process.execPath, script];
  const command = process.getuid?.() === 0 ? ['setpriv', '--reuid=nobody', '--regid=nogroup', '--clear-groups', ...limit] : limit;
  const run = spawnSync(command[0]!, command.slice(1), {
    encoding: 'utf8',
    timeout: 60_000,
    cwd: dir,
  });
  t.equal(run.status, 0, `the process exits normally (signal ${run.signal}, stderr: ${run.stderr.slice(0, 400)})`);
  const report = JSON.parse(run.stdout.trim().split('\n').pop() ?? '{}') as { code?: string; name?: string; created?: number; message?: string };
  t.equal(report.code, 'ERR_RESOURCE_LIMIT', `typed error (${report.name}: ${report.message})`);
  t.ok((report.created ?? 0) > 0 && (report.created ?? 0) < 60, `queues created before the limit: ${report.created}`);
  t.match(report.message ?? '', /limit/, 'the message says a limit was reached');
});
