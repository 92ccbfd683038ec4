/**
 * A small recommendation model in the shape of DLRM: one embedding table per categorical
 * feature, sharded by row over the ranks (ShardedEmbedding, SGD), whose vectors are concatenated
 * with the dense features and fed to an MLP replicated on every rank (data parallel, trained by a
 * DataParallelTrainer in `sync` mode); two logits, the click probability their softmax.
 */
import { type Communicator, type DataParallelOptimizerSpec, DataParallelTrainer, DisposedError, FlatBuffer, InvalidArgumentError, type MemorySource, MLP, rocAuc } from 'sapipe';
import { checkInteger, checkNumber, checkOptions, optionKeys } from 'sapipe/validate';
import { checkClickData, type ClickData } from './clicks.js';
import { ShardedEmbedding } from './embedding.js';

/** Options of {@link ClickModel.create}. @category Recommendation */
export interface ClickModelOptions {
  comm: Communicator;
  /** Rows of each embedding table. */
  tables: readonly number[];
  /** Width of the embedding vectors. Default 8. */
  dim?: number;
  denseFeatures: number;
  /** Hidden layer sizes of the MLP. Default [32]. */
  hidden?: readonly number[];
  /** Seed of the initial weights (embedding and MLP). Default 0. */
  seed?: number;
  /** SGD learning rate of the embedding rows. */
  embeddingLr: number;
  /** The MLP's optimizer. */
  optimizer: DataParallelOptimizerSpec;
}

const CLICK_MODEL_OPTION_KEYS = optionKeys<ClickModelOptions>({ comm: true, tables: true, dim: true, denseFeatures: true, hidden: true, seed: true, embeddingLr: true, optimizer: true });

/** A model's quality on a data set: mean log loss and ROC AUC. @category Recommendation */
export interface ClickMetrics {
  loss: number;
  auc: number;
}

/**
 * The recommendation model of the CPR experiment. Every rank calls every method, with the same
 * batch size: the embedding's collectives and the trainer's all-reduce are shared.
 *
 * @category Recommendation
 */
export class ClickModel {
  private x: FlatBuffer | undefined;
  private dx: FlatBuffer | undefined;
  private embGrad = new Float32Array(0);
  private capacity = 0;
  private isDisposed = false;

  private constructor(
    readonly comm: Communicator,
    readonly embedding: ShardedEmbedding,
    readonly mlp: MLP,
    readonly trainer: DataParallelTrainer,
    readonly denseFeatures: number,
    readonly embeddingLr: number,
  ) {}

  static async create(options: ClickModelOptions): Promise<ClickModel> {
    checkOptions(options, CLICK_MODEL_OPTION_KEYS, 'ClickModel.create(options)');
    const { comm } = options;
    const dim = checkInteger(options.dim ?? 8, 'ClickModel: dim', 1, 4096);
    const denseFeatures = checkInteger(options.denseFeatures, 'ClickModel: denseFeatures', 0, 1024);
    const hidden = options.hidden ?? [32];
    if (!Array.isArray(hidden)) throw new InvalidArgumentError('ClickModel: hidden must list the hidden layer sizes, e.g. [32]');
    const seed = checkInteger(options.seed ?? 0, 'ClickModel: seed', 0, 0xffff);
    const embeddingLr = checkNumber(options.embeddingLr, 'ClickModel: embeddingLr', 0, Number.MAX_VALUE);
    const embedding = new ShardedEmbedding(comm, { tables: options.tables, dim, seed });
    const inputs = embedding.tables.length * dim + denseFeatures;
    const memory = typeof (comm as Partial<MemorySource>).allocate === 'function' ? (comm as unknown as MemorySource) : undefined;
    let mlp: MLP;
    try {
      mlp = new MLP([inputs, ...hidden, 2], { seed: seed + 1, ...(memory && { memory }) });
    } catch (error) {
      embedding.dispose();
      throw error;
    }
    try {
      const trainer = await DataParallelTrainer.create({ comm, params: mlp.params, model: mlp, mode: 'sync', optimizer: options.optimizer });
      return new ClickModel(comm, embedding, mlp, trainer, denseFeatures, embeddingLr);
    } catch (error) {
      embedding.dispose();
      mlp.dispose();
      throw error;
    }
  }

  /** Embedding values of this rank's shard plus the MLP's. */
  get shardParams(): number {
    return this.embedding.numParams + this.mlp.numParams;
  }

