/**
 * One communicator contract (test/helpers/communicator-contract.ts), run against every backend
 * this machine has: `local` always; `ucx` where its plugin is built (in CI a missing plugin fails
 * the run); `nccl` communicates GPU buffers and needs a GPU, so here it is only listed: its
 * contract runs on a GPU machine with test/cuda (docs/cuda.md lists what was verified where).
 */
import t from 'tap';

import { ucxStatus } from '../../dist/comm/ucx-native.js';
import { createRendezvous, LocalCommunicator, UcxCommunicator } from '../../dist/index.js';
import { communicatorContract } from '../helpers/communicator-contract.js';

t.test('local', async (t) => {
  await communicatorContract(t, await LocalCommunicator.create({ group: 'contract', rank: 0, size: 1 }));
});

const ucx = ucxStatus();
if (!ucx.available && process.env.CI) t.fail(`the ucx plugin is not available in CI, so the ucx contract is untested: ${ucx.reason ?? 'unknown'}`);
t.test('ucx', ucx.available ? {} : { skip: `the ucx plugin is unavailable: ${ucx.reason ?? 'unknown'}` }, async (t) => {
  const store = await createRendezvous({ rank: 0, worldSize: 1, port: 0 });
  try {
    await communicatorContract(t, await UcxCommunicator.create({ store, timeoutMs: 5000 }));
  } finally {
    await store.close();
  }
});

