/**
 * The rendezvous key-value store, served over TCP by rank 0. One process holds the only copy of
 * the data; clients set keys, read them, block until keys exist and bump counters. A connection
 * that sends anything unexpected (no HELLO first, a wrong token, a malformed or oversized frame)
 * is closed; the store keeps serving everyone else.
 *
 * Until a connection's HELLO is accepted it is a stranger: it may send one frame of at most
 * HANDSHAKE_MAX_MESSAGE_BYTES, only so many strangers are served at once (maxPendingConnections),
 * and each gets handshakeTimeoutMs to finish. So what a client that knows no token can make the
 * store hold is bounded by those three numbers, whatever it sends.
 */
import { createHash, timingSafeEqual } from 'node:crypto';
import { createServer, type AddressInfo, type Server, type Socket } from 'node:net';

import { InvalidArgumentError, RendezvousError } from '../../errors.js';
import {
  BodyReader,
  DEFAULT_MAX_MESSAGE_BYTES,
  FrameDecoder,
  HANDSHAKE_MAX_MESSAGE_BYTES,
  MIN_PROTOCOL_VERSION,
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
import { checkObject, describeValue } from '../../validate.js';

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
  /**
   * Most connections served at once that have not completed their HELLO; one more is closed as
   * soon as it is accepted (a rank's client then retries until its timeout). Default 64.
   */
  maxPendingConnections?: number;
  /**
   * Serve on an address other machines can reach although no token is set. Without it, listen()
   * refuses: every machine that reaches the port could then write any key (`SAPIPE_ALLOW_NO_TOKEN=1`
   * through fromEnv).
   */
  allowNoToken?: boolean;
  /**
   * While the port is in use (a store still closing on it, from a previous job or a communicator
   * just destroyed), keep retrying for up to this long before giving up with RendezvousError
   * (`port-in-use`). Default 0: give up at once. createRendezvous passes its timeoutMs.
   */
  busyPortTimeoutMs?: number;
}

/** Default of {@link RendezvousServerOptions.maxPendingConnections}. @category Communication */
export const DEFAULT_MAX_PENDING_CONNECTIONS = 64;

interface Connection {
  socket: Socket;
  authenticated: boolean;
  /** Its HELLO was refused: whatever else it sends is not read. */
  refused: boolean;
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

/** Whether a bound address can only be reached from this machine. */
function isLoopback(address: string): boolean {
  const v4 = address.startsWith('::ffff:') ? address.slice(7) : address;
  return /^127\./.test(v4) || address === '::1';
}

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

function bind(server: Server, host: string, port: number): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    const onError = (error: Error): void => reject(error);
    server.once('error', onError);
    // exclusive: a cluster worker binds the port itself rather than sharing the primary's handle.
    // It does not touch SO_REUSEADDR, which Node sets on every listening socket on Unix, so a
    // closed store's connections in TIME_WAIT never keep the port busy: a busy port is one that a
    // listening socket still holds.
    server.listen({ host, port, exclusive: true }, () => {
      server.off('error', onError);
      resolve();
    });
  });
}

/** A running rendezvous store. Create it with {@link RendezvousServer.listen}. @category Communication */
export class RendezvousServer {
  private readonly values = new Map<string, Buffer>();
  /** Keys set by SET_ONCE: they never change. */
  private readonly sealed = new Set<string>();
  private readonly waitersByKey = new Map<string, Set<Waiter>>();
  private readonly connections = new Set<Connection>();
  /** Connections whose HELLO has not been accepted yet. */
  private pending = 0;
  private closed = false;
  private listening = true;
  /** Settles once the listening socket is closed and every connection has ended. */
  private stopped: Promise<void> | undefined;

  private constructor(
    private readonly server: Server,
    /** The bound address and port. */
    readonly host: string,
    readonly port: number,
    private readonly tokenDigest: Buffer | undefined,
    private readonly maxMessageBytes: number,
    private readonly handshakeTimeoutMs: number,
    private readonly maxPendingConnections: number,
  ) {
    server.on('connection', (socket) => this.accept(socket));
    // A listening socket error after bind (rare: EMFILE on accept) must not crash the process.
    server.on('error', () => {});
  }

