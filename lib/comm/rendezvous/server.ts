/**
 * The rendezvous key-value store, served over TCP by rank 0. One process holds the only copy of
 * the data; clients set keys, read them, block until keys exist and bump counters. A connection
 * that sends anything unexpected (no HELLO first, a wrong token, a malformed or oversized frame)
 * is closed; the store keeps serving everyone else.
 */
import { createHash, timingSafeEqual } from 'node:crypto';
import { createServer, type AddressInfo, type Server, type Socket } from 'node:net';

import { InvalidArgumentError } from '../../errors.js';
import {
  BodyReader,
  DEFAULT_MAX_MESSAGE_BYTES,
  FrameDecoder,
  Op,
  PROTOCOL_MAGIC,
  PROTOCOL_VERSION,
  ProtocolViolation,
  Status,
  body,
  frame,
  u8,
} from './frame.js';
import { checkMaxMessageBytes, checkPort, checkTimeoutMs } from './validate.js';
import { checkObject } from '../../validate.js';

/** Options of {@link RendezvousServer.listen}. @category Communication */
export interface RendezvousServerOptions {
  /** Address to bind. Default `127.0.0.1`: other machines cannot connect unless this is widened. */
  host?: string;
  /** Port to bind; 0 picks a free one (read it back from `port`). */
  port: number;
  /** Shared secret every client must present; unset accepts any client. */
  token?: string;
  /** Largest frame body accepted; a bigger length prefix closes the connection. Default 16 MiB. */
  maxMessageBytes?: number;
  /** A connection that has not completed its HELLO within this time is closed. Default 10 s. */
  handshakeTimeoutMs?: number;
}

interface Connection {
  socket: Socket;
  authenticated: boolean;
  waiters: Set<Waiter>;
  handshakeTimer: NodeJS.Timeout | undefined;
}

interface Waiter {
  connection: Connection;
  id: number;
  /** Keys still missing. */
  missing: Set<string>;
  /** For a blocking GET, the key whose value to send back. */
  valueOf: string | undefined;
  timer: NodeJS.Timeout | undefined;
}

/** How long close() lets a client take to close its side of the connection. */
const CLOSE_GRACE_MS = 500;

/** Longest delay setTimeout honours. */
const MAX_TIMER_MS = 2 ** 31 - 1;

function digest(token: string): Buffer {
  return createHash('sha256').update(token, 'utf8').digest();
}

/** A running rendezvous store. Create it with {@link RendezvousServer.listen}. @category Communication */
export class RendezvousServer {
  private readonly values = new Map<string, Buffer>();
  private readonly waitersByKey = new Map<string, Set<Waiter>>();
  private readonly connections = new Set<Connection>();
  private closed = false;

  private constructor(
    private readonly server: Server,
    /** The bound address and port. */
    readonly host: string,
    readonly port: number,
    private readonly tokenDigest: Buffer | undefined,
    private readonly maxMessageBytes: number,
    private readonly handshakeTimeoutMs: number,
  ) {
    server.on('connection', (socket) => this.accept(socket));
    // A listening socket error after bind (rare: EMFILE on accept) must not crash the process.
    server.on('error', () => {});
  }

  /** Binds and starts serving. Rejects with InvalidArgumentError if the address cannot be bound. */
  static async listen(options: RendezvousServerOptions): Promise<RendezvousServer> {
    checkObject(options, 'RendezvousServer.listen(options)');
    const host = options.host ?? '127.0.0.1';
    checkPort(options.port, 'port', true);
    const maxMessageBytes = checkMaxMessageBytes(options.maxMessageBytes ?? DEFAULT_MAX_MESSAGE_BYTES);
    const handshakeTimeoutMs = checkTimeoutMs(options.handshakeTimeoutMs ?? 10_000, 'handshakeTimeoutMs');
    if (options.token !== undefined && typeof options.token !== 'string')
      throw new InvalidArgumentError('token must be a string');
    const server = createServer({ noDelay: true });
    await new Promise<void>((resolve, reject) => {
      const onError = (error: Error): void => {
        reject(new InvalidArgumentError(`cannot listen on ${host}:${options.port}: ${error.message}`, { cause: error }));
      };
      server.once('error', onError);
      server.listen({ host, port: options.port, exclusive: true }, () => {
        server.off('error', onError);
        resolve();
      });
    });
    const address = server.address() as AddressInfo;
    return new RendezvousServer(
      server,
      address.address,
      address.port,
      options.token === undefined || options.token === '' ? undefined : digest(options.token),
      maxMessageBytes,
      handshakeTimeoutMs,
    );
  }

