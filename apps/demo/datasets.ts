/**
 * The data each demo model trains and is tested on, the same for `sapipe demo` and `sapipe train
 * pipeline`: the MLP on the MNIST digits (80/20 split), the CNN on Fashion-MNIST's own train and
 * test sets, the GPT on windows of the fortunes text (the last 10 % held out).
 */
import { type Dataset, loadFashionMnist, loadMnist, loadTextCorpus, splitText, textWindows, trainTestSplit } from 'sapipe';

/** Held-out windows a GPT is tested on. */
export const GPT_VALIDATION_WINDOWS = 256;

/** `context`: the GPT's bytes of context (a window; read only for `gpt`). */
export function modelDataSets(model: 'mlp' | 'cnn' | 'gpt', seed: number, context: number): { train: Dataset; test: Dataset } {
  if (model === 'mlp') return trainTestSplit(loadMnist(), { testFraction: 0.2, seed });
  if (model === 'cnn') return { train: loadFashionMnist({ split: 'train' }), test: loadFashionMnist({ split: 'test' }) };
  // Windows of `context` bytes and their next bytes, one after another (stride = context).
  const { train, validation } = splitText(loadTextCorpus().bytes, 0.1);
  return { train: textWindows(train, context), test: textWindows(validation, context, GPT_VALIDATION_WINDOWS) };
}
