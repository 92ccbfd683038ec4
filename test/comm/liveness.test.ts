/**
 * The liveness mesh of the ucx backend (lib/comm/liveness.ts): a rank whose peers never start says
 * which ranks never joined, how to start them, and what sets the wait, instead of only timing out.
 */
import t from 'tap';

import { LivenessMesh } from '../../dist/comm/liveness.js';
import { createRendezvous } from '../../dist/comm/rendezvous/rendezvous.js';
import { TimeoutError } from '../../dist/errors.js';

t.test('rank 0 of 3 started alone: names ranks 1 and 2, sapipe launch, and timeoutMs', async (t) => {
  const store = await createRendezvous({ rank: 0, worldSize: 3, port: 0, timeoutMs: 5000 });
  t.teardown(() => store.close());
  const started = performance.now();
  const error = await LivenessMesh.join(store, 'liveness-test', 0, 3, undefined, 300, () => {}).then(
    (mesh) => {
      mesh.close();
      return undefined;
    },
    (e: unknown) => e,
  );
  t.ok(error instanceof TimeoutError, String(error));
  t.match(String(error), /rank 0 of 3: ranks 1, 2 never joined within 300 ms/);
  t.match(String(error), /sapipe launch --nproc 3/);
  t.match(String(error), /timeoutMs option/);
  t.ok(performance.now() - started < 3000, 'within its timeout');
});
