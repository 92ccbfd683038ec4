/**
 * Embedding tables sharded by row over the ranks of a communicator (model parallel, as the
 * embedding servers of a recommendation system): rank r holds the rows `row % size === r`, so the
 * hot rows of a Zipf distribution spread over every shard. Only the owner of a row holds it and
 * updates it; that is what a lost rank takes with it, and what partial recovery reloads.
 *
 * A step: forward all-gathers the ranks' row indices, each rank writes the rows it owns for every
 * rank's batch (zeros elsewhere) and a reduce-scatter hands each rank its own batch's vectors;
 * backward all-gathers the vectors' gradients and each owner applies SGD to its rows, in rank,
 * sample and table order. Adding zeros is exact, so the result is the same on any number of ranks.
 */
import { Communicator, DisposedError, FlatBuffer, InvalidArgumentError, type MemorySource, seededRandom, SizeMismatchError } from 'sapipe';
import { checkFloat32Array, checkInteger, checkNumber, checkOptions, describeValue, optionKeys } from 'sapipe/validate';

/** The buffers of one batch size (the collectives need exact lengths). */
interface BatchBuffers {
  indices: FlatBuffer;
  allIndices: FlatBuffer;
  partial: FlatBuffer;
  vectors: FlatBuffer;
  grads: FlatBuffer;
  allGrads: FlatBuffer;
}

/** Options of {@link ShardedEmbedding}. @category Recommendation */
export interface ShardedEmbeddingOptions {
  /** Rows of each table. */
  tables: readonly number[];
  /** Width of every row. */
  dim: number;
  /** Seed of the initial rows (uniform in [-initScale, initScale]); the same rows on any number of ranks. Default 0. */
  seed?: number;
  /** Default 0.05. */
  initScale?: number;
}
const SHARDED_EMBEDDING_OPTION_KEYS = optionKeys<ShardedEmbeddingOptions>({ tables: true, dim: true, seed: true, initScale: true });

/**
 * This rank's shard of every embedding table, trained with SGD. `rows[t]` holds the owned rows of
 * table t, row r at local index `r / size` (integer division); `updates[t]` counts the updates of
 * each owned row since the caller last cleared it (what CPR-MFU ranks by); `touched` lists the
 * (table, local row) pairs updated by the last backward, each once.
 *
 * @category Recommendation
 */
export class ShardedEmbedding {
  readonly tables: readonly number[];
  readonly dim: number;
  readonly rank: number;
  readonly size: number;
  readonly rows: Float32Array[];
  readonly updates: Uint32Array[];
  /** Pairs (table, local row) updated by the last backward(), each once, flat: [t0, r0, t1, r1, ...]. */
  touched = new Int32Array(0);
  touchedCount = 0;
  private readonly stamp: Uint32Array[];
  private stampNow = 0;
  private readonly buffers = new Map<number, BatchBuffers>();
  private last: { batch: number; buffers: BatchBuffers } | undefined;
  private isDisposed = false;

  constructor(
    readonly comm: Communicator,
    options: ShardedEmbeddingOptions,
  ) {
    if (!(comm instanceof Communicator)) throw new InvalidArgumentError(`ShardedEmbedding: comm must be a Communicator, got ${describeValue(comm)}`);
    checkOptions(options, SHARDED_EMBEDDING_OPTION_KEYS, 'ShardedEmbedding(comm, options)');
    if (!Array.isArray(options.tables) || options.tables.length < 1 || options.tables.length > 1024) throw new InvalidArgumentError('ShardedEmbedding: tables must list the rows of each table (1 to 1024 tables)');
    this.tables = Object.freeze(options.tables.map((r, i) => checkInteger(r, `ShardedEmbedding: tables[${i}]`, 1, 1 << 24)));
    this.dim = checkInteger(options.dim, 'ShardedEmbedding: dim', 1, 4096);
    if (this.tables.reduce((n, r) => n + r * this.dim, 0) > 1 << 28) throw new InvalidArgumentError('ShardedEmbedding: at most 2^28 values over every table (rows x dim)');
    const scale = checkNumber(options.initScale ?? 0.05, 'ShardedEmbedding: initScale', 0, 1e3);
    const seed = checkInteger(options.seed ?? 0, 'ShardedEmbedding: seed', 0, 0xffff);
    this.rank = comm.rank;
    this.size = comm.size;
    this.rows = this.tables.map((rows, t) => {
      const owned = this.ownedRows(t);
      const out = new Float32Array(owned * this.dim);
      // The whole table's stream, keeping this shard's rows: the same values on any number of ranks.
      const next = seededRandom(seed * 65536 + t);
      for (let row = 0; row < rows; row++)
        for (let j = 0; j < this.dim; j++) {
          const v = (2 * next() - 1) * scale;
          if (row % this.size === this.rank) out[((row / this.size) | 0) * this.dim + j] = v;
        }
      return out;
    });
    this.updates = this.tables.map((_, t) => new Uint32Array(this.ownedRows(t)));
    this.stamp = this.tables.map((_, t) => new Uint32Array(this.ownedRows(t)));
  }

  /** Rows of table t this rank owns. */
  ownedRows(t: number): number {
    const rows = this.tables[t]!;
    return rows > this.rank ? Math.ceil((rows - this.rank) / this.size) : 0;
  }

