/**
 * A connection to the rendezvous store. Every call has a deadline (TimeoutError past it); if the
 * server goes away every pending and later call fails with PeerLostError; after close() with
 * DisposedError. Calls may be issued concurrently: replies are matched to requests by id.
 */
import { connect as netConnect, type Socket } from 'node:net';

import { DisposedError, InvalidArgumentError, PeerLostError, RendezvousError, SapipeError, TimeoutError } from '../../errors.js';
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
  i64,
  keyList,
  short,
  u32,
  u8,
} from './frame.js';
import { checkMaxMessageBytes, checkPort, checkTimeoutMs, encodeKey, encodeValue } from './validate.js';
import { describeValue, checkObject } from '../../validate.js';

/** Default deadline of every rendezvous call, connecting included: 30 s. @category Communication */
export const DEFAULT_RENDEZVOUS_TIMEOUT_MS = 30_000;

/** Options of {@link RendezvousClient.connect}. @category Communication */
export interface RendezvousClientOptions {
  /** Host name or address of the store. Default `127.0.0.1`. */
  host?: string;
  port: number;
  /** Shared secret the store expects (`SAPIPE_TOKEN`). */
  token?: string;
  /**
   * Default deadline of each call, and of connecting: the store may not be up yet, so refused
   * connections are retried until then. Default 30 s.
   */
  timeoutMs?: number;
  /** Largest message sent or accepted; must not exceed the server's. Default 16 MiB. */
  maxMessageBytes?: number;
}

/** Per-call options. @category Communication */
export interface CallOptions {
  /** Deadline of this call in milliseconds, instead of the client's default. */
  timeoutMs?: number;
}

interface Pending {
  resolve(reply: { status: Status; payload: Buffer }): void;
  reject(error: Error): void;
  timer: NodeJS.Timeout;
}

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

/** A client of the rendezvous store. Create it with {@link RendezvousClient.connect}. @category Communication */
export class RendezvousClient {
  private readonly pending = new Map<number, Pending>();
  private nextId = 1;
  /** Why calls now fail, once the connection is gone. */
  private failure: SapipeError | undefined;
  private readonly closedPromise: Promise<void>;
  private readonly barrierGenerations = new Map<string, number>();

  private constructor(
    private readonly socket: Socket,
    /** `host:port` of the store, for messages. */
    readonly endpoint: string,
    /** Default deadline of each call. */
    readonly timeoutMs: number,
    private readonly maxMessageBytes: number,
  ) {
    const decoder = new FrameDecoder(maxMessageBytes);
    socket.on('data', (chunk: Buffer) => {
      try {
        for (const b of decoder.push(chunk)) this.receive(b);
      } catch (error) {
        if (!(error instanceof ProtocolViolation)) throw error;
        this.fail(new PeerLostError(`rendezvous server ${endpoint} sent a malformed message: ${error.message}`));
        socket.destroy();
      }
    });
    socket.on('error', () => {});
    this.closedPromise = new Promise((resolve) => {
      socket.on('close', () => {
        this.fail(new PeerLostError(`lost the connection to the rendezvous server ${endpoint}`));
        resolve();
      });
    });
    // Idle, the connection does not keep the process alive; a pending call does.
    socket.unref();
  }

  /**
   * Connects and authenticates. Refused connections are retried until the deadline, since ranks
   * start in any order, and so are connections the store closes before answering the HELLO (it
   * serves only so many handshakes at once). Rejects with TimeoutError if the store cannot be
   * reached in time, InvalidArgumentError if it refuses the token or for bad options.
   */
  static async connect(options: RendezvousClientOptions): Promise<RendezvousClient> {
    checkObject(options, 'RendezvousClient.connect(options)');
    const host = options.host ?? '127.0.0.1';
    if (typeof host !== 'string' || host === '') throw new InvalidArgumentError('host must be a non-empty string');
    const port = checkPort(options.port, 'port', false);
    const timeoutMs = checkTimeoutMs(options.timeoutMs ?? DEFAULT_RENDEZVOUS_TIMEOUT_MS);
    const maxMessageBytes = checkMaxMessageBytes(options.maxMessageBytes ?? DEFAULT_MAX_MESSAGE_BYTES);
    const token = Buffer.from(options.token ?? '', 'utf8');
    if (token.length > 1024) throw new InvalidArgumentError('token must be at most 1024 bytes');
    const endpoint = `${host}:${port}`;
    const deadline = Date.now() + timeoutMs;

    let lastError: Error | undefined;
    for (let attempt = 0; ; attempt++) {
      const remaining = deadline - Date.now();
      if (remaining <= 0)
        throw new TimeoutError(
          `could not reach the rendezvous server ${endpoint} within ${timeoutMs} ms${lastError ? `: ${lastError.message}` : ''}`,
        );
      let socket: Socket;
      try {
        socket = await openSocket(host, port, remaining);
      } catch (error) {
        lastError = error as Error;
        await sleep(Math.min(25 * 2 ** Math.min(attempt, 5), 500, Math.max(deadline - Date.now(), 0)));
        continue;
      }
      const client = new RendezvousClient(socket, endpoint, timeoutMs, maxMessageBytes);
      const hello = body(Op.Hello, 0, u32(PROTOCOL_MAGIC), u8(PROTOCOL_VERSION), short(token));
      let reply: { status: Status; payload: Buffer };
      try {
        reply = await client.request(hello, Math.max(deadline - Date.now(), 1));
      } catch (error) {
        await client.close();
        // Closed unanswered: a store at its cap of pending handshakes, or one closing while
        // its successor is about to bind the port. Either way, the next try may be served.
        if (!(error instanceof PeerLostError)) throw error;
        lastError = new Error('the server closed the connection before answering the HELLO');
        await sleep(Math.min(25 * 2 ** Math.min(attempt, 5), 500, Math.max(deadline - Date.now(), 0)));
        continue;
      }
      if (reply.status === Status.Ok) return client;
      await client.close();
      if (reply.status === Status.AuthFailed)
        throw new InvalidArgumentError(`the rendezvous server ${endpoint} refused the token (check SAPIPE_TOKEN)`);
      throw new InvalidArgumentError(`the rendezvous server ${endpoint} refused the connection: ${reply.payload.toString()}`);
    }
  }

