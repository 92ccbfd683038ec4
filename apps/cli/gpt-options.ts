/**
 * `--blocks`, `--dim`, `--heads` and `--context`: the GPT's size on the command line, shared by
 * `sapipe demo` and `sapipe train pipeline` so that the two commands spell, explain and refuse
 * them alike; each passes its own defaults.
 */
import type { Command } from 'commander';

import { InvalidArgumentError } from 'sapipe';
import { checkGptSize, type GptSize } from '../demo/gpt-size.js';
import { numberOption } from './parse.js';

/** The four options as commander hands them over: strings, checked by gptSizeFromCli. */
export interface GptSizeCliOptions {
  blocks?: string;
  dim?: string;
  heads?: string;
  context?: string;
}

/** Adds the four options to `command`, their help stating `defaults`. */
export function addGptSizeOptions(command: Command, defaults: GptSize): Command {
  return command
    .option('--blocks <n>', `--model gpt: transformer blocks (default ${defaults.blocks})`)
    .option('--dim <n>', `--model gpt: width (default ${defaults.dim})`)
    .option('--heads <n>', `--model gpt: attention heads, dividing the width (default ${defaults.heads})`)
    .option('--context <n>', `--model gpt: bytes of context (default ${defaults.context}); a sample is a window of that many bytes, its labels the next byte of each`);
}

/**
 * The GPT's size from the command line, each option not given taken from `defaults`; undefined
 * unless `model` is `gpt`, where any of the four is a typed error (it would be silently ignored).
 * The ranges and heads dividing the width are checked here and again with the rest of the
 * configuration (checkGptSize), so a size given through the API is checked the same way.
 */
export function gptSizeFromCli(o: GptSizeCliOptions, model: string, defaults: GptSize): GptSize | undefined {
  const given = { blocks: o.blocks, dim: o.dim, heads: o.heads, context: o.context };
  for (const [key, value] of Object.entries(given))
    if (value !== undefined && model !== 'gpt') throw new InvalidArgumentError(`--${key} sets the GPT's size; use it with --model gpt`);
  if (model !== 'gpt') return undefined;
  const pick = (value: string | undefined, name: string, fallback: number): number => (value === undefined ? fallback : numberOption(value, name));
  // Checked here too, so a command refuses a bad size before it prints or loads anything.
  return checkGptSize({
    blocks: pick(o.blocks, '--blocks', defaults.blocks),
    dim: pick(o.dim, '--dim', defaults.dim),
    heads: pick(o.heads, '--heads', defaults.heads),
    context: pick(o.context, '--context', defaults.context),
  });
}