  /**
   * One training step on samples [start, start + batch) of `data` (this rank's part of the global
   * batch): forward, the MLP's gradient averaged and applied by the trainer, the embedding rows
   * updated by their owners. Resolves with this rank's mean log loss.
   */
  async trainStep(data: ClickData, start: number, batch: number): Promise<number> {
    this.checkLive('trainStep');
    await this.forward(data, start, batch, this.trainer.forwardWeights);
    const labels = data.labels.subarray(start, start + batch);
    const loss = this.mlp.loss(labels);
    this.mlp.backward(this.trainer.grads, this.dx);
    // The embedding part of each input row's gradient.
    const T = this.embedding.tables.length;
    const width = T * this.embedding.dim;
    const inputs = width + this.denseFeatures;
    const dx = this.dx!.array;
    for (let r = 0; r < batch; r++) this.embGrad.set(dx.subarray(r * inputs, r * inputs + width), r * width);
    await this.embedding.backward(this.embGrad, this.embeddingLr);
    await this.trainer.step();
    return loss;
  }

  /**
   * Log loss and AUC of the model on every sample of `data` (the same data on every rank): each
   * rank scores its share in batches of `batch`, and the scores are gathered.
   */
  async evaluate(data: ClickData, batch = 256): Promise<ClickMetrics> {
    this.checkLive('evaluate');
    checkClickData(data, 'ClickModel.evaluate(data): data', false);
    checkInteger(batch, 'ClickModel.evaluate: batch', 1, 1 << 20);
    const { rank, size } = this.comm;
    const n = data.samples;
    const chunks = Math.ceil(n / (size * batch));
    const mine = FlatBuffer.allocate(chunks * batch);
    const all = FlatBuffer.allocate(chunks * batch * size);
    try {
      for (let c = 0; c < chunks; c++) {
        // Rank r scores [(c * size + r) * batch, ... + batch). Near the end the batch is moved back
        // to stay inside the data (every rank runs the same batch size): score i of the chunk is
        // then row `nominal + i`'s, at `nominal + i - start` in the batch; past the end, ignored.
        const nominal = (c * size + rank) * batch;
        const b = Math.min(batch, n);
        const start = Math.min(nominal, n - b);
        const logits = await this.forward(data, start, b, this.trainer.forwardWeights);
        for (let i = 0; i < batch && nominal + i < n; i++) {
          const r = nominal + i - start;
          mine.array[c * batch + i] = 1 / (1 + Math.exp(logits[2 * r]! - logits[2 * r + 1]!));
        }
      }
      await this.comm.allgather(mine, all);
      const scores = new Float32Array(n);
      for (let c = 0; c < chunks; c++)
        for (let r = 0; r < size; r++) {
          const start = (c * size + r) * batch;
          for (let i = 0; i < batch && start + i < n; i++) scores[start + i] = all.array[(r * chunks + c) * batch + i]!;
        }
      let loss = 0;
      for (let i = 0; i < n; i++) {
        const p = Math.min(1 - 1e-7, Math.max(1e-7, scores[i]!));
        loss -= data.labels[i] ? Math.log(p) : Math.log(1 - p);
      }
      return { loss: loss / n, auc: rocAuc(scores, data.labels) };
    } finally {
      mine.dispose();
      all.dispose();
    }
  }

  get disposed(): boolean {
    return this.isDisposed;
  }

  async dispose(): Promise<void> {
    if (this.isDisposed) return;
    this.isDisposed = true;
    this.embedding.dispose();
    await this.trainer.dispose();
    this.mlp.dispose();
    this.x?.dispose();
    this.dx?.dispose();
  }

  private checkLive(what: string): void {
    if (this.isDisposed) throw new DisposedError(`ClickModel.${what}: the model was disposed`);
  }

  private async forward(data: ClickData, start: number, batch: number, weights: FlatBuffer): Promise<Float32Array> {
    checkClickData(data, 'ClickModel: data', false);
    checkInteger(batch, 'ClickModel: batch', 1, 1 << 20);
    checkInteger(start, 'ClickModel: start', 0, Math.max(0, data.samples - batch));
    const T = this.embedding.tables.length;
    if (data.tables.length !== T || data.denseFeatures !== this.denseFeatures)
      throw new InvalidArgumentError(`ClickModel: the data has ${data.tables.length} tables and ${data.denseFeatures} dense features, the model ${T} and ${this.denseFeatures}`);
    const width = T * this.embedding.dim;
    const inputs = width + this.denseFeatures;
    if (batch > this.capacity) {
      this.x?.dispose();
      this.dx?.dispose();
      this.x = FlatBuffer.allocate(batch * inputs);
      this.dx = FlatBuffer.allocate(batch * inputs);
      this.embGrad = new Float32Array(batch * width);
      this.capacity = batch;
    }
    const vectors = await this.embedding.forward(data.sparse.subarray(start * T, (start + batch) * T), batch);
    const x = this.x!.array;
    const D = this.denseFeatures;
    for (let r = 0; r < batch; r++) {
      x.set(vectors.subarray(r * width, (r + 1) * width), r * inputs);
      x.set(data.dense.subarray((start + r) * D, (start + r + 1) * D), r * inputs + width);
    }
    return this.mlp.forward(this.x!, batch, weights);
  }
}