  /** True once the connection is closed or lost. */
  get closed(): boolean {
    return this.failure !== undefined;
  }

  /**
   * Stores `value` (bytes, or a string as UTF-8) under `key`, replacing any previous value.
   * RendezvousError (`taken`) if the key was set with setOnce().
   */
  async set(key: string, value: Uint8Array | string, options?: CallOptions): Promise<void> {
    const k = encodeKey(key);
    const v = encodeValue(value);
    await this.call(body(Op.Set, 0, short(k), v), options, key);
  }

  /**
   * Stores `value` under `key` if no client has set it yet; the key then never changes (set(),
   * add() and setOnce() of it fail). For what a rank publishes about itself: a value set before
   * it (a stray or planted one) makes this fail with RendezvousError (`taken`) naming the key,
   * instead of being silently replaced, and nothing can replace it afterwards.
   */
  async setOnce(key: string, value: Uint8Array | string, options?: CallOptions): Promise<void> {
    const k = encodeKey(key);
    const v = encodeValue(value);
    await this.call(body(Op.SetOnce, 0, short(k), v), options, key);
  }

  /** The value of `key`, waiting until some client sets it. */
  async get(key: string, options?: CallOptions): Promise<Buffer> {
    const timeoutMs = this.deadline(options);
    const reply = await this.call(body(Op.Get, 0, u8(1), u32(timeoutMs), short(encodeKey(key))), { timeoutMs });
    return reply.payload;
  }

  /** The value of `key` decoded as UTF-8, waiting until some client sets it. */
  async getString(key: string, options?: CallOptions): Promise<string> {
    return (await this.get(key, options)).toString('utf8');
  }

  /** The value of `key`, or undefined if it is not set now. Does not wait. */
  async tryGet(key: string, options?: CallOptions): Promise<Buffer | undefined> {
    const reply = await this.call(body(Op.Get, 0, u8(0), u32(1), short(encodeKey(key))), options);
    return reply.status === Status.NotFound ? undefined : reply.payload;
  }

  /** Resolves once every key in `keys` is set; TimeoutError if that does not happen in time. */
  async wait(keys: string | readonly string[], options?: CallOptions): Promise<void> {
    const list = typeof keys === 'string' ? [keys] : keys;
    if (!Array.isArray(list) || list.length === 0 || list.length > 0xffff)
      throw new InvalidArgumentError('keys must be a key or a non-empty array of at most 65535 keys');
    const timeoutMs = this.deadline(options);
    await this.call(body(Op.Wait, 0, u32(timeoutMs), keyList(list.map(encodeKey))), { timeoutMs });
  }

  /**
   * Atomically adds `delta` to the integer stored under `key` (0 if unset) and returns the new
   * value. The value is kept as decimal text, so get() reads it as a string.
   */
  async add(key: string, delta = 1, options?: CallOptions): Promise<number> {
    if (!Number.isSafeInteger(delta)) throw new InvalidArgumentError(`delta must be a safe integer, got ${describeValue(delta)}`);
    const reply = await this.call(body(Op.Add, 0, i64(delta), short(encodeKey(key))), options, key);
    return Number(reply.payload.toString('latin1'));
  }

