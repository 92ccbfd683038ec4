/**
 * The rendezvous store and its readers facing clients that do not play by the rules, over real
 * sockets and real processes (docs/launch.md, "Who can write to the store"):
 *
 * - values planted in the store for a rank that has not published yet (the bytes of the report
 *   that aborted ranks inside ucp_ep_create, random bytes, envelopes that lie about their rank,
 *   world size, length, kind or UCX header) make the ranks, started without SAPIPE_TOKEN as
 *   torchrun starts them, fail with RendezvousError naming the key, never abort; the liveness
 *   records and the NCCL unique id are checked the same way;
 * - keys a rank publishes about itself are written once;
 * - a flood of connections that never say HELLO, each announcing a 16 MiB frame and sending it,
 *   costs the store next to no memory; strangers beyond the cap are closed at once; a connection
 *   that sends half a frame is closed at the handshake timeout;
 * - the store refuses to serve other machines without a token unless told to;
 * - UcxCommunicator.create() right after destroy() on the same MASTER_PORT works, and a port that
 *   stays busy is a RendezvousError that says so.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { once } from 'node:events';
import { readFileSync } from 'node:fs';
import { connect, createServer, type Socket } from 'node:net';
import { Writable } from 'node:stream';
import { fileURLToPath } from 'node:url';

import t from 'tap';

import { LivenessMesh } from '../../dist/comm/liveness.js';
import { createRendezvous, fromEnv, RendezvousClient, RendezvousServer } from '../../dist/comm/rendezvous/index.js';
import { EnvelopeKind, sealEnvelope } from '../../dist/comm/rendezvous/validate.js';
import { ucxAddon, ucxStatus } from '../../dist/comm/ucx-native.js';
import { InvalidArgumentError, RendezvousError } from '../../dist/errors.js';
import { findFreePort } from '../../dist/launch/free-port.js';
import { launch } from '../../dist/launch/index.js';
import { repoRoot, typescriptEnv, typescriptNodeArgs } from '../fixtures/launch/typescript-child.js';

const FIXTURE = fileURLToPath(new URL('../fixtures/comm/adversarial-rank.ts', import.meta.url));
const status = ucxStatus();
const needsUcx = status.available ? {} : { skip: `the ucx plugin is unavailable: ${status.reason ?? 'unknown'}` };

type Result = Record<string, unknown>;

/** Starts the fixture as one rank, with the environment torchrun would give it and no SAPIPE_TOKEN. */
function startRank(args: string[], env: Record<string, string>): { child: ChildProcess; results: Result[]; output: () => string; exit: Promise<[number | null, NodeJS.Signals | null]> } {
  const base: NodeJS.ProcessEnv = { ...process.env, ...typescriptEnv, ...env };
  delete base.SAPIPE_TOKEN;
  const child = spawn(process.execPath, [...typescriptNodeArgs(), FIXTURE, ...args], { cwd: repoRoot, env: base, stdio: ['pipe', 'pipe', 'pipe'] });
  const results: Result[] = [];
  let out = '';
  let pending = '';
  child.stdout!.on('data', (chunk: Buffer) => {
    out += chunk.toString();
    pending += chunk.toString();
    const lines = pending.split('\n');
    pending = lines.pop()!;
    for (const line of lines) if (line.startsWith('RESULT ')) results.push(JSON.parse(line.slice(7)) as Result);
  });
  child.stderr!.on('data', (chunk: Buffer) => (out += chunk.toString()));
  const exit = once(child, 'exit') as Promise<[number | null, NodeJS.Signals | null]>;
  return { child, results, output: () => out, exit };
}

/** Resolves with whether the server closed `socket` within `ms`. */
function closedWithin(socket: Socket, ms: number): Promise<boolean> {
  if (socket.destroyed || socket.readableEnded) return Promise.resolve(true);
  return new Promise((resolve) => {
    const timer = setTimeout(() => resolve(false), ms);
    socket.once('close', () => {
      clearTimeout(timer);
      resolve(true);
    });
  });
}

async function rawConnect(port: number): Promise<Socket> {
  const socket = connect({ host: '127.0.0.1', port });
  socket.on('error', () => {});
  await once(socket, 'connect');
  return socket;
}

