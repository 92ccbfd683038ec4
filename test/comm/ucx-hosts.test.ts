/**
 * UCX across hosts on a real (shaped) network: scripts/shaped-net.sh makes 2 hosts (network
 * namespaces, each with its own hostname and boot id) joined by 1 Gbit/s tbf-limited links, and
 * `sapipe launch --nnodes 2 --node-rank i --master-addr 10.77.0.1` starts 2 ranks on each. Every
 * collective is checked on the 4 ranks (values computed independently in the fixture), ranks on
 * one host keep shared memory (their loopback carries next to nothing while the link carries the
 * ring's cross-host traffic), buffers in shared memory take the ring across hosts, and a whole
 * host torn down mid-collective (its processes killed, its namespace deleted) fails the ranks on
 * the other with ERR_PEER_LOST well within the timeout.
 */
import { fileURLToPath } from 'node:url';
import t from 'tap';

import { ucxStatus } from '../../dist/comm/ucx-native.js';
import { typescriptNodeArgs } from '../fixtures/launch/typescript-child.js';
import { createShapedNetwork, shapedNetworkUnavailable, type ShapedNetwork } from '../helpers/shaped-net.js';

const BIN = fileURLToPath(new URL('../../bin/sapipe.js', import.meta.url));
const COLLECTIVES = fileURLToPath(new URL('../fixtures/comm/ucx-rank.ts', import.meta.url));
const LOOP = fileURLToPath(new URL('../fixtures/comm/ucx-hosts-rank.mjs', import.meta.url));

const ucx = ucxStatus();
const why = !ucx.available ? `the ucx plugin is unavailable: ${ucx.reason ?? 'unknown'}` : shapedNetworkUnavailable();
if (why !== undefined && process.env.CI) t.fail(`multi-host tests cannot run in CI: ${why}`);
const needs = why === undefined ? {} : { skip: why };

type Result = Record<string, unknown>;
function results(stdout: string): Map<number, Result[]> {
  const out = new Map<number, Result[]>();
  for (const line of stdout.split('\n')) {
    const m = /^\[(\d+)\] RESULT (.*)$/.exec(line);
    if (m) out.set(Number(m[1]), [...(out.get(Number(m[1])) ?? []), JSON.parse(m[2]!) as Result]);
  }
  return out;
}

/** `sapipe launch` of `script args` on every host, 2 ranks each; resolves with each host's run. */
function launchOnHosts(net: ShapedNetwork, hosts: number, port: number, script: string, args: string[], nodeArgs: string[], env: Record<string, string> = {}, onStdout?: (host: number, text: string) => void) {
  return Array.from({ length: hosts }, (_, h) =>
    net.run(
      h,
      [process.execPath, BIN, 'launch', '--nnodes', String(hosts), '--node-rank', String(h), '--master-addr', net.address(0), '--master-port', String(port), '--nproc', '2', ...nodeArgs.map((a) => `--node-arg=${a}`), script, ...args],
      { NODE_OPTIONS: '', SAPIPE_TOKEN: `token-${process.pid}`, SAPIPE_BIND_ADDR: net.address(0), TS_NODE_TRANSPILE_ONLY: '1', ...env },
      onStdout && ((text) => onStdout(h, text)),
    ),
  );
}

