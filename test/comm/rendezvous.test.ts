import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { connect, type Socket } from 'node:net';

import t from 'tap';

import {
  RendezvousClient,
  RendezvousServer,
  createRendezvous,
  fromEnv,
  type RendezvousClientOptions,
} from '../../dist/comm/rendezvous/index.js';
import { findFreePort } from '../../dist/launch/free-port.js';
import { fixture, repoRoot, typescriptEnv, typescriptNodeArgs } from '../fixtures/launch/typescript-child.js';

async function withServer(
  options: { token?: string; maxMessageBytes?: number },
  body: (server: RendezvousServer, connectClient: (extra?: Partial<RendezvousClientOptions>) => Promise<RendezvousClient>) => Promise<void>,
): Promise<void> {
  const server = await RendezvousServer.listen({ port: 0, ...options });
  const clients: RendezvousClient[] = [];
  const connectClient = async (extra: Partial<RendezvousClientOptions> = {}): Promise<RendezvousClient> => {
    const client = await RendezvousClient.connect({
      port: server.port,
      timeoutMs: 5000,
      ...(options.token !== undefined && { token: options.token }),
      ...extra,
    });
    clients.push(client);
    return client;
  };
  try {
    await body(server, connectClient);
  } finally {
    await Promise.all(clients.map((c) => c.close()));
    await server.close();
  }
}

/** Opens a raw TCP connection, sends bytes, and resolves once the server has closed it. */
async function sendRaw(port: number, bytes: Buffer): Promise<{ closedByServer: boolean; received: Buffer }> {
  const socket: Socket = connect({ host: '127.0.0.1', port });
  await once(socket, 'connect');
  const chunks: Buffer[] = [];
  socket.on('data', (c: Buffer) => chunks.push(c));
  socket.on('error', () => {});
  socket.write(bytes);
  const closed = once(socket, 'close').then(() => true);
  const timer = new Promise<boolean>((resolve) => setTimeout(() => resolve(false), 3000));
  const closedByServer = await Promise.race([closed, timer]);
  socket.destroy();
  return { closedByServer, received: Buffer.concat(chunks) };
}

function header(length: number): Buffer {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(length, 0);
  return b;
}

t.test('set, get, tryGet, wait and add across clients', async (t) => {
  await withServer({}, async (_server, connectClient) => {
    const [a, b, c] = await Promise.all([connectClient(), connectClient(), connectClient()]);
    const binary = Uint8Array.from([0, 255, 1, 254, 10, 13]);
    // get() and wait() issued before the keys exist resolve when another client sets them.
    const gotLater = b!.get('bin');
    const waited = c!.wait(['bin', 'text']);
    t.equal(await a!.tryGet('bin'), undefined);
    await a!.set('bin', binary);
    await a!.set('text', 'héllo');
    t.same([...(await gotLater)], [...binary]);
    await waited;
    t.equal(await c!.getString('text'), 'héllo');
    t.same([...(await c!.tryGet('bin'))!], [...binary]);
    await b!.set('text', 'replaced');
    t.equal(await a!.getString('text'), 'replaced');
    await a!.set('empty', new Uint8Array(0));
    t.equal((await b!.get('empty')).length, 0);

    const counts = await Promise.all([a!, b!, c!, a!, b!, c!].map((client) => client.add('counter')));
    t.same([...counts].sort((x, y) => x - y), [1, 2, 3, 4, 5, 6], 'add is atomic');
    t.equal(await a!.add('counter', -10), -4);
    t.equal(await b!.getString('counter'), '-4');
    await t.rejects(a!.add('text', 1), { code: 'ERR_INVALID_ARGUMENT' }, 'add on a non-integer value');
    await t.rejects(a!.set('', 'x'), { code: 'ERR_INVALID_ARGUMENT' });
    await t.rejects(a!.set('k', 3 as unknown as string), { code: 'ERR_INVALID_ARGUMENT' });
  });
});

t.test('values up to the message limit arrive whole', async (t) => {
  await withServer({}, async (_server, connectClient) => {
    const [a, b] = await Promise.all([connectClient(), connectClient()]);
    const big = new Uint8Array(8 * 1024 * 1024 + 3);
    for (let i = 0; i < big.length; i++) big[i] = (i * 31) & 0xff;
    await a!.set('big', big);
    const got = await b!.get('big');
    t.equal(got.length, big.length);
    t.ok(got.equals(Buffer.from(big.buffer)), 'same bytes');
  });
});

