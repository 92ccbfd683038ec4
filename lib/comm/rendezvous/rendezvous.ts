/**
 * The rendezvous every rank joins at start-up: rank 0 serves the store and all ranks, rank 0
 * included, talk to it as clients. Ranks use it to swap connection details (UCX worker
 * addresses, the NCCL unique id) and to line up with barriers.
 */
import { InvalidArgumentError } from '../../errors.js';
import { describeValue } from '../../validate.js';
import { DEFAULT_RENDEZVOUS_TIMEOUT_MS, RendezvousClient, type CallOptions } from './client.js';
import { RendezvousServer } from './server.js';
import { checkPort, checkRank } from './validate.js';

/** Options of {@link createRendezvous}; {@link fromEnv} builds them from the environment. @category Communication */
export interface RendezvousOptions {
  rank: number;
  worldSize: number;
  /** Address of rank 0's store (`MASTER_ADDR`). Default `127.0.0.1`. */
  addr?: string;
  /** Port of the store (`MASTER_PORT`). Rank 0 may pass 0 to take a free port; read it back from `port`. */
  port: number;
  /** Shared secret (`SAPIPE_TOKEN`): rank 0's store refuses clients that do not present it. */
  token?: string;
  /** Deadline of every call, connecting included. Default 30 s. */
  timeoutMs?: number;
  /** Largest message, on both sides. Default 16 MiB. */
  maxMessageBytes?: number;
  /**
   * Address rank 0's store binds (`SAPIPE_BIND_ADDR`). Default `127.0.0.1`, so only this machine
   * can connect; multi-node jobs set it to an interface the other nodes reach (or `0.0.0.0`).
   */
  bindAddr?: string;
  /**
   * Let rank 0 serve on an address other than loopback without a token (`SAPIPE_ALLOW_NO_TOKEN=1`).
   * Without it, a `bindAddr` other machines reach needs a `token`: see docs/launch.md, "Who can
   * write to the store".
   */
  allowNoToken?: boolean;
  /**
   * Rank 0's store: connections served at once before they present the token (HELLO); more wait
   * to be accepted. Default {@link DEFAULT_MAX_PENDING_CONNECTIONS} (see RendezvousServerOptions).
   */
  maxPendingConnections?: number;
}

/** A rank's handle on the rendezvous store; returned by {@link createRendezvous}. @category Communication */
export class Rendezvous {
  /** @internal use {@link createRendezvous}. */
  constructor(
    readonly rank: number,
    readonly worldSize: number,
    /** The store's port: the bound port on rank 0 (useful with port 0). */
    readonly port: number,
    /** The connection to the store; every rank has one. */
    readonly client: RendezvousClient,
    /** The store itself, on rank 0 only. */
    readonly server: RendezvousServer | undefined,
    /** Prepended to every key: a {@link group}'s own key space (empty for the whole job). */
    private readonly prefix = '',
    /** The view of a group: its connection belongs to the whole job's Rendezvous. */
    private readonly view = false,
  ) {}

  /**
   * The rendezvous of a group of the job's ranks, e.g. to create a communicator over some of them
   * (`UcxCommunicator.create({ store: job.group('stage-0', rank, size) })`): the same store and
   * connection, with this rank's `rank` and `worldSize` in the group and keys of its own, so
   * groups named differently never meet. Every member calls it with the same name and size and a
   * distinct rank. Closing the view does nothing: close the job's Rendezvous after the groups' users.
   */
  group(name: string, rank: number, worldSize: number): Rendezvous {
    if (typeof name !== 'string' || name === '' || name.includes('/'))
      throw new InvalidArgumentError(`Rendezvous.group: name must be a non-empty string without '/', got ${describeValue(name)}`);
    checkRank(rank, worldSize);
    if (worldSize > this.worldSize) throw new InvalidArgumentError(`Rendezvous.group: a group of ${worldSize} ranks in a job of ${this.worldSize}`);
    return new Rendezvous(rank, worldSize, this.port, this.client, undefined, `${this.prefix}group/${name}/`, true);
  }

  /** The key in the store; anything but a string goes to the client as it is, to be refused there. */
  private key<T>(key: T): T {
    return (typeof key === 'string' && this.prefix !== '' ? this.prefix + key : key) as T;
  }

