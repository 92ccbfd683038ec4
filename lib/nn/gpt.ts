/**
 * A GPT as a {@link Sequential} model: {@link gptLayers} builds the layer list (token and position
 * embedding, pre-LN transformer blocks, a final layer norm over each position, the output head),
 * and {@link tokenCrossEntropy} is a language model's loss: softmax cross-entropy of every
 * position's logits against its next token, on the memory the logits live in (`cpu` or `cuda:N`).
 */
import { DeviceBuffer } from '../device/index.js';
import { InvalidArgumentError, SizeMismatchError } from '../errors.js';
import { FlatBuffer } from '../tensor.js';
import { checkInteger, checkKnownKeys, checkObject, describeValue } from '../validate.js';
import { modelDevice, softmaxXent, type Tensor } from './ops.js';
import { checkLayers, type LayerSpec } from './sequential.js';

/** @category Models */
export interface GptOptions {
  /** Tokens (256 for bytes). */
  vocab: number;
  /** Positions per sample. */
  context: number;
  /** The model width: values per position. */
  dim: number;
  /** Attention heads per block (dim must be a multiple). */
  heads: number;
  /** Transformer blocks. */
  layers: number;
  /** Units of each block's MLP (default 4 * dim). */
  hidden?: number;
}

/**
 * The layers of a GPT-2 style model: `{ kind: 'embedding', vocab, dim, context }`, `layers`
 * transformer blocks, a layer norm over each position (`{ kind: 'layerNorm', features: dim, rows:
 * context }`) and the output head `{ kind: 'linear', in: dim, out: vocab, rows: context }` (its own
 * weights, not tied to the embedding; Kaiming-uniform as every linear layer). A sample is `context`
 * token ids (floats) in and `context * vocab` logits out; train it with {@link tokenCrossEntropy}.
 *
 * @category Models
 */
export function gptLayers(options: GptOptions): LayerSpec[] {
  checkObject(options, 'gptLayers(options)');
  checkKnownKeys(options, ['vocab', 'context', 'dim', 'heads', 'layers', 'hidden'], 'gptLayers(options)');
  const { vocab, context, dim, heads, hidden } = options;
  const blocks = checkInteger(options.layers, 'gptLayers: options.layers', 1, 1 << 16);
  const layers: LayerSpec[] = [
    { kind: 'embedding', vocab, dim, context },
    ...Array.from({ length: blocks }, (): LayerSpec => ({ kind: 'transformerBlock', dim, heads, context, ...(hidden === undefined ? {} : { hidden }) })),
    { kind: 'layerNorm', features: dim, rows: context },
    { kind: 'linear', in: dim, out: vocab, rows: context },
  ];
  checkLayers(layers, 'gptLayers');
  return layers;
}

/**
 * The mean cross-entropy of a language model's logits, `batch * context` rows of `vocab` values
 * (a {@link gptLayers} model's output), against `targets`, one token id a row held as floats (a
 * {@link tokenSource} batch's targets), in the same memory as the logits. Writes the gradient of
 * the mean loss, (softmax - onehot) / (batch * context), into `dlogits` when given (it may be
 * the logits themselves). Returns the mean loss in nats (perplexity is its exp).
 *
 * On the host a target that is not an integer below vocab is a typed error; on a device it gives
 * a NaN loss (a kernel cannot throw), reported here as the same error.
 *
 * @category Models
 */
export function tokenCrossEntropy(logits: Tensor, targets: Tensor, batch: number, context: number, vocab: number, dlogits?: Tensor): number {
  checkInteger(batch, 'tokenCrossEntropy: batch', 1, 1 << 24);
  checkInteger(context, 'tokenCrossEntropy: context', 1, 1 << 24);
  checkInteger(vocab, 'tokenCrossEntropy: vocab', 1, 1 << 24);
  if (!(logits instanceof FlatBuffer) && !(logits instanceof DeviceBuffer))
    throw new InvalidArgumentError(`tokenCrossEntropy: logits must be a FlatBuffer or a DeviceBuffer, got ${describeValue(logits)}`);
  const memory = modelDevice(logits instanceof FlatBuffer ? 'cpu' : `cuda:${logits.deviceIndex}`);
  const rows = batch * context;
  for (const [name, tensor, need] of [['logits', logits, rows * vocab], ['targets', targets, rows], ['dlogits', dlogits, rows * vocab]] as const) {
    if (tensor === undefined) continue;
    if (!memory.holds(tensor)) throw new InvalidArgumentError(`tokenCrossEntropy: ${name} must be a ${logits instanceof FlatBuffer ? 'FlatBuffer' : `DeviceBuffer on cuda:${(logits as DeviceBuffer).deviceIndex}`}, in the logits' memory`);
    if (tensor.length < need) throw new SizeMismatchError(`tokenCrossEntropy: ${name} holds ${tensor.length} values, batch x context${name === 'targets' ? '' : ' x vocab'} needs ${need}`);
  }
  const bad = (where: string): InvalidArgumentError =>
    new InvalidArgumentError(`tokenCrossEntropy: ${where} is not a token id (an integer in [0, ${vocab})); give every position's next token as the target`);
  if (targets instanceof FlatBuffer)
    for (let r = 0; r < rows; r++) {
      const v = targets.array[r]!;
      if (!Number.isInteger(v) || v < 0 || v >= vocab) throw bad(`targets[${r}] = ${v}`);
    }
  const losses = memory.allocate(rows);
  try {
    softmaxXent({ buffer: logits }, { buffer: targets }, rows, vocab, 1 / rows, { losses: { buffer: losses }, ...(dlogits === undefined ? {} : { dlogits: { buffer: dlogits } }) });
    const values = memory.read(losses, rows);
    let sum = 0;
    for (let r = 0; r < rows; r++) sum += values[r]!;
    if (Number.isNaN(sum) && !(targets instanceof FlatBuffer)) {
      const host = memory.read(targets, rows);
      const r = host.findIndex((v) => !Number.isInteger(v) || v < 0 || v >= vocab);
      if (r >= 0) throw bad(`targets[${r}] = ${host[r]}`);
    }
    return sum / rows;
  } finally {
    losses.dispose();
  }
}