function header(length: number): Buffer {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(length, 0);
  return b;
}

function rssKiB(pid: number, field: 'VmRSS' | 'VmHWM'): number {
  const m = new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return Number(m![1]);
}

/** The first byte of a UCX worker address on this machine: the header every rank's UCX writes. */
function ucxHeaderByte(): number {
  const handle = new (ucxAddon().UcxComm)(0, 2, 1000, 1024, true);
  try {
    return handle.address()[0]!;
  } finally {
    handle.destroy();
  }
}

function addressPayload(host: string, address: Buffer): Buffer {
  const h = Buffer.from(host);
  const head = Buffer.alloc(2);
  head.writeUInt16BE(h.length, 0);
  return Buffer.concat([head, h, address]);
}

t.test('values planted for a rank that has not published: ranks started without a token fail with RendezvousError naming the key, never abort', needsUcx, async (t) => {
  const port = await findFreePort();
  const good = ucxHeaderByte();
  const ucxTail = (first: number, length = 200): Buffer => {
    const b = randomBytes(length);
    b[0] = first;
    return b;
  };
  // The report's bytes first: a 2-byte length, a host name and 64 random bytes.
  const reported = (() => {
    const host = Buffer.from('evil-host');
    const length = Buffer.alloc(2);
    length.writeUInt16LE(host.length, 0);
    return Buffer.concat([length, host, randomBytes(64)]);
  })();
  const variants: { value: Buffer; why: RegExp }[] = [
    { value: reported, why: /envelope/ },
    { value: randomBytes(300), why: /envelope|bytes/ },
    // The envelope's other checks (world size, length, kind) are the same code for every kind: below, on liveness records and the NCCL id.
    { value: sealEnvelope(EnvelopeKind.UcxAddress, 1, 3, addressPayload('evil-host', ucxTail(good))), why: /from rank 1/ },
    { value: sealEnvelope(EnvelopeKind.UcxAddress, 2, 3, addressPayload('evil-host', ucxTail(good ^ 0x07))), why: /UCX address header/ },
    { value: sealEnvelope(EnvelopeKind.UcxAddress, 2, 3, addressPayload('evil-host', ucxTail(good, 4))), why: /UCX address of 4 bytes/ },
  ];
  const env = { WORLD_SIZE: '3', MASTER_PORT: String(port), MASTER_ADDR: '127.0.0.1' };
  const ranks = [0, 1].map((rank) => startRank(['planted', String(variants.length)], { ...env, RANK: String(rank) }));
  t.teardown(() => ranks.forEach((r) => r.child.kill('SIGKILL')));

  // Any local process: it connects without a token and plays rank 2 in each communicator's
  // liveness mesh (so the ranks get as far as reading addresses), then plants rank 2's address.
  const intruder = await createRendezvous({ rank: 2, worldSize: 3, port, timeoutMs: 20_000 });
  const meshes: LivenessMesh[] = [];
  try {
    for (const [generation, { value }] of variants.entries()) {
      meshes.push(await LivenessMesh.join(intruder, `sapipe/ucx/${generation}`, 2, 3, undefined, 20_000, () => {}));
      await intruder.set(`sapipe/ucx/${generation}/address/2`, value);
    }
    const exits = await Promise.all(ranks.map((r) => r.exit));
    for (const [rank, [code, signal]] of exits.entries()) {
      t.equal(signal, null, `rank ${rank} was not killed by a signal (no abort in UCX)`);
      t.equal(code, 0, `rank ${rank} exited normally\n${ranks[rank]!.output().slice(-3000)}`);
      const results = ranks[rank]!.results;
      t.equal(results.length, variants.length, `rank ${rank}: every planted value was met`);
      for (const [generation, { why }] of variants.entries()) {
        const r = results.find((x) => x.variant === generation);
        t.equal(r?.code, 'ERR_RENDEZVOUS', `rank ${rank}, value ${generation}: a RendezvousError (${String(r?.message)})`);
        t.equal(r?.reason, 'malformed');
        t.match(String(r?.message), `'sapipe/ucx/${generation}/address/2'`, 'naming the key');
        t.match(String(r?.message), why, `and what is wrong with it (${String(r?.message)})`);
      }
    }
  } finally {
    meshes.forEach((m) => m.close());
    await intruder.close();
  }
});

