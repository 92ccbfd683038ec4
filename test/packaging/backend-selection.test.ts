/**
 * Backend selection over probe statuses: `auto` prefers CUDA and UCX when their probes say they
 * are usable; a backend named but unusable is a BackendUnavailableError that says why and what to
 * install. The statuses are plain data, so every machine can be described without its hardware.
 */
import t from 'tap';

import { backendStatuses, selectBackend, selectCommBackend, type BackendStatus } from '../../dist/backends/index.js';
import { BackendUnavailableError, InvalidArgumentError, SapipeError } from '../../dist/errors.js';

const cpu: BackendStatus = { name: 'cpu', kind: 'compute', available: true };
const cudaMissing: BackendStatus = { name: 'cuda', kind: 'compute', available: false, reason: 'libcuda.so.1 not found' };
const cudaReady: BackendStatus = { name: 'cuda', kind: 'compute', available: true, details: { devices: 1 } };
const ucxMissing: BackendStatus = { name: 'ucx', kind: 'comm', available: false, reason: 'libucp.so.0 not found' };
const ucxReady: BackendStatus = { name: 'ucx', kind: 'comm', available: true };

t.test('auto picks CUDA when it is available, else the CPU, and says why', async (t) => {
  t.equal(selectBackend('auto', [cpu, cudaReady]).name, 'cuda');
  const fallback = selectBackend('auto', [cpu, cudaMissing]);
  t.equal(fallback.name, 'cpu');
  t.match(fallback.why, /cuda is unavailable \(libcuda\.so\.1 not found\)/);
  t.equal(selectBackend(undefined, [cpu]).name, 'cpu', 'auto is the default; a missing probe counts as unavailable');
});

t.test('a named backend is used when available and is an error with a reason and a remedy when not', async (t) => {
  t.equal(selectBackend('cpu', [cpu, cudaReady]).name, 'cpu', 'naming the CPU skips an available GPU');
  t.equal(selectBackend('cuda', [cpu, cudaReady]).status, cudaReady);
  const error = t.throws(() => selectBackend('cuda', [cpu, cudaMissing])) as unknown;
  t.ok(error instanceof BackendUnavailableError && error instanceof SapipeError);
  t.equal((error as SapipeError).code, 'ERR_BACKEND_UNAVAILABLE');
  t.match((error as Error).message, /cuda backend is unavailable: libcuda\.so\.1 not found\. To use it: .*NVIDIA/);
  t.throws(() => selectBackend('cuda', [cpu]), { code: 'ERR_BACKEND_UNAVAILABLE', message: /no probe for the cuda backend/ });
});

t.test('auto with nothing usable throws, naming every reason', async (t) => {
  const noAddon: BackendStatus = { name: 'cpu', kind: 'compute', available: false, reason: 'the sapipe native addon could not be loaded' };
  t.throws(() => selectBackend('auto', [noAddon, cudaMissing]), {
    code: 'ERR_BACKEND_UNAVAILABLE',
    message: /no compute backend is available: cuda is unavailable \(libcuda.*cpu is unavailable \(the sapipe native addon.*python3, make/,
  });
});

t.test('communication: auto picks UCX when its plugin loads, else local; local follows the addon', async (t) => {
  t.equal(selectCommBackend('auto', [cpu, ucxReady]).name, 'ucx');
  const local = selectCommBackend('auto', [cpu, ucxMissing]);
  t.equal(local.name, 'local');
  t.match(local.why, /ucx is unavailable \(libucp\.so\.0 not found\)/);
  t.throws(() => selectCommBackend('ucx', [cpu, ucxMissing]), { code: 'ERR_BACKEND_UNAVAILABLE', message: /libucp\.so\.0 not found\. To use it: install UCX/ });
  const noAddon: BackendStatus = { name: 'cpu', kind: 'compute', available: false, reason: 'addon missing' };
  t.throws(() => selectCommBackend('local', [noAddon]), { code: 'ERR_BACKEND_UNAVAILABLE', message: /local backend is unavailable: addon missing/ });
  const ownProbe: BackendStatus = { name: 'local', kind: 'comm', available: false, reason: 'disabled' };
  t.throws(() => selectCommBackend('auto', [cpu, ownProbe, ucxMissing]), { message: /local is unavailable \(disabled\)/ }, 'a local probe of its own wins');
});

t.test('bad preferences and statuses are InvalidArgumentError', async (t) => {
  for (const bad of ['gpu', 'CUDA', '', 3, null, 'ucx'])
    t.throws(() => selectBackend(bad as never, [cpu]), InvalidArgumentError, `compute ${JSON.stringify(bad)}`);
  t.throws(() => selectCommBackend('cuda' as never, [cpu]), { code: 'ERR_INVALID_ARGUMENT', message: /'auto', 'local', 'ucx'/ });
  t.throws(() => selectBackend('auto', 'cpu' as never), InvalidArgumentError);
  t.throws(() => selectBackend('auto', [{ name: 'cpu' }] as never), InvalidArgumentError);
});

t.test('on this machine, with the real probes, auto selects an available backend', async (t) => {
  const statuses = backendStatuses();
  const compute = selectBackend('auto', statuses);
  t.equal(compute.status.available, true);
  t.equal(compute.name, statuses.find((s) => s.name === 'cuda')?.available ? 'cuda' : 'cpu');
  const comm = selectCommBackend();
  t.equal(comm.name, statuses.find((s) => s.name === 'ucx')?.available ? 'ucx' : 'local');
});