  /**
   * Returns once `worldSize` clients have called barrier with the same `name`. Calling it again
   * with the same name starts a new barrier (each client counts its own calls, so all clients
   * must pass the same barriers in the same order). Keys under `__barrier/` are used for this.
   */
  async barrier(name: string, worldSize: number, options?: CallOptions): Promise<void> {
    if (typeof name !== 'string' || name === '') throw new InvalidArgumentError('barrier name must be a non-empty string');
    if (!Number.isInteger(worldSize) || worldSize < 1)
      throw new InvalidArgumentError(`worldSize must be a positive integer, got ${describeValue(worldSize)}`);
    const timeoutMs = this.deadline(options);
    const deadline = Date.now() + timeoutMs;
    const remaining = (): CallOptions => ({ timeoutMs: Math.max(deadline - Date.now(), 1) });
    const generation = this.barrierGenerations.get(name) ?? 0;
    this.barrierGenerations.set(name, generation + 1);
    const prefix = `__barrier/${name}/${generation}`;
    try {
      const arrived = await this.add(`${prefix}/arrived`, 1, remaining());
      // The last to arrive releases the others and need not wait: one more round trip after the
      // release could find rank 0 already gone if this was the job's final barrier.
      if (arrived === worldSize) await this.set(`${prefix}/done`, '', remaining());
      else await this.wait(`${prefix}/done`, remaining());
    } catch (error) {
      if (error instanceof TimeoutError)
        throw new TimeoutError(`barrier '${name}' of ${worldSize} was not reached within ${timeoutMs} ms`, { cause: error });
      throw error;
    }
  }

  /** Closes the connection. Pending calls fail with DisposedError. Safe to call twice. */
  async close(): Promise<void> {
    this.fail(new DisposedError('the rendezvous client is closed'));
    this.socket.destroy();
    await this.closedPromise;
  }

  private deadline(options: CallOptions | undefined): number {
    return options?.timeoutMs === undefined ? this.timeoutMs : checkTimeoutMs(options.timeoutMs);
  }

  private async call(request: Buffer, options: CallOptions | undefined, key?: string): Promise<{ status: Status; payload: Buffer }> {
    const reply = await this.request(request, this.deadline(options));
    switch (reply.status) {
      case Status.Exists:
        throw new RendezvousError(
          `the key '${key ?? '?'}' in the rendezvous store ${this.endpoint} is already set and may not change: ` +
            'some other client published it first (a stray or duplicate rank, another job on the same MASTER_PORT, or a process planting values: set SAPIPE_TOKEN)',
          { reason: 'taken' },
        );
      case Status.Ok:
      case Status.NotFound:
        return reply;
      case Status.Timeout:
        throw new TimeoutError(`rendezvous call to ${this.endpoint} timed out on the server`);
      case Status.BadRequest:
        throw new InvalidArgumentError(`rendezvous server ${this.endpoint} rejected the request: ${reply.payload.toString()}`);
      default:
        throw new PeerLostError(`rendezvous server ${this.endpoint} sent unknown status ${reply.status as number}`);
    }
  }

  /** Sends a body (its id field is filled in here) and resolves with the matching reply. */
  private request(request: Buffer, timeoutMs: number): Promise<{ status: Status; payload: Buffer }> {
    if (this.failure !== undefined) return Promise.reject(this.failure);
    if (request.length > this.maxMessageBytes)
      return Promise.reject(
        new InvalidArgumentError(`message of ${request.length} bytes exceeds the limit of ${this.maxMessageBytes} (maxMessageBytes)`),
      );
    const id = this.nextId;
    this.nextId = this.nextId >= 0xffffffff ? 1 : this.nextId + 1;
    request.writeUInt32BE(id, 1);
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.settle(id);
        reject(new TimeoutError(`rendezvous call to ${this.endpoint} did not complete within ${timeoutMs} ms`));
      }, timeoutMs);
      this.pending.set(id, { resolve, reject, timer });
      this.socket.ref();
      this.socket.write(frame(request));
    });
  }

  private settle(id: number): Pending | undefined {
    const entry = this.pending.get(id);
    if (entry === undefined) return undefined;
    clearTimeout(entry.timer);
    this.pending.delete(id);
    if (this.pending.size === 0) this.socket.unref();
    return entry;
  }

  private receive(b: Buffer): void {
    const reader = new BodyReader(b);
    if (reader.u8() !== Op.Response) throw new ProtocolViolation('expected a response');
    const id = reader.u32();
    const status = reader.u8() as Status;
    const payload = reader.rest();
    // A reply to a call that already timed out here is dropped.
    this.settle(id)?.resolve({ status, payload });
  }

  private fail(error: SapipeError): void {
    if (this.failure !== undefined) return;
    this.failure = error;
    for (const id of [...this.pending.keys()]) this.settle(id)?.reject(error);
  }
}

function openSocket(host: string, port: number, timeoutMs: number): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const socket = netConnect({ host, port, noDelay: true });
    const timer = setTimeout(() => {
      socket.destroy();
      reject(new Error('connect timed out'));
    }, timeoutMs);
    socket.once('connect', () => {
      clearTimeout(timer);
      socket.removeAllListeners('error');
      resolve(socket);
    });
    socket.once('error', (error) => {
      clearTimeout(timer);
      socket.destroy();
      reject(error);
    });
  });
}