t.test('barrier releases everyone only when all have arrived, and can be reused', async (t) => {
  await withServer({}, async (_server, connectClient) => {
    const clients = await Promise.all([0, 1, 2, 3].map(() => connectClient()));
    for (let round = 0; round < 3; round++) {
      let released = 0;
      const early = clients.slice(0, 3).map((c) => c.barrier('step', 4).then(() => released++));
      await new Promise((resolve) => setTimeout(resolve, 100));
      t.equal(released, 0, `round ${round}: nobody passes before the last arrives`);
      await Promise.all([...early, clients[3]!.barrier('step', 4)]);
    }
    await t.rejects(clients[0]!.barrier('lonely', 2, { timeoutMs: 150 }), { code: 'ERR_TIMEOUT' });
  });
});

t.test('wait and get time out with ERR_TIMEOUT and the client stays usable', async (t) => {
  await withServer({}, async (_server, connectClient) => {
    const client = await connectClient({ timeoutMs: 200 });
    const start = Date.now();
    await t.rejects(client.wait('missing'), { code: 'ERR_TIMEOUT' });
    t.ok(Date.now() - start < 2000);
    await t.rejects(client.get('missing', { timeoutMs: 100 }), { code: 'ERR_TIMEOUT' });
    await t.rejects(client.wait(['a', 'b'], { timeoutMs: 0 }), { code: 'ERR_INVALID_ARGUMENT' });
    await client.set('present', '1');
    t.equal(await client.getString('present'), '1');
  });
});

t.test('a wrong or missing token is refused and the store keeps serving', async (t) => {
  await withServer({ token: 's3cret' }, async (server, connectClient) => {
    const good = await connectClient();
    await t.rejects(RendezvousClient.connect({ port: server.port, token: 'wrong', timeoutMs: 2000 }), {
      code: 'ERR_INVALID_ARGUMENT',
    });
    await t.rejects(RendezvousClient.connect({ port: server.port, timeoutMs: 2000 }), { code: 'ERR_INVALID_ARGUMENT' });
    await good.set('still', 'serving');
    const another = await connectClient();
    t.equal(await another.getString('still'), 'serving');
  });
});

t.test('garbage, oversized and out-of-order messages close that connection only', async (t) => {
  await withServer({ maxMessageBytes: 1024 }, async (server, connectClient) => {
    const client = await connectClient({ maxMessageBytes: 1024 });
    const pending = client.get('after-garbage');

    const garbage = await sendRaw(server.port, Buffer.from('GET / HTTP/1.1\r\nHost: x\r\n\r\n'));
    t.ok(garbage.closedByServer, 'garbage closes the connection');
    const oversized = await sendRaw(server.port, header(0xffffffff));
    t.ok(oversized.closedByServer, 'a 4 GiB length prefix is refused from the header alone');
    const overLimit = await sendRaw(server.port, header(1025));
    t.ok(overLimit.closedByServer, 'a length just over the limit is refused');
    const empty = await sendRaw(server.port, header(0));
    t.ok(empty.closedByServer, 'an empty frame is refused');
    // A SET before HELLO: well-formed framing, wrong order.
    const setBeforeHello = Buffer.concat([header(9), Buffer.from([0x02, 0, 0, 0, 1, 0, 1, 0x6b, 0x76])]);
    t.ok((await sendRaw(server.port, setBeforeHello)).closedByServer, 'a request before HELLO is refused');
    const hello = Buffer.concat([header(12), Buffer.from([0x01, 0, 0, 0, 1, 0x53, 0x41, 0x50, 0x52, 1, 0, 0])]);
    const unknownOp = Buffer.concat([hello, header(5), Buffer.from([0x7f, 0, 0, 0, 2])]);
    const accepted = await sendRaw(server.port, unknownOp);
    t.ok(accepted.closedByServer, 'an unknown opcode after a good HELLO is refused');
    t.equal(accepted.received.subarray(0, 10).toString('hex'), '00000006800000000100', 'the HELLO itself was answered OK');
    const badKey = Buffer.concat([hello, header(9), Buffer.from([0x02, 0, 0, 0, 2, 0, 1, 0xff, 0x76])]);
    t.ok((await sendRaw(server.port, badKey)).closedByServer, 'a key that is not UTF-8 is refused');
    const truncated = Buffer.concat([hello, header(8), Buffer.from([0x02, 0, 0, 0, 2, 0, 9, 0x6b])]);
    t.ok((await sendRaw(server.port, truncated)).closedByServer, 'a key longer than its message is refused');
    t.equal(server.size, 0, 'nothing was stored by the refused connections');

    await t.rejects(client.set('big', new Uint8Array(2000)), { code: 'ERR_INVALID_ARGUMENT' }, 'the client checks the limit too');
    await client.set('after-garbage', 'ok');
    t.equal((await pending).toString(), 'ok', 'a wait pending during all that completes');
  });
});

