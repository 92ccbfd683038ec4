/**
 * Linux overcommits: a buffer is only address space until it is written, so an optimizer whose
 * state cannot fit would be ended by the kernel's OOM killer at its first step. It is refused at
 * construction with ERR_OUT_OF_MEMORY instead (the sizes are taken from this machine's
 * /proc/meminfo, so the test holds on any machine), and so is a local job of more ranks than the
 * machine's memory holds.
 */
import { readFileSync } from 'node:fs';
import t from 'tap';

import { Adam, ParamSet, SGD, spawnLocalRanks } from '../../dist/index.js';

const meminfo = new Map(
  readFileSync('/proc/meminfo', 'utf8')
    .split('\n')
    .map((l) => /^(\w+):\s+(\d+) kB/.exec(l))
    .filter((m): m is RegExpExecArray => m !== null)
    .map((m) => [m[1]!, Number(m[2]) * 1024]),
);
const total = meminfo.get('MemTotal')! + (meminfo.get('SwapTotal') ?? 0);

t.test('SGD-momentum whose weights, gradients and momentum exceed the machine: ERR_OUT_OF_MEMORY, nothing allocated', async (t) => {
  // Three buffers of a third of the machine's memory each, plus a little: more than there is.
  const n = Math.ceil(total / 12) + 2 ** 20;
  const p = new ParamSet({ w: [n] }); // address space only: never written
  const rssBefore = process.memoryUsage().rss;
  t.throws(() => new SGD(p, { lr: 0.1, momentum: 0.9 }), { code: 'ERR_OUT_OF_MEMORY', message: /GiB/ });
  t.throws(() => new Adam(p, { lr: 0.1 }), { code: 'ERR_OUT_OF_MEMORY' });
  t.ok(process.memoryUsage().rss - rssBefore < 64 * 2 ** 20, 'no state was written');
  // Plain SGD keeps no state: two buffers fit where three do not.
  const sgd = new SGD(p, { lr: 0.1 });
  sgd.dispose();
  p.dispose();
});

t.test('a local job of more ranks than memory holds: ERR_OUT_OF_MEMORY before any starts', async (t) => {
  const available = meminfo.get('MemAvailable')! + (meminfo.get('SwapFree') ?? 0);
  // Twice what fits: the memory available moves between this reading and the library's.
  const ranks = Math.ceil((2 * available) / (18 * 2 ** 20)) + 1;
  if (ranks > 4096) {
    // More memory than 4096 ranks need: the rank limit is what refuses the count.
    t.throws(() => spawnLocalRanks(new URL('data:text/javascript,'), ranks), { code: 'ERR_INVALID_ARGUMENT' });
    return;
  }
  let started: { terminate(): Promise<number> }[] = [];
  t.throws(() => (started = spawnLocalRanks(new URL('data:text/javascript,'), ranks)), { code: 'ERR_OUT_OF_MEMORY', message: /Start fewer ranks/ });
  await Promise.all(started.map((w) => w.terminate()));
});