t.test('liveness records read from the store are checked before use', async (t) => {
  const store = await createRendezvous({ rank: 0, worldSize: 2, port: 0, timeoutMs: 5000 });
  t.teardown(() => store.close());
  const record = (port: number, host: string): Buffer => {
    const head = Buffer.alloc(2);
    head.writeUInt16BE(port, 0);
    return Buffer.concat([head, randomBytes(16), Buffer.from(host, 'latin1')]);
  };
  const variants: { value: Buffer; why: RegExp }[] = [
    { value: Buffer.from(JSON.stringify({ host: '127.0.0.1', port: 1, secret: '00' })), why: /envelope/ },
    { value: randomBytes(64), why: /envelope|bytes/ },
    { value: Buffer.alloc(0), why: /0 bytes/ },
    { value: sealEnvelope(EnvelopeKind.Liveness, 0, 2, record(4000, '127.0.0.1')).subarray(0, 40), why: /announces/ },
    { value: sealEnvelope(EnvelopeKind.Liveness, 1, 2, record(4000, '127.0.0.1')), why: /from rank 1/ },
    { value: sealEnvelope(EnvelopeKind.Liveness, 0, 3, record(4000, '127.0.0.1')), why: /counts 3 ranks/ },
    { value: sealEnvelope(EnvelopeKind.UcxAddress, 0, 2, record(4000, '127.0.0.1')), why: /UCX worker address/ },
    { value: sealEnvelope(EnvelopeKind.Liveness, 0, 2, record(0, '127.0.0.1')), why: /port 0/ },
    { value: sealEnvelope(EnvelopeKind.Liveness, 0, 2, record(4000, 'a b;rm -rf')), why: /host/ },
    { value: sealEnvelope(EnvelopeKind.Liveness, 0, 2, record(4000, 'x'.repeat(400))), why: /outside/ },
  ];
  for (const [i, { value, why }] of variants.entries()) {
    const prefix = `planted-${i}`;
    await store.set(`${prefix}/live/0`, value);
    const error = await LivenessMesh.join(store, prefix, 1, 2, undefined, 2000, () => {}).then(
      (mesh) => mesh.close(),
      (e: unknown) => e,
    );
    t.ok(error instanceof RendezvousError, `value ${i}: RendezvousError (${String(error)})`);
    t.match(String((error as Error).message), `'${prefix}/live/0'`, 'naming the key');
    t.match(String((error as Error).message), why);
  }
});