  /** Values held by this shard. */
  get numParams(): number {
    return this.rows.reduce((n, r) => n + r.length, 0);
  }

  get disposed(): boolean {
    return this.isDisposed;
  }

  /**
   * The vectors of this rank's batch: `indices` [batch, tables] (rows) to [batch, tables, dim].
   * Every rank calls it with the same batch size. The view is valid until the next forward.
   */
  async forward(indices: Int32Array, batch: number): Promise<Float32Array> {
    this.checkLive('forward');
    checkInteger(batch, 'ShardedEmbedding.forward: batch', 1, 1 << 24);
    if (!(indices instanceof Int32Array)) throw new InvalidArgumentError(`ShardedEmbedding.forward: indices must be an Int32Array, got ${describeValue(indices)}`);
    const T = this.tables.length;
    if (indices.length < batch * T) throw new SizeMismatchError(`ShardedEmbedding.forward: ${indices.length} indices, batch x tables needs ${batch * T}`);
    for (let i = 0; i < batch * T; i++) {
      const row = indices[i]!;
      const rows = this.tables[i % T]!;
      if (row < 0 || row >= rows) throw new InvalidArgumentError(`ShardedEmbedding.forward: index ${row} at ${i} is outside table ${i % T}'s ${rows} rows`);
    }
    const b = this.buffersOf(batch);
    const idx = b.indices.array;
    for (let i = 0; i < batch * T; i++) idx[i] = indices[i]!; // exact below 2^24
    await this.comm.allgather(b.indices, b.allIndices);
    const all = b.allIndices.array;
    const partial = b.partial.array;
    partial.fill(0);
    const { dim, size, rank } = this;
    for (let i = 0; i < all.length; i++) {
      const row = all[i]!;
      if (row % size !== rank) continue;
      const local = ((row / size) | 0) * dim;
      partial.set(this.rows[i % T]!.subarray(local, local + dim), i * dim);
    }
    await this.comm.reduceScatter(b.partial, b.vectors);
    this.last = { batch, buffers: b };
    return b.vectors.array;
  }

  /**
   * Applies SGD with learning rate `lr` to the rows this rank owns, from every rank's gradient of
   * its last forward's vectors. `grads` [batch, tables, dim] is this rank's; every rank calls it.
   */
  async backward(grads: Float32Array, lr: number): Promise<void> {
    this.checkLive('backward');
    checkFloat32Array(grads, 'ShardedEmbedding.backward: grads');
    checkNumber(lr, 'ShardedEmbedding.backward: lr', 0, Number.MAX_VALUE);
    if (!this.last) throw new InvalidArgumentError('ShardedEmbedding.backward: call forward() first');
    const { batch, buffers: b } = this.last;
    const T = this.tables.length;
    const { dim, size, rank } = this;
    if (grads.length < batch * T * dim) throw new SizeMismatchError(`ShardedEmbedding.backward: ${grads.length} gradients, batch x tables x dim needs ${batch * T * dim}`);
    b.grads.array.set(grads.subarray(0, batch * T * dim));
    await this.comm.allgather(b.grads, b.allGrads);
    const all = b.allIndices.array;
    const g = b.allGrads.array;
    if (this.touched.length < 2 * all.length) this.touched = new Int32Array(2 * all.length);
    this.touchedCount = 0;
    if (++this.stampNow === 0xffffffff) {
      for (const s of this.stamp) s.fill(0);
      this.stampNow = 1;
    }
    for (let i = 0; i < all.length; i++) {
      const row = all[i]!;
      if (row % size !== rank) continue;
      const t = i % T;
      const localRow = (row / size) | 0;
      const w = this.rows[t]!;
      const at = localRow * dim;
      for (let j = 0; j < dim; j++) w[at + j] = w[at + j]! - lr * g[i * dim + j]!;
      this.updates[t]![localRow]!++;
      if (this.stamp[t]![localRow] !== this.stampNow) {
        this.stamp[t]![localRow] = this.stampNow;
        this.touched[2 * this.touchedCount] = t;
        this.touched[2 * this.touchedCount + 1] = localRow;
        this.touchedCount++;
      }
    }
    this.last = undefined;
  }

  /** Frees the collective buffers. Idempotent. */
  dispose(): void {
    if (this.isDisposed) return;
    this.isDisposed = true;
    for (const b of this.buffers.values()) for (const buf of Object.values(b)) (buf as FlatBuffer).dispose();
    this.buffers.clear();
    this.last = undefined;
  }

  private buffersOf(batch: number): BatchBuffers {
    let b = this.buffers.get(batch);
    if (b) return b;
    const T = this.tables.length;
    const n = batch * T;
    // A communicator that allocates (local, ucx) gives memory its collectives read fastest.
    const source = this.comm as Partial<MemorySource>;
    const alloc = (length: number): FlatBuffer => (typeof source.allocate === 'function' ? source.allocate(length) : FlatBuffer.allocate(length));
    b = {
      indices: alloc(n),
      allIndices: alloc(n * this.size),
      partial: alloc(n * this.size * this.dim),
      vectors: alloc(n * this.dim),
      grads: alloc(n * this.dim),
      allGrads: alloc(n * this.size * this.dim),
    };
    this.buffers.set(batch, b);
    return b;
  }

  private checkLive(what: string): void {
    if (this.isDisposed) throw new DisposedError(`ShardedEmbedding.${what}: the embedding was disposed`);
  }
}
