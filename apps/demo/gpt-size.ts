/**
 * The size of the byte-level GPT that `sapipe demo --model gpt` and `sapipe train pipeline --model
 * gpt` train on the fortunes text, held once here so that both commands check, build and describe
 * it alike (each keeps only its own defaults).
 */
import { gptLayers, InvalidArgumentError, type LayerSpec } from 'sapipe';
import { checkInteger, checkObject } from 'sapipe/validate';

/** The GPT's size: transformer blocks, width, attention heads, context (bytes). */
export interface GptSize {
  blocks: number;
  dim: number;
  heads: number;
  context: number;
}

/** The GPT reads bytes: 256 token ids. */
const BYTE_VOCAB = 256;

/**
 * Checks a GPT size, naming each field by the command-line option that sets it (`--blocks`, `--dim`,
 * `--heads`, `--context`), since that is where a bad value comes from.
 */
export function checkGptSize(g: GptSize): GptSize {
  checkObject(g, '--model gpt sizes');
  checkInteger(g.blocks, '--blocks', 1, 64);
  checkInteger(g.dim, '--dim', 1, 4096);
  checkInteger(g.heads, '--heads', 1, 64);
  checkInteger(g.context, '--context', 1, 4096);
  // gptLayers would refuse this too, but naming the options says what to change.
  if (g.dim % g.heads !== 0) throw new InvalidArgumentError(`--dim ${g.dim} must be a multiple of --heads ${g.heads} (each head takes dim/heads values)`);
  gptSizeLayers(g); // the library's own checks of the stack (a head's size, among them)
  return g;
}

/** The layers of a byte-level GPT of size `g`. */
export function gptSizeLayers(g: GptSize): LayerSpec[] {
  return gptLayers({ vocab: BYTE_VOCAB, context: g.context, dim: g.dim, heads: g.heads, layers: g.blocks });
}

/** The GPT and its data in words, for tables and reports. */
export function describeGpt(g: GptSize): string {
  return `byte-level GPT (${g.blocks} blocks, width ${g.dim}, ${g.heads} heads, context ${g.context}) on the fortunes text`;
}