t.test('the NCCL unique id read from the store is checked before it reaches NCCL', async (t) => {
  const { decodeNcclId } = await import('../../dist/comm/nccl.js');
  const id = randomBytes(128);
  t.same([...decodeNcclId('k', sealEnvelope(EnvelopeKind.NcclId, 0, 4, id), 4)], [...id], 'rank 0\'s id passes');
  const variants: [Buffer, RegExp][] = [
    [randomBytes(128), /envelope/],
    [randomBytes(146), /envelope/],
    [sealEnvelope(EnvelopeKind.NcclId, 1, 4, id), /from rank 1/],
    [sealEnvelope(EnvelopeKind.NcclId, 0, 3, id), /counts 3 ranks/],
    [sealEnvelope(EnvelopeKind.NcclId, 0, 4, id.subarray(0, 127)), /127 bytes/],
    [sealEnvelope(EnvelopeKind.Liveness, 0, 4, id), /liveness/],
  ];
  for (const [value, why] of variants) t.throws(() => decodeNcclId('sapipe/nccl/0/id', value, 4), { code: 'ERR_RENDEZVOUS', message: why });
  t.throws(() => decodeNcclId('sapipe/nccl/0/id', randomBytes(128), 4), { message: /'sapipe\/nccl\/0\/id'/ }, 'naming the key');

  // NcclCommunicator.create itself, on the CUDA plugin over host memory (no GPU needed), in a
  // child: the plugin is chosen when the addon first opens it.
  const plugin = fileURLToPath(new URL('../../build/Release/test-fakes/sapipe_test_plugin_host_memory.so', import.meta.url));
  const store = await createRendezvous({ rank: 0, worldSize: 2, port: 0, timeoutMs: 10_000 });
  t.teardown(() => store.close());
  await store.set('sapipe/nccl/0/id', randomBytes(128));
  const script = `
    const { NcclCommunicator } = await import(${JSON.stringify(fileURLToPath(new URL('../../lib/comm/nccl.js', import.meta.url)))});
    try { await NcclCommunicator.create({ rank: 1, size: 2, device: 'cuda:0', env: true, timeoutMs: 5000 }); console.log('RESULT {"created":true}'); }
    catch (e) { console.log('RESULT ' + JSON.stringify({ code: e.code, message: e.message })); }`;
  const child = spawn(process.execPath, [...typescriptNodeArgs(), '--input-type=module', '-e', script], {
    cwd: repoRoot,
    env: { ...process.env, ...typescriptEnv, SAPIPE_CUDA_PLUGIN: plugin, RANK: '1', WORLD_SIZE: '2', MASTER_PORT: String(store.port) },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  child.stdout.on('data', (c: Buffer) => (out += c.toString()));
  child.stderr.on('data', (c: Buffer) => (out += c.toString()));
  const [code, signal] = (await once(child, 'exit')) as [number | null, NodeJS.Signals | null];
  t.equal(signal, null);
  t.equal(code, 0, out.slice(-2000));
  const line = /^RESULT (.*)$/m.exec(out);
  const result = line ? (JSON.parse(line[1]!) as Result) : undefined;
  if (result?.code === 'ERR_BACKEND_UNAVAILABLE') t.comment(`NcclCommunicator.create not reached: the CUDA plugin over host memory is not usable here: ${String(result.message)}`);
  else {
    t.equal(result?.code, 'ERR_RENDEZVOUS', `a planted id is a RendezvousError (${out.slice(-1000)})`);
    t.match(String(result?.message), "'sapipe/nccl/0/id'");
  }
});

t.test('keys a rank publishes about itself are written once', async (t) => {
  const store = await createRendezvous({ rank: 0, worldSize: 2, port: 0, timeoutMs: 5000 });
  const other = await RendezvousClient.connect({ port: store.port, timeoutMs: 5000 });
  t.teardown(async () => {
    await other.close();
    await store.close();
  });
  await store.setOnce('mine', 'first');
  await t.rejects(other.setOnce('mine', 'second'), { code: 'ERR_RENDEZVOUS', reason: 'taken', message: /'mine'/ });
  await t.rejects(other.set('mine', 'second'), { code: 'ERR_RENDEZVOUS', reason: 'taken' }, 'set() cannot replace it either');
  await t.rejects(other.add('mine', 1), { code: 'ERR_RENDEZVOUS', reason: 'taken' }, 'nor add()');
  t.equal(await other.getString('mine'), 'first');
  await other.set('planted', 'early');
  await t.rejects(store.setOnce('planted', 'mine'), { code: 'ERR_RENDEZVOUS', reason: 'taken', message: /'planted'/ }, 'a value set before the owner publishes is found out');
  await other.set('plain', 'a');
  await store.set('plain', 'b');
  t.equal(await other.getString('plain'), 'b', 'ordinary keys are still replaced');
});

t.test('a flood of connections announcing 16 MiB frames without HELLO costs the store next to no memory', async (t) => {
  const server = startRank(['store', '10000'], {});
  t.teardown(() => server.child.kill('SIGKILL'));
  const [line] = (await once(server.child.stdout!, 'data')) as [Buffer];
  const port = Number(/PORT (\d+)/.exec(line.toString())![1]);
  const pid = server.child.pid!;
  const before = rssKiB(pid, 'VmHWM');
  const payload = Buffer.alloc(16 * 1024 * 1024, 0x41);
  const sockets = await Promise.all(Array.from({ length: 60 }, () => rawConnect(port)));
  for (const s of sockets) {
    s.write(header(payload.length));
    s.write(payload);
  }
  const closed = await Promise.all(sockets.map((s) => closedWithin(s, 5000)));
  t.equal(closed.filter(Boolean).length, 60, 'every connection is closed, from its header alone');
  const grownMiB = (rssKiB(pid, 'VmHWM') - before) / 1024;
  t.ok(grownMiB < 100, `the store's peak memory grew by ${grownMiB.toFixed(1)} MiB (60 x 16 MiB were sent)`);
  sockets.forEach((s) => s.destroy());
  const client = await RendezvousClient.connect({ port, timeoutMs: 5000 });
  await client.set('after', 'flood');
  t.equal(await client.getString('after'), 'flood', 'and it serves a client after it');
  await client.close();
  server.child.stdin!.end();
});

t.test('frames before HELLO are limited to a few KiB; after it, to maxMessageBytes', async (t) => {
  const server = await RendezvousServer.listen({ port: 0, handshakeTimeoutMs: 5000 });
  t.teardown(() => server.close());
  const big = await rawConnect(server.port);
  big.write(header(5000));
  t.ok(await closedWithin(big, 1000), 'a 5000-byte frame before HELLO is refused from its header, long before the handshake timeout');
  // A HELLO and, in the same write, a 5000-byte SET: the limit rises between the two frames.
  const hello = Buffer.concat([header(12), Buffer.from([0x01, 0, 0, 0, 1, 0x53, 0x41, 0x50, 0x52, 2, 0, 0])]);
  const value = Buffer.alloc(5000 - 5 - 3, 0x62);
  const set = Buffer.concat([header(5000), Buffer.from([0x02, 0, 0, 0, 2, 0, 1, 0x6b]), value]);
  const ok = await rawConnect(server.port);
  const replies: Buffer[] = [];
  ok.on('data', (c: Buffer) => replies.push(c));
  ok.write(Buffer.concat([hello, set]));
  await new Promise((resolve) => setTimeout(resolve, 300));
  t.equal(Buffer.concat(replies).toString('hex'), '0000000680000000010000000006800000000200', 'both answered OK');
  ok.destroy();
  const client = await RendezvousClient.connect({ port: server.port, timeoutMs: 2000 });
  t.equal((await client.get('k')).length, value.length, 'the value was stored');
  await client.close();
});

t.test('connections beyond maxPendingConnections are closed at once; ranks retry until served', async (t) => {
  const server = await RendezvousServer.listen({ port: 0, handshakeTimeoutMs: 1500, maxPendingConnections: 8 });
  t.teardown(() => server.close());
  const sockets = await Promise.all(Array.from({ length: 20 }, () => rawConnect(server.port)));
  const closed = await Promise.all(sockets.map((s) => closedWithin(s, 400)));
  t.equal(closed.filter(Boolean).length, 12, '12 of 20 silent connections are closed at once');
  t.equal(server.connectionCount, 8, 'the other 8 wait for their HELLO');
  const start = Date.now();
  const client = await RendezvousClient.connect({ port: server.port, timeoutMs: 5000 });
  t.ok(Date.now() - start >= 500, `a client arriving while the cap is reached is served once the strangers time out (${Date.now() - start} ms)`);
  await client.set('served', 'yes');
  t.ok((await Promise.all(sockets.map((s) => closedWithin(s, 2000)))).every(Boolean), 'every stranger is closed by the handshake timeout');
  await client.close();
  await t.rejects(RendezvousServer.listen({ port: 0, maxPendingConnections: 0 }), InvalidArgumentError);
});

t.test('a connection that sends part of a frame is closed by the handshake timeout', async (t) => {
  const server = await RendezvousServer.listen({ port: 0, handshakeTimeoutMs: 300 });
  t.teardown(() => server.close());
  const partialBody = await rawConnect(server.port);
  partialBody.write(Buffer.concat([header(100), Buffer.alloc(10)]));
  const partialHeader = await rawConnect(server.port);
  partialHeader.write(Buffer.from([0, 0]));
  const start = Date.now();
  t.ok(await closedWithin(partialBody, 3000), 'half a body');
  t.ok(await closedWithin(partialHeader, 3000), 'half a header');
  t.ok(Date.now() - start < 2000, `within the timeout (${Date.now() - start} ms)`);
  t.equal(server.connectionCount, 0);
});

t.test('no token on an address other machines reach: refused unless allowed', async (t) => {
  await t.rejects(RendezvousServer.listen({ port: 0, host: '0.0.0.0' }), { code: 'ERR_INVALID_ARGUMENT', message: /without a token.*SAPIPE_TOKEN.*SAPIPE_ALLOW_NO_TOKEN/s });
  await t.rejects(createRendezvous({ rank: 0, worldSize: 1, port: 0, bindAddr: '0.0.0.0' }), { code: 'ERR_INVALID_ARGUMENT', message: /without a token/ });
  for (const options of [{ token: 'secret' }, { allowNoToken: true }]) {
    const server = await RendezvousServer.listen({ port: 0, host: '0.0.0.0', ...options });
    t.equal(server.host, '0.0.0.0', `served with ${JSON.stringify(options)}`);
    await server.close();
  }
  const local = await RendezvousServer.listen({ port: 0 });
  t.equal(local.host, '127.0.0.1', 'loopback needs no token');
  await local.close();
  t.equal(fromEnv({ RANK: '0', WORLD_SIZE: '1', SAPIPE_ALLOW_NO_TOKEN: '1' }).allowNoToken, true);
  t.equal(fromEnv({ RANK: '0', WORLD_SIZE: '1' }).allowNoToken, undefined);
  t.throws(() => fromEnv({ RANK: '0', WORLD_SIZE: '1', SAPIPE_ALLOW_NO_TOKEN: 'maybe' }), { code: 'ERR_INVALID_ARGUMENT', message: /SAPIPE_ALLOW_NO_TOKEN/ });
});

t.test('a busy port: retried while it is released, else a RendezvousError that says what to do', async (t) => {
  const port = await findFreePort();
  const holder = createServer();
  await new Promise<void>((resolve) => holder.listen(port, '127.0.0.1', resolve));
  const start = Date.now();
  const error = await RendezvousServer.listen({ port, busyPortTimeoutMs: 300 }).then(
    (s) => s.close(),
    (e: unknown) => e,
  );
  t.ok(error instanceof RendezvousError, String(error));
  t.match(error, { code: 'ERR_RENDEZVOUS', reason: 'port-in-use', message: new RegExp(`${port}: the port is in use.*300 ms.*MASTER_PORT`, 's') });
  t.ok(Date.now() - start >= 300 && Date.now() - start < 3000, 'after retrying for the time given');
  setTimeout(() => holder.close(), 300);
  const server = await RendezvousServer.listen({ port, busyPortTimeoutMs: 5000 });
  t.equal(server.port, port, 'a port released meanwhile is taken');
  await server.close();

  // A store closing while a rank is still connected lets go of the port at once.
  const first = await createRendezvous({ rank: 0, worldSize: 2, port, timeoutMs: 5000 });
  const rank1 = await createRendezvous({ rank: 1, worldSize: 2, port, timeoutMs: 5000 });
  const closing = first.close();
  const second = await createRendezvous({ rank: 0, worldSize: 2, port, timeoutMs: 5000 });
  t.equal(second.port, port, 'the next store binds the port while the previous one drains');
  await rank1.close();
  await closing;
  await second.close();
});

t.test('UcxCommunicator.create() right after destroy() on the same MASTER_PORT', needsUcx, async (t) => {
  const port = await findFreePort();
  for (const nproc of [1, 2]) {
    let out = '';
    const sink = new Writable({
      write(chunk: Buffer, _encoding, callback): void {
        out += chunk.toString();
        callback();
      },
    });
    const result = await launch({
      script: FIXTURE,
      args: ['cycle', '3'],
      nproc,
      masterPort: port,
      nodeArgs: typescriptNodeArgs(),
      cwd: repoRoot,
      env: { ...process.env, ...typescriptEnv },
      forwardSignals: false,
      stdout: sink,
      stderr: sink,
    });
    t.equal(result.exitCode, 0, `${nproc} rank(s): three create/destroy cycles on port ${port}\n${out.slice(-3000)}`);
    const sums = [...out.matchAll(/^\[(\d+)\] RESULT (.*)$/gm)].map((m) => JSON.parse(m[2]!) as Result);
    t.equal(sums.length, 3 * nproc, 'every round of every rank reported');
    t.ok(sums.every((r) => r.sum === (nproc * (nproc + 1)) / 2), `and summed right: ${JSON.stringify(sums)}`);
  }
});