t.test('every collective on 2 hosts x 2 ranks over a 1 Gbit/s link; one host\'s ranks share memory', needs, async (t) => {
  const net = createShapedNetwork(2, '1gbit');
  t.teardown(() => net.down());
  const before = [0, 1].map((h) => ({ lo: net.counter(h, 'lo', 'tx_bytes'), eth0: net.counter(h, 'eth0', 'tx_bytes') }));
  const runs = await Promise.all(launchOnHosts(net, 2, 29400, COLLECTIVES, ['collectives', '0,17,1000003'], typescriptNodeArgs(), { SAPIPE_TEST_MEMORY: 'shared' }));
  runs.forEach((r, h) => t.equal(r.code, 0, `host ${h}'s launcher succeeded\n${r.stderr.slice(-2000)}`));
  const all = new Map([...results(runs[0]!.stdout), ...results(runs[1]!.stdout)]);
  t.same([...all.keys()].sort(), [0, 1, 2, 3], 'ranks 0, 1 on host 0 and 2, 3 on host 1 reported');
  for (const [rank, msgs] of all) {
    const collectives = msgs.filter((m) => 'len' in m);
    t.equal(collectives.length, 3, `rank ${rank}: every size ran`);
    for (const m of collectives) {
      for (const [name, c] of Object.entries(m.checks as Record<string, { bad: number } | number>))
        t.equal(typeof c === 'number' ? c : c.bad, 0, `rank ${rank} len ${String(m.len)}: ${name}`);
      t.equal(m.direct, 0, `rank ${rank} len ${String(m.len)}: shared buffers on different hosts take the ring, not direct reads`);
    }
  }
  // The ring over ranks 0-1-2-3 crosses the link twice per round (1 -> 2 and 3 -> 0); its other
  // hops stay on a host. Over TCP those would cross loopback; through shared memory nothing does.
  for (const h of [0, 1]) {
    const lo = net.counter(h, 'lo', 'tx_bytes') - before[h]!.lo;
    const eth0 = net.counter(h, 'eth0', 'tx_bytes') - before[h]!.eth0;
    t.ok(eth0 > 8e6, `host ${h}: ${(eth0 / 1e6).toFixed(1)} MB left over the link`);
    t.ok(lo < eth0 / 10, `host ${h}: ${(lo / 1e6).toFixed(2)} MB over loopback (the rendezvous and liveness only): its two ranks talk through shared memory`);
  }
});

t.test('a host torn down mid-collective fails the other host\'s ranks with ERR_PEER_LOST within the timeout', needs, async (t) => {
  const net = createShapedNetwork(2, '1gbit');
  t.teardown(() => net.down());
  const ready = [0, 0];
  const runs = launchOnHosts(net, 2, 29401, LOOP, ['loop'], [], {}, (h, text) => (ready[h] = (text.match(/RESULT \{"ready":true/g) ?? []).length));
  // Wait until every rank is in its all-reduce loop, then take host 1 away.
  const deadline = Date.now() + 60_000;
  while (ready[0]! + ready[1]! < 4 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 250));
  t.equal(ready[0]! + ready[1]!, 4, 'all 4 ranks were reducing');
  await new Promise((r) => setTimeout(r, 1000));
  const killedAt = Date.now();
  net.tearDownHost(1);
  const host0 = await runs[0]!;
  const took = Date.now() - killedAt;
  const got = results(host0.stdout);
  for (const rank of [0, 1]) {
    const end = got.get(rank)?.find((m) => 'error' in m);
    t.equal(end?.error, 'ERR_PEER_LOST', `rank ${rank} (host 0): ERR_PEER_LOST, ${String(end?.afterMs)} ms after its last good all-reduce`);
  }
  t.ok(took < 30_000, `host 0's job ended ${took} ms after host 1 went (the timeout is 30 s)`);
});

t.test('the hierarchical top-k all-reduce on 2 hosts x 2 ranks: dense inside a host, sparse across, equal to the reference on every rank', needs, async (t) => {
  const net = createShapedNetwork(2, '1gbit');
  t.teardown(() => net.down());
  const runs = await Promise.all(launchOnHosts(net, 2, 29402, LOOP, ['hierarchical'], []));
  runs.forEach((r, h) => t.equal(r.code, 0, `host ${h}'s launcher succeeded\n${r.stderr.slice(-2000)}`));
  const all = new Map([...results(runs[0]!.stdout), ...results(runs[1]!.stdout)]);
  t.same([...all.keys()].sort(), [0, 1, 2, 3], 'every rank reported');
  for (const [rank, [m]] of all) {
    t.equal(m!.bad, 0, `rank ${rank}: the average equals the reference bit for bit`);
    const r = m!.result as { nonFiniteCount: number; k: number; crossBytes: number };
    t.equal(r.nonFiniteCount, 0);
    t.equal(r.crossBytes, (2 * r.k + 3) * 2 * 4, `rank ${rank}: only its part's ${r.k} pairs crossed hosts (from each of the 2 hosts)`);
  }
});