  /** See {@link RendezvousClient.set}. */
  set(key: string, value: Uint8Array | string, options?: CallOptions): Promise<void> {
    return this.client.set(this.key(key), value, options);
  }
  /** See {@link RendezvousClient.setOnce}: for what a rank publishes about itself. */
  setOnce(key: string, value: Uint8Array | string, options?: CallOptions): Promise<void> {
    return this.client.setOnce(this.key(key), value, options);
  }
  /** See {@link RendezvousClient.get}: waits until the key is set. */
  get(key: string, options?: CallOptions): Promise<Buffer> {
    return this.client.get(this.key(key), options);
  }
  /** See {@link RendezvousClient.getString}. */
  getString(key: string, options?: CallOptions): Promise<string> {
    return this.client.getString(this.key(key), options);
  }
  /** See {@link RendezvousClient.tryGet}. */
  tryGet(key: string, options?: CallOptions): Promise<Buffer | undefined> {
    return this.client.tryGet(this.key(key), options);
  }
  /** See {@link RendezvousClient.wait}. */
  wait(keys: string | readonly string[], options?: CallOptions): Promise<void> {
    return this.client.wait(Array.isArray(keys) ? (keys as readonly string[]).map((k) => this.key(k)) : this.key(keys), options);
  }
  /** See {@link RendezvousClient.add}. */
  add(key: string, delta = 1, options?: CallOptions): Promise<number> {
    return this.client.add(this.key(key), delta, options);
  }
  /** Waits for `worldSize` ranks (default: all of them) to reach the barrier `name`. */
  barrier(name: string, worldSize: number = this.worldSize, options?: CallOptions): Promise<void> {
    return this.client.barrier(this.key(name), worldSize, options);
  }

  /**
   * Closes the connection and, on rank 0, the store. Rank 0 first waits (up to the call timeout)
   * for the other ranks to disconnect, so a rank still reading the last barrier's reply is not
   * cut off; ranks still waiting on the store after that fail with PeerLostError, so pass a final
   * barrier before closing.
   */
  async close(): Promise<void> {
    if (this.view) return;
    // No newcomer while the others leave: a rank that already started its next job on this port
    // is refused (and retries) rather than served by this store, which is about to go away.
    this.server?.stopListening();
    if (this.server) await this.server.drained(1, this.client.timeoutMs);
    await this.client.close();
    await this.server?.close();
  }
}

/**
 * Joins the rendezvous: rank 0 starts the store and connects to it, other ranks connect (retrying
 * until `timeoutMs` while rank 0 starts up).
 *
 * @category Communication
 */
export async function createRendezvous(options: RendezvousOptions): Promise<Rendezvous> {
  if (options === null || typeof options !== 'object') throw new InvalidArgumentError('options must be an object');
  const { rank, worldSize } = options;
  checkRank(rank, worldSize);
  const addr = options.addr ?? '127.0.0.1';
  if (typeof addr !== 'string' || addr === '') throw new InvalidArgumentError('addr must be a non-empty string');
  checkPort(options.port, 'port', rank === 0);
  let server: RendezvousServer | undefined;
  let port = options.port;
  if (rank === 0) {
    server = await RendezvousServer.listen({
      host: options.bindAddr ?? '127.0.0.1',
      port: options.port,
      ...(options.token !== undefined && { token: options.token }),
      ...(options.maxMessageBytes !== undefined && { maxMessageBytes: options.maxMessageBytes }),
      ...(options.allowNoToken !== undefined && { allowNoToken: options.allowNoToken }),
      ...(options.maxPendingConnections !== undefined && { maxPendingConnections: options.maxPendingConnections }),
      // A store still closing on this port (a communicator destroyed just before) lets go of it soon.
      busyPortTimeoutMs: options.timeoutMs ?? DEFAULT_RENDEZVOUS_TIMEOUT_MS,
    });
    port = server.port;
  }
  try {
    const client = await RendezvousClient.connect({
      // Rank 0 reaches its own store on the address it bound; MASTER_ADDR may not even resolve locally.
      host: rank === 0 ? connectableHost(server!.host) : addr,
      port,
      ...(options.token !== undefined && { token: options.token }),
      ...(options.timeoutMs !== undefined && { timeoutMs: options.timeoutMs }),
      ...(options.maxMessageBytes !== undefined && { maxMessageBytes: options.maxMessageBytes }),
    });
    return new Rendezvous(rank, worldSize, port, client, server);
  } catch (error) {
    await server?.close();
    throw error;
  }
}

/** A wildcard bind address is not something to connect to; loopback reaches it. */
function connectableHost(bound: string): string {
  if (bound === '0.0.0.0') return '127.0.0.1';
  if (bound === '::') return '::1';
  return bound;
}
