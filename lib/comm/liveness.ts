/**
 * A liveness mesh: one TCP connection between every pair of ranks, carrying nothing. When a rank's
 * process ends, however it ends (SIGKILL included), its kernel closes its sockets and every peer
 * sees the close at once. UCX's shared-memory transports do not notice a dead peer, so the ucx
 * backend reports lost peers from here. Each rank listens on a port it publishes through the
 * rendezvous store with a random secret; a rank connects to every lower rank and introduces itself
 * with that secret and its rank, so a stray connection is never taken for a peer. The record a rank
 * publishes is an envelope (rendezvous/validate.ts) checked before anything in it is used: a
 * malformed one is a RendezvousError naming its key.
 */
import { randomBytes } from 'node:crypto';
import { createServer, connect, type Server, type Socket } from 'node:net';
import { networkInterfaces } from 'node:os';

import { PeerLostError, RendezvousError, TimeoutError } from '../errors.js';
import type { Rendezvous } from './rendezvous/rendezvous.js';
import { EnvelopeKind, openEnvelope, sealEnvelope } from './rendezvous/validate.js';

const SECRET_BYTES = 16;
const HELLO_BYTES = SECRET_BYTES + 4;
/** Longest host in a record: a DNS name is at most 253 characters, an IPv6 address with a zone fewer. */
const MAX_HOST_BYTES = 255;

interface ListenerRecord {
  host: string;
  port: number;
  secret: Buffer;
}

/** A rank's listener as it publishes it: port (u16), secret, then the host as ASCII. */
function encodeRecord(record: ListenerRecord): Buffer {
  const head = Buffer.allocUnsafe(2);
  head.writeUInt16BE(record.port, 0);
  return Buffer.concat([head, record.secret, Buffer.from(record.host, 'latin1')]);
}

/** The record under `key`, published by `peer` of `size`; RendezvousError naming the key if anything in it does not hold. */
function decodeRecord(key: string, value: Buffer, peer: number, size: number): ListenerRecord {
  const payload = openEnvelope(key, value, {
    kind: EnvelopeKind.Liveness,
    rank: peer,
    worldSize: size,
    minPayloadBytes: 2 + SECRET_BYTES + 1,
    maxPayloadBytes: 2 + SECRET_BYTES + MAX_HOST_BYTES,
  });
  const port = payload.readUInt16BE(0);
  const host = payload.subarray(2 + SECRET_BYTES).toString('latin1');
  // An IP address or a host name, nothing else: this string goes to connect().
  if (port === 0 || !/^[A-Za-z0-9._:%-]+$/.test(host))
    throw new RendezvousError(`the value of '${key}' in the rendezvous store is not a liveness listener of rank ${peer}: ${port === 0 ? 'port 0' : 'its host is not an address or a host name'}`, { reason: 'malformed' });
  return { host, port, secret: Buffer.from(payload.subarray(2, 2 + SECRET_BYTES)) };
}

/** The address peers reach this rank's listener on: loopback for one machine, else SAPIPE_LIVENESS_ADDR or the first external IPv4. */
function advertisedHost(masterAddr: string | undefined): string {
  if (process.env.SAPIPE_LIVENESS_ADDR) return process.env.SAPIPE_LIVENESS_ADDR;
  if (masterAddr === undefined || masterAddr === 'localhost' || masterAddr.startsWith('127.') || masterAddr === '::1') return '127.0.0.1';
  for (const list of Object.values(networkInterfaces()))
    for (const a of list ?? []) if (a.family === 'IPv4' && !a.internal) return a.address;
  return '127.0.0.1';
}

/** @category Communication */
export class LivenessMesh {
  private readonly sockets = new Map<number, Socket>();
  private closed = false;

  private constructor(
    private readonly server: Server,
    private readonly onLost: (peer: number, reason: string) => void,
  ) {}