  /** Number of keys stored. */
  get size(): number {
    return this.values.size;
  }

  /** Open client connections. */
  get connectionCount(): number {
    return this.connections.size;
  }

  /**
   * Resolves once at most `count` clients are connected, or after `timeoutMs`: rank 0 lets the
   * other ranks leave first, so that the replies they are still reading are not cut off.
   */
  async drained(count: number, timeoutMs: number): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (this.connections.size > count && Date.now() < deadline) await new Promise((r) => setTimeout(r, 10));
  }

  /** Stops listening and drops every connection; their pending waits end with the connection. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    const stopped = new Promise<void>((resolve) => this.server.close(() => resolve()));
    for (const connection of this.connections) {
      // end() rather than destroy(): replies already written (the last barrier's release) still
      // reach their clients. A client that does not close its side in time is cut off.
      connection.socket.end();
      const timer = setTimeout(() => this.drop(connection), CLOSE_GRACE_MS);
      connection.socket.once('close', () => clearTimeout(timer));
    }
    await stopped;
  }

  private accept(socket: Socket): void {
    if (this.closed) {
      socket.destroy();
      return;
    }
    const connection: Connection = { socket, authenticated: false, waiters: new Set(), handshakeTimer: undefined };
    this.connections.add(connection);
    connection.handshakeTimer = setTimeout(() => this.drop(connection), this.handshakeTimeoutMs);
    const decoder = new FrameDecoder(this.maxMessageBytes);
    socket.on('data', (chunk: Buffer) => {
      try {
        for (const b of decoder.push(chunk)) {
          // A refused connection is ended: nothing more it sends is read.
          if (socket.destroyed || socket.writableEnded) return;
          this.handle(connection, b);
        }
      } catch {
        // Malformed input (ProtocolViolation) or anything else that went wrong with this
        // message: whatever a peer sends may cost it its connection, never the store.
        this.drop(connection);
      }
    });
    // Resets and the like end this connection only.
    socket.on('error', () => {});
    socket.on('close', () => this.forget(connection));
  }

  private drop(connection: Connection): void {
    connection.socket.destroy();
    this.forget(connection);
  }

  private forget(connection: Connection): void {
    if (!this.connections.delete(connection)) return;
    clearTimeout(connection.handshakeTimer);
    for (const waiter of connection.waiters) this.removeWaiter(waiter);
  }

  private reply(connection: Connection, id: number, status: Status, payload?: Buffer): void {
    if (connection.socket.destroyed) return;
    const fields = payload === undefined ? [u8(status)] : [u8(status), payload];
    connection.socket.write(frame(body(Op.Response, id, ...fields)));
  }

  private handle(connection: Connection, b: Buffer): void {
    const reader = new BodyReader(b);
    const op = reader.u8();
    const id = reader.u32();
    if (!connection.authenticated) {
      if (op !== Op.Hello) throw new ProtocolViolation('first message is not HELLO');
      if (reader.u32() !== PROTOCOL_MAGIC) throw new ProtocolViolation('bad magic');
      const version = reader.u8();
      const token = reader.short();
      reader.end();
      if (version !== PROTOCOL_VERSION) {
        this.reply(connection, id, Status.BadRequest, Buffer.from(`unsupported protocol version ${version}`));
        connection.socket.end();
        return;
      }
      if (!this.tokenMatches(token)) {
        this.reply(connection, id, Status.AuthFailed);
        // end() flushes the refusal before closing, so the client can say why.
        connection.socket.end();
        setTimeout(() => this.drop(connection), 1000).unref();
        return;
      }
      connection.authenticated = true;
      clearTimeout(connection.handshakeTimer);
      connection.handshakeTimer = undefined;
      this.reply(connection, id, Status.Ok);
      return;
    }
    switch (op) {
      case Op.Set: {
        const key = reader.key();
        const value = reader.rest();
        this.values.set(key, value);
        this.reply(connection, id, Status.Ok);
        this.notify(key);
        return;
      }
      case Op.Get: {
        const block = reader.u8() !== 0;
        const timeoutMs = reader.u32();
        const key = reader.key();
        reader.end();
        const value = this.values.get(key);
        if (value !== undefined) this.reply(connection, id, Status.Ok, value);
        else if (!block) this.reply(connection, id, Status.NotFound);
        else this.addWaiter(connection, id, [key], key, timeoutMs);
        return;
      }
      case Op.Wait: {
        const timeoutMs = reader.u32();
        const keys = reader.keys();
        reader.end();
        const missing = keys.filter((k) => !this.values.has(k));
        if (missing.length === 0) this.reply(connection, id, Status.Ok);
        else this.addWaiter(connection, id, missing, undefined, timeoutMs);
        return;
      }
      case Op.Add: {
        const delta = reader.i64();
        const key = reader.key();
        reader.end();
        const current = this.values.get(key);
        let base = 0n;
        if (current !== undefined) {
          const text = current.toString('latin1');
          if (!/^-?\d{1,19}$/.test(text)) {
            this.reply(connection, id, Status.BadRequest, Buffer.from(`value of '${key}' is not an integer`));
            return;
          }
          base = BigInt(text);
        }
        const next = base + delta;
        if (next > BigInt(Number.MAX_SAFE_INTEGER) || next < BigInt(Number.MIN_SAFE_INTEGER)) {
          this.reply(connection, id, Status.BadRequest, Buffer.from(`counter '${key}' would leave the safe integer range`));
          return;
        }
        const encoded = Buffer.from(next.toString(), 'latin1');
        this.values.set(key, encoded);
        this.reply(connection, id, Status.Ok, encoded);
        this.notify(key);
        return;
      }
      default:
        throw new ProtocolViolation(`unknown opcode ${op}`);
    }
  }

  private tokenMatches(presented: Buffer): boolean {
    if (this.tokenDigest === undefined) return true;
    // Comparing digests keeps the comparison constant-time whatever the presented length.
    return timingSafeEqual(createHash('sha256').update(presented).digest(), this.tokenDigest);
  }

  private addWaiter(connection: Connection, id: number, keys: string[], valueOf: string | undefined, timeoutMs: number): void {
    const waiter: Waiter = { connection, id, missing: new Set(keys), valueOf, timer: undefined };
    // The client keeps its own timer; this one frees the waiter if the client never comes back for it.
    waiter.timer = setTimeout(() => {
      this.removeWaiter(waiter);
      this.reply(connection, id, Status.Timeout);
    }, Math.min(Math.max(timeoutMs, 1), MAX_TIMER_MS));
    connection.waiters.add(waiter);
    for (const key of waiter.missing) {
      let set = this.waitersByKey.get(key);
      if (set === undefined) this.waitersByKey.set(key, (set = new Set()));
      set.add(waiter);
    }
  }

  private removeWaiter(waiter: Waiter): void {
    clearTimeout(waiter.timer);
    waiter.connection.waiters.delete(waiter);
    for (const key of waiter.missing) {
      const set = this.waitersByKey.get(key);
      if (set === undefined) continue;
      set.delete(waiter);
      if (set.size === 0) this.waitersByKey.delete(key);
    }
  }

  private notify(key: string): void {
    const set = this.waitersByKey.get(key);
    if (set === undefined) return;
    this.waitersByKey.delete(key);
    for (const waiter of set) {
      waiter.missing.delete(key);
      if (waiter.missing.size > 0) continue;
      this.removeWaiter(waiter);
      const value = waiter.valueOf === undefined ? undefined : this.values.get(waiter.valueOf);
      this.reply(waiter.connection, waiter.id, Status.Ok, value);
    }
  }
}