  /**
   * Binds and starts serving. Rejects with RendezvousError (`port-in-use`) if the port stays in use
   * past busyPortTimeoutMs, InvalidArgumentError for bad options, an address that cannot be bound,
   * or an address other machines reach without a token (unless allowNoToken).
   */
  static async listen(options: RendezvousServerOptions): Promise<RendezvousServer> {
    checkObject(options, 'RendezvousServer.listen(options)');
    const host = options.host ?? '127.0.0.1';
    if (typeof host !== 'string' || host === '') throw new InvalidArgumentError(`host must be a non-empty string, got ${describeValue(host)}`);
    checkPort(options.port, 'port', true);
    const maxMessageBytes = checkMaxMessageBytes(options.maxMessageBytes ?? DEFAULT_MAX_MESSAGE_BYTES);
    const handshakeTimeoutMs = checkTimeoutMs(options.handshakeTimeoutMs ?? 10_000, 'handshakeTimeoutMs');
    const maxPending = options.maxPendingConnections ?? DEFAULT_MAX_PENDING_CONNECTIONS;
    if (typeof maxPending !== 'number' || !Number.isInteger(maxPending) || maxPending < 1 || maxPending > 65536)
      throw new InvalidArgumentError(`maxPendingConnections must be an integer in [1, 65536], got ${describeValue(maxPending)}`);
    const busyPortTimeoutMs = options.busyPortTimeoutMs ?? 0;
    if (typeof busyPortTimeoutMs !== 'number' || !Number.isInteger(busyPortTimeoutMs) || busyPortTimeoutMs < 0 || busyPortTimeoutMs > 2 ** 31 - 1)
      throw new InvalidArgumentError(`busyPortTimeoutMs must be an integer number of milliseconds in [0, 2^31 - 1], got ${describeValue(busyPortTimeoutMs)}`);
    if (options.allowNoToken !== undefined && typeof options.allowNoToken !== 'boolean')
      throw new InvalidArgumentError(`allowNoToken must be a boolean, got ${describeValue(options.allowNoToken)}`);
    if (options.token !== undefined && typeof options.token !== 'string')
      throw new InvalidArgumentError('token must be a string');
    const hasToken = options.token !== undefined && options.token !== '';
    const deadline = Date.now() + busyPortTimeoutMs;
    let server: Server;
    for (let attempt = 0; ; attempt++) {
      server = createServer({ noDelay: true });
      try {
        await bind(server, host, options.port);
        break;
      } catch (error) {
        const code = (error as NodeJS.ErrnoException).code;
        if (code !== 'EADDRINUSE')
          throw new InvalidArgumentError(`cannot listen on ${host}:${options.port}: ${(error as Error).message}`, { cause: error });
        const left = deadline - Date.now();
        if (left <= 0) throw portInUse(host, options.port, busyPortTimeoutMs, error);
        // A store that is closing lets go of the port within its close grace (CLOSE_GRACE_MS)
        // or its owner's drain: poll often at first, then every quarter second.
        await sleep(Math.min(20 * 2 ** Math.min(attempt, 4), 250, left));
      }
    }
    const address = server.address() as AddressInfo;
    if (!hasToken && options.allowNoToken !== true && !isLoopback(address.address)) {
      await new Promise<void>((resolve) => server.close(() => resolve()));
      throw new InvalidArgumentError(
        `refusing to serve the rendezvous store on ${address.address}:${address.port} without a token: every machine that ` +
          'reaches this address could set any key, and the ranks would use what it set. Set SAPIPE_TOKEN (the same secret for ' +
          'every rank, on every node), or bind a loopback address (unset SAPIPE_BIND_ADDR), or, on a network where every ' +
          'machine is trusted, set SAPIPE_ALLOW_NO_TOKEN=1 (the allowNoToken option)',
      );
    }
    return new RendezvousServer(
      server,
      address.address,
      address.port,
      hasToken ? digest(options.token!) : undefined,
      maxMessageBytes,
      handshakeTimeoutMs,
      maxPending,
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

  /**
   * Accepts no more connections and lets go of the port at once, so that a new store can bind it;
   * connected clients are served on until close(). Rank 0 calls it once every rank is known to be
   * connected.
   */
  stopListening(): void {
    if (!this.listening) return;
    this.listening = false;
    // net.Server.close() closes the listening socket now and calls back only once every
    // connection has ended; close() waits for that.
    this.stopped = new Promise<void>((resolve) => this.server.close(() => resolve()));
  }

  /** Stops listening and drops every connection; their pending waits end with the connection. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.stopListening();
    const stopped = this.stopped!;
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
    // Resets and the like end this connection only.
    socket.on('error', () => {});
    if (this.pending >= this.maxPendingConnections) {
      // Strangers beyond the cap cost nothing but this: the oldest keep their handshake time.
      socket.destroy();
      return;
    }
    const connection: Connection = { socket, authenticated: false, refused: false, waiters: new Set(), handshakeTimer: undefined };
    this.connections.add(connection);
    this.pending++;
    connection.handshakeTimer = setTimeout(() => this.drop(connection), this.handshakeTimeoutMs);
    // Until the HELLO is accepted a frame holds a HELLO and nothing bigger; the limit rises to
    // maxMessageBytes in handle(), before the next frame's header is read.
    const decoder = new FrameDecoder(Math.min(HANDSHAKE_MAX_MESSAGE_BYTES, this.maxMessageBytes));
    socket.on('data', (chunk: Buffer) => {
      // A refused connection is ended: nothing more it sends is read, or kept.
      if (connection.refused || socket.destroyed) return;
      try {
        decoder.append(chunk);
        for (let b = decoder.next(); b !== undefined; b = decoder.next()) {
          this.handle(connection, b);
          if (connection.refused || socket.destroyed) return;
          if (connection.authenticated) decoder.maxBodyBytes = this.maxMessageBytes;
        }
      } catch {
        // Malformed input (ProtocolViolation) or anything else that went wrong with this
        // message: whatever a peer sends may cost it its connection, never the store.
        this.drop(connection);
      }
    });
    socket.on('close', () => this.forget(connection));
  }

  private drop(connection: Connection): void {
    connection.socket.destroy();
    this.forget(connection);
  }

  private forget(connection: Connection): void {
    if (!this.connections.delete(connection)) return;
    if (!connection.authenticated) this.pending--;
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
      if (version < MIN_PROTOCOL_VERSION || version > PROTOCOL_VERSION) {
        this.reply(connection, id, Status.BadRequest, Buffer.from(`unsupported protocol version ${version} (this store serves ${MIN_PROTOCOL_VERSION} to ${PROTOCOL_VERSION}): do all ranks run the same sapipe?`));
        this.refuse(connection);
        return;
      }
      if (!this.tokenMatches(token)) {
        this.reply(connection, id, Status.AuthFailed);
        this.refuse(connection);
        return;
      }
      connection.authenticated = true;
      this.pending--;
      clearTimeout(connection.handshakeTimer);
      connection.handshakeTimer = undefined;
      this.reply(connection, id, Status.Ok);
      return;
    }
    switch (op) {
      case Op.Set:
      case Op.SetOnce: {
        const key = reader.key();
        const value = reader.rest();
        if (this.sealed.has(key) || (op === Op.SetOnce && this.values.has(key))) {
          this.reply(connection, id, Status.Exists);
          return;
        }
        if (op === Op.SetOnce) this.sealed.add(key);
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
        if (this.sealed.has(key)) {
          this.reply(connection, id, Status.Exists);
          return;
        }
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

  /** Answers nothing more: the reply already written is flushed by end(), so the client can say why; the socket goes after a second. */
  private refuse(connection: Connection): void {
    connection.refused = true;
    connection.socket.end();
    setTimeout(() => this.drop(connection), 1000).unref();
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

function portInUse(host: string, port: number, retriedMs: number, cause: unknown): RendezvousError {
  return new RendezvousError(
    `cannot serve the rendezvous store on ${host}:${port}: the port is in use` +
      (retriedMs > 0 ? `, and still was after ${retriedMs} ms of retrying` : '') +
      '. Most likely another rendezvous store holds it: a job still running or closing on the same MASTER_PORT, or a ' +
      `store whose owner has not finished closing it; or another program (\`ss -ltnp 'sport = :${port}'\` shows which). ` +
      'Pick another MASTER_PORT, or wait until that one is released.',
    { reason: 'port-in-use', cause },
  );
}