t.test('losing the server fails pending and later calls with ERR_PEER_LOST', async (t) => {
  await withServer({}, async (server, connectClient) => {
    const client = await connectClient();
    const outcomes = Promise.all(
      [client.wait('never'), client.get('never-either')].map((p: Promise<unknown>) =>
        p.then(
          () => 'resolved',
          (error: { code?: string }) => error.code,
        ),
      ),
    );
    await server.close();
    t.same(await outcomes, ['ERR_PEER_LOST', 'ERR_PEER_LOST']);
    await t.rejects(client.set('x', 'y'), { code: 'ERR_PEER_LOST' });
    t.ok(client.closed);
  });
});

t.test('a server process killed with SIGKILL fails pending waits with ERR_PEER_LOST', async (t) => {
  const child = spawn(process.execPath, [...typescriptNodeArgs(), fixture('rendezvous-server.ts')], {
    cwd: repoRoot,
    env: { ...process.env, ...typescriptEnv },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  t.teardown(() => {
    child.kill('SIGKILL');
  });
  const [line] = (await once(child.stdout, 'data')) as [Buffer];
  const port = Number(line.toString().trim());
  const client = await RendezvousClient.connect({ port, timeoutMs: 10_000 });
  await client.set('before', 'kill');
  const pending = client.wait('never');
  child.kill('SIGKILL');
  const start = Date.now();
  await t.rejects(pending, { code: 'ERR_PEER_LOST' });
  t.ok(Date.now() - start < 5000, 'fails promptly, not at the timeout');
  await client.close();
});

t.test('clients retry until the store comes up, and time out if it never does', async (t) => {
  // Below the ephemeral range (as the launcher picks): no outgoing socket can take it meanwhile.
  const port = await findFreePort();
  const connecting = RendezvousClient.connect({ port, timeoutMs: 5000 });
  await new Promise((resolve) => setTimeout(resolve, 300));
  const server = await RendezvousServer.listen({ port });
  const client = await connecting;
  await client.set('late', 'start');
  await client.close();
  await server.close();

  const start = Date.now();
  await t.rejects(RendezvousClient.connect({ port, timeoutMs: 300 }), { code: 'ERR_TIMEOUT' });
  t.ok(Date.now() - start < 3000);
});

t.test('createRendezvous: rank 0 serves on an ephemeral port, other ranks join it', async (t) => {
  const root = await createRendezvous({ rank: 0, worldSize: 3, port: 0, token: 'tk', timeoutMs: 5000 });
  t.ok(root.port > 0, 'reports the bound port');
  t.equal(root.server?.host, '127.0.0.1', 'binds loopback by default');
  const others = await Promise.all(
    [1, 2].map((rank) => createRendezvous({ rank, worldSize: 3, addr: '127.0.0.1', port: root.port, token: 'tk', timeoutMs: 5000 })),
  );
  const all = [root, ...others];
  await Promise.all(all.map((r) => r.set(`addr/${r.rank}`, Buffer.from([r.rank, 42]))));
  const seen = await Promise.all(all.map((r) => Promise.all([0, 1, 2].map((peer) => r.get(`addr/${peer}`)))));
  for (const row of seen) t.same(row.map((b) => [...b]), [[0, 42], [1, 42], [2, 42]]);
  await Promise.all(all.map((r) => r.barrier('done')));
  await Promise.all(others.map((r) => r.close()));
  await root.close();

  await t.rejects(createRendezvous({ rank: 3, worldSize: 3, port: 1 }), { code: 'ERR_INVALID_ARGUMENT' });
  await t.rejects(createRendezvous({ rank: 1, worldSize: 3, port: 0 }), { code: 'ERR_INVALID_ARGUMENT' });
  await t.rejects(createRendezvous({ rank: 0, worldSize: 1, port: 70000 }), { code: 'ERR_INVALID_ARGUMENT' });
  // rank 0's store takes the cap on connections before HELLO (checked by the store itself)
  await t.rejects(createRendezvous({ rank: 0, worldSize: 1, port: 0, maxPendingConnections: 0 }), { code: 'ERR_INVALID_ARGUMENT', message: /maxPendingConnections/ });
  const capped = await createRendezvous({ rank: 0, worldSize: 1, port: 0, maxPendingConnections: 3 });
  await capped.close();
});

t.test('group(): a group of the ranks with its own ranks, size, keys and barriers, on the same store', async (t) => {
  const root = await createRendezvous({ rank: 0, worldSize: 4, port: 0, timeoutMs: 5000 });
  const others = await Promise.all([1, 2, 3].map((rank) => createRendezvous({ rank, worldSize: 4, port: root.port, timeoutMs: 5000 })));
  const all = [root, ...others];
  // Two groups of two named 'pair-0' and 'pair-1', ranks 0-1 and 2-3, each with ranks 0 and 1.
  const groups = all.map((r) => r.group(`pair-${Math.floor(r.rank / 2)}`, r.rank % 2, 2));
  t.same(groups.map((g) => [g.rank, g.worldSize]), [[0, 2], [1, 2], [0, 2], [1, 2]]);
  await Promise.all(groups.map((g, i) => g.set(`addr/${g.rank}`, `job rank ${i}`)));
  const seen = await Promise.all(groups.map((g) => g.getString(`addr/${1 - g.rank}`)));
  t.same(seen, ['job rank 1', 'job rank 0', 'job rank 3', 'job rank 2'], 'each group sees its own keys under the same names');
  t.equal(await root.tryGet('addr/0'), undefined, 'the job\'s keys are apart from the groups\'');
  t.equal(await root.getString('group/pair-1/addr/0'), 'job rank 2');
  await Promise.all(groups.map((g) => g.barrier('met'))); // two ranks per group: the barrier is the group's
  t.same(await Promise.all(groups.map((g) => g.add('count'))).then((v) => v.sort()), [1, 1, 2, 2]);
  await Promise.all(groups.map((g) => g.close())); // a view: closes nothing
  t.equal(await others[0]!.getString('group/pair-0/addr/1'), 'job rank 1', 'the connection outlives the views');
  t.throws(() => root.group('a/b', 0, 2), { code: 'ERR_INVALID_ARGUMENT', message: /without '\/'/ });
  t.throws(() => root.group('big', 0, 5), { code: 'ERR_INVALID_ARGUMENT', message: /5 ranks in a job of 4/ });
  t.throws(() => root.group('r', 2, 2), { code: 'ERR_INVALID_ARGUMENT' });
  await t.rejects(groups[0]!.get(Symbol('k') as never), { code: 'ERR_INVALID_ARGUMENT' }, 'a key that is not a string is refused by the client, typed');
  await Promise.all(all.map((r) => r.barrier('done')));
  await Promise.all(others.map((r) => r.close()));
  await root.close();
});

t.test('close() leaves nothing that keeps the process alive', async (t) => {
  const child = spawn(process.execPath, [...typescriptNodeArgs(), fixture('rendezvous-close.ts')], {
    cwd: repoRoot,
    env: { ...process.env, ...typescriptEnv },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const timer = setTimeout(() => child.kill('SIGKILL'), 15_000);
  let out = '';
  child.stdout.on('data', (c: Buffer) => (out += c.toString()));
  const [code, signal] = (await once(child, 'exit')) as [number | null, NodeJS.Signals | null];
  clearTimeout(timer);
  t.equal(signal, null, 'exited by itself, not killed at the deadline');
  t.equal(code, 0);
  t.equal(out.trim(), 'closed ERR_DISPOSED', 'a call pending at close() fails with ERR_DISPOSED');
});

t.test('fromEnv reads torchrun, mpirun and Slurm variables', async (t) => {
  t.match(fromEnv({ RANK: '2', WORLD_SIZE: '4', LOCAL_RANK: '0', LOCAL_WORLD_SIZE: '2', MASTER_ADDR: 'node1', MASTER_PORT: '1234' }), {
    rank: 2,
    worldSize: 4,
    localRank: 0,
    localWorldSize: 2,
    addr: 'node1',
    port: 1234,
    source: 'torchrun',
  });
  t.match(fromEnv({ OMPI_COMM_WORLD_RANK: '1', OMPI_COMM_WORLD_SIZE: '2', OMPI_COMM_WORLD_LOCAL_RANK: '1' }), {
    rank: 1,
    worldSize: 2,
    localRank: 1,
    addr: '127.0.0.1',
    port: 29500,
    source: 'mpirun',
  });
  t.match(fromEnv({ SLURM_PROCID: '5', SLURM_NTASKS: '8', SLURM_LOCALID: '1', SAPIPE_TOKEN: 'x', SAPIPE_BIND_ADDR: '0.0.0.0' }), {
    rank: 5,
    worldSize: 8,
    localRank: 1,
    token: 'x',
    bindAddr: '0.0.0.0',
    source: 'slurm',
  });
  t.equal(fromEnv({ RANK: '0', WORLD_SIZE: '1', SLURM_PROCID: '3', SLURM_NTASKS: '4' }).source, 'torchrun', 'torchrun wins');
  t.throws(() => fromEnv({}), { code: 'ERR_INVALID_ARGUMENT' });
  t.throws(() => fromEnv({ RANK: '0' }), { code: 'ERR_INVALID_ARGUMENT', message: /WORLD_SIZE/ });
  t.throws(() => fromEnv({ RANK: 'one', WORLD_SIZE: '2' }), { code: 'ERR_INVALID_ARGUMENT', message: /RANK/ });
  t.throws(() => fromEnv({ RANK: '2', WORLD_SIZE: '2' }), { code: 'ERR_INVALID_ARGUMENT' });
  t.throws(() => fromEnv({ RANK: '0', WORLD_SIZE: '2', MASTER_PORT: '99999' }), { code: 'ERR_INVALID_ARGUMENT' });
});