  /**
   * Joins the mesh under `prefix` in the store; resolves once this rank is connected to every
   * peer. `onLost` is called once per peer whose connection closes before {@link close}.
   */
  static async join(store: Rendezvous, prefix: string, rank: number, size: number, masterAddr: string | undefined, timeoutMs: number, onLost: (peer: number, reason: string) => void): Promise<LivenessMesh> {
    const secret = randomBytes(SECRET_BYTES);
    const host = advertisedHost(masterAddr);
    const server = createServer();
    const mesh = new LivenessMesh(server, onLost);
    let settleAccepted: (() => void) | undefined;
    const accepted = new Promise<void>((resolve) => (settleAccepted = resolve));
    const expectAccepted = size - 1 - rank;
    if (expectAccepted === 0) settleAccepted!();
    server.on('connection', (socket) => {
      let hello = Buffer.alloc(0);
      socket.on('error', () => {});
      // A connection that never introduces itself is not kept for the life of the mesh.
      const unintroduced = setTimeout(() => socket.destroy(), timeoutMs);
      unintroduced.unref();
      socket.once('close', () => clearTimeout(unintroduced));
      const onData = (chunk: Buffer): void => {
        hello = Buffer.concat([hello, chunk]);
        if (hello.length < HELLO_BYTES) return;
        socket.off('data', onData);
        clearTimeout(unintroduced);
        const peer = hello.readUInt32LE(16);
        if (!hello.subarray(0, 16).equals(secret) || peer <= rank || peer >= size || mesh.sockets.has(peer)) {
          socket.destroy();
          return;
        }
        mesh.adopt(peer, socket);
        if (mesh.acceptedCount(rank) === expectAccepted) settleAccepted!();
      };
      socket.on('data', onData);
    });
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(0, host === '127.0.0.1' ? '127.0.0.1' : '0.0.0.0', () => resolve());
    });
    server.unref();
    const port = (server.address() as { port: number }).port;
    try {
      await store.setOnce(`${prefix}/live/${rank}`, sealEnvelope(EnvelopeKind.Liveness, rank, size, encodeRecord({ host, port, secret })), { timeoutMs });
      for (let peer = 0; peer < rank; peer++) {
        const key = `${prefix}/live/${peer}`;
        const info = decodeRecord(key, await store.get(key, { timeoutMs }), peer, size);
        const socket = await openSocket(info.host, info.port, timeoutMs);
        const hello = Buffer.alloc(HELLO_BYTES);
        info.secret.copy(hello, 0);
        hello.writeUInt32LE(rank, 16);
        socket.write(hello);
        mesh.adopt(peer, socket);
      }
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([
        accepted,
        new Promise<never>((_, reject) => {
          timer = setTimeout(() => reject(new TimeoutError(missingRanksMessage(rank, size, mesh.sockets, timeoutMs))), timeoutMs);
        }),
      ]).finally(() => clearTimeout(timer));
    } catch (error) {
      mesh.close();
      throw error;
    }
    return mesh;
  }

  private acceptedCount(rank: number): number {
    let n = 0;
    for (const peer of this.sockets.keys()) if (peer > rank) n++;
    return n;
  }

  private adopt(peer: number, socket: Socket): void {
    this.sockets.set(peer, socket);
    socket.setNoDelay(true);
    socket.setKeepAlive(true, 1000);
    socket.on('error', () => {});
    // Anything a peer sends after the hello is ignored; only the close matters.
    socket.on('data', () => {});
    socket.once('close', () => {
      if (!this.closed) this.onLost(peer, `rank ${peer}'s liveness connection closed: its process exited, was killed, or destroyed its communicator`);
    });
    // An idle mesh must not keep the process alive.
    socket.unref();
  }

  /** Leaves the mesh: peers see this rank's connections close. */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    for (const socket of this.sockets.values()) socket.destroy();
    this.server.close();
  }
}

/** What a rank waiting for its peers says when they do not all come: who is missing, how to start them, what sets the wait. */
function missingRanksMessage(rank: number, size: number, connected: ReadonlyMap<number, unknown>, timeoutMs: number): string {
  const missing: number[] = [];
  for (let peer = rank + 1; peer < size; peer++) if (!connected.has(peer)) missing.push(peer);
  const list = missing.length <= 8 ? missing.join(', ') : `${missing.slice(0, 8).join(', ')} and ${missing.length - 8} more`;
  return (
    `rank ${rank} of ${size}: rank${missing.length === 1 ? '' : 's'} ${list} never joined within ${timeoutMs} ms. ` +
    `Start every rank: each process with the same MASTER_ADDR and MASTER_PORT, WORLD_SIZE=${size} and its own RANK, or all of them at once with ` +
    `\`sapipe launch --nproc ${size} <script>\`. The wait is the communicator's timeoutMs option (default 30000 ms).`
  );
}

function openSocket(host: string, port: number, timeoutMs: number): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const socket = connect({ host, port });
    const timer = setTimeout(() => {
      socket.destroy();
      reject(new TimeoutError(`liveness mesh: could not connect to ${host}:${port} within ${timeoutMs} ms`));
    }, timeoutMs);
    socket.once('connect', () => {
      clearTimeout(timer);
      resolve(socket);
    });
    socket.once('error', (error) => {
      clearTimeout(timer);
      reject(new PeerLostError(`liveness mesh: connecting to ${host}:${port} failed: ${error.message}`));
    });
  });
}
