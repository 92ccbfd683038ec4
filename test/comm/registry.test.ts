/**
 * The communication backend registry (lib/comm/registry.ts): every registered backend has a probe
 * that reports on it by name, a consistent description (creation for how its ranks run, an install
 * hint, auto only for host memory), and creates a working communicator through its entry wherever
 * its probe says it can run here: local as a one-rank group of this thread, ucx and nccl on a
 * one-rank rendezvous. nccl runs on the CUDA plugin over host memory
 * (native/tests/fakes/plugin_host_memory.cpp) when it is built, as test/cuda/emulated.test.ts does.
 */
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import t from 'tap';

const plugin = fileURLToPath(new URL('../../build/Release/test-fakes/sapipe_test_plugin_host_memory.so', import.meta.url));
// Read when the addon first opens the CUDA plugin, which nothing has done yet in this process.
if (existsSync(plugin) && process.env.SAPIPE_CUDA_PLUGIN === undefined) process.env.SAPIPE_CUDA_PLUGIN = plugin;

const { COMM_BACKENDS } = await import('../../dist/comm/backend-names.js');
const { COMM_BACKEND_ENTRIES, autoCommBackends, commBackendEntry, processGroupBackend } = await import('../../dist/comm/registry.js');
const { backendStatuses, installHint, selectCommBackend } = await import('../../dist/backends/index.js');
const { createRendezvous } = await import('../../dist/comm/rendezvous/rendezvous.js');
const { DeviceBuffer } = await import('../../dist/device/index.js');
const { sparseAllreduce } = await import('../../dist/compress/sparse-allreduce.js');
const { FlatBuffer } = await import('../../dist/tensor.js');
type Entry = ReturnType<typeof commBackendEntry>;

t.test('every backend name has exactly one entry, and the lookups refuse other names', async (t) => {
  t.same(Object.keys(COMM_BACKEND_ENTRIES), [...COMM_BACKENDS]);
  for (const bad of ['gloo', '', 'Local', 3, null, 'toString', '__proto__'])
    t.throws(() => commBackendEntry(bad, 'test'), { code: 'ERR_INVALID_ARGUMENT', message: /'local', 'ucx', 'nccl'/ }, String(bad));
});

t.test('every entry is consistent: creation for how its ranks run, auto only over host memory', async (t) => {
  for (const name of COMM_BACKENDS) {
    const entry: Entry = commBackendEntry(name, 'test');
    t.type(entry.probe, 'function', `${name}: a probe`);
    t.ok(entry.installHint.length > 20 && installHint(name) === entry.installHint, `${name}: installHint reads the entry`);
    t.match(entry.className, /Communicator$/, `${name}: its class`);
    if (entry.capabilities.multiProcess) {
      t.type(entry.launched, 'function', `${name}: ranks as processes join a launched job`);
      t.type(entry.joinStore, 'function', `${name}: ...and a group of a rendezvous`);
      t.equal(entry.inProcess, undefined, `${name}: not as threads`);
    } else {
      t.type(entry.inProcess, 'function', `${name}: ranks as threads join in process`);
      t.equal(entry.launched ?? entry.joinStore, undefined, `${name}: not as processes`);
    }
    if (entry.autoRank !== undefined) t.equal(entry.memory, 'host', `${name}: auto picks it, so it moves host buffers`);
  }
  t.same(autoCommBackends(), ['ucx', 'local'], "auto's order");
  t.equal(processGroupBackend().name, 'ucx', 'groups of processes on host memory');
});

t.test("every registered backend's probe reports on it, in the backend list too", async (t) => {
  const listed = backendStatuses();
  for (const name of COMM_BACKENDS) {
    const status = commBackendEntry(name, 'test').probe();
    t.equal(status.name, name, `${name}: the probe names its backend`);
    t.equal(status.kind, 'comm');
    t.equal(typeof status.available, 'boolean');
    if (!status.available) t.ok(status.reason, `${name}: unavailable with a reason`);
    t.same(listed.filter((s) => s.name === name).map((s) => s.available), [status.available], `${name}: listed once by backendStatuses()`);
  }
  t.equal(selectCommBackend('auto').name, listed.find((s) => s.name === 'ucx')?.available ? 'ucx' : 'local');
});

type Closer = (close: () => Promise<unknown>) => void;
/** What the test does with any backend's communicator and buffers. */
interface Made {
  comm: { readonly backend: string; readonly size: number; allreduce(buffer: unknown): Promise<{ nonFiniteCount: number }>; destroy(): Promise<void> };
  buffer(values: number[]): { value: unknown; read(): Float32Array };
}

const hostBuffer = (close: Closer) => (values: number[]) => {
  const b = FlatBuffer.from(values);
  close(async () => b.dispose());
  return { value: b, read: () => b.array.slice() };
};
const deviceBuffer = (close: Closer) => (values: number[]) => {
  const b = DeviceBuffer.from(new Float32Array(values), { device: 'cuda:0' });
  close(async () => b.dispose());
  return { value: b, read: () => b.copyToHost() };
};

/** A one-rank communicator of `name` through its entry: in process, or on a one-rank rendezvous. */
async function createThrough(name: string, entry: Entry, close: Closer): Promise<Made> {
  if (entry.inProcess) {
    const comm = await entry.inProcess({ group: `registry-test-${name}`, rank: 0, size: 1 }, { timeoutMs: 10_000 });
    close(() => comm.destroy());
    return { comm: comm as unknown as Made['comm'], buffer: hostBuffer(close) };
  }
  const store = await createRendezvous({ rank: 0, worldSize: 1, port: 0, timeoutMs: 10_000 });
  close(() => store.close());
  const comm = await entry.joinStore!(store.group('registry-test', 0, 1), { timeoutMs: 10_000, ...(entry.memory === 'device' ? { device: 'cuda:0' as const } : {}) });
  close(() => comm.destroy());
  return { comm: comm as unknown as Made['comm'], buffer: entry.memory === 'device' ? deviceBuffer(close) : hostBuffer(close) };
}

for (const name of COMM_BACKENDS) {
  t.test(`${name}: creates a communicator through the registry where its probe says it can run`, async (t) => {
    const entry: Entry = commBackendEntry(name, 'test');
    const status = entry.probe();
    const closers: (() => Promise<unknown>)[] = [];
    t.teardown(async () => {
      for (const close of closers.reverse()) await close().catch(() => {});
    });
    if (!status.available) {
      // Where it cannot run, creating it through its entry says so, typed, as its probe did.
      t.comment(`${name} is unavailable here: ${status.reason}`);
      await t.rejects(createThrough(name, entry, (f) => closers.push(f)), { code: 'ERR_BACKEND_UNAVAILABLE' }, 'creation refuses with BackendUnavailableError');
      return;
    }
    const { comm, buffer } = await createThrough(name, entry, (f) => closers.push(f));
    t.equal(comm.backend, name, 'the communicator of that backend');
    t.equal(comm.size, 1);
    const b = buffer([1, 2, Number.NaN]);
    t.equal((await comm.allreduce(b.value)).nonFiniteCount, 1, 'an all-reduce runs');
    t.same([...b.read()].slice(0, 2), [1, 2]);
    if (entry.capabilities.sparseCollectives) {
      const grad = buffer(Array.from({ length: 64 }, (_, i) => (i % 7) - 3));
      const r = await sparseAllreduce(comm as never, grad.value as never, { density: 0.25 });
      t.equal(r.k, 16, 'sparseAllreduce runs over it, as its capabilities say');
    }
  });
}
