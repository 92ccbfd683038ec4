// The seeds' comparisons on sapipe's own models, over several seeds (each run one CLI process):
//   --kind schedules: `sapipe train pipeline --model M` under each pipeline schedule;
//   --kind modes:     `sapipe demo --model M` in each data-parallel mode (sync, pipe-sgd, sapipe-dc, sapipe-wp).
// Prints a markdown table: per schedule or mode, the last epoch's test accuracy (the GPT: its
// validation loss and perplexity too) as the mean and min-max over the seeds; --json prints every run.
//
//   node scripts/experiments/model-study.mjs --model cnn|gpt --kind schedules|modes [--seeds 1,2,3]
//     [--epochs 2] [--schedules gpipe,1f1b,...] [-- extra CLI arguments for every run]
import { execFileSync } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

const { values: a, positionals: extra } = parseArgs({
  allowPositionals: true,
  options: {
    model: { type: 'string', default: 'cnn' },
    kind: { type: 'string', default: 'schedules' },
    schedules: { type: 'string', default: 'gpipe,1f1b,pipedream,pipedream-2bw,spectrain,pipeoptim,pipelined-backprop' },
    seeds: { type: 'string', default: '1,2,3' },
    epochs: { type: 'string', default: '2' },
    json: { type: 'boolean', default: false },
  },
});
const bin = fileURLToPath(new URL('../../bin/sapipe.js', import.meta.url));
const dir = mkdtempSync(join(tmpdir(), 'sapipe-model-study-'));
const sapipe = (args) => JSON.parse(execFileSync(process.execPath, [bin, ...args, '--json'], { encoding: 'utf8', maxBuffer: 1 << 26 }));
const runs = [];
for (const seed of a.seeds.split(',')) {
  if (a.kind === 'modes') {
    const out = sapipe(['demo', '--model', a.model, '--epochs', a.epochs, '--seed', seed, '--report', join(dir, `demo-${seed}.html`), ...extra]);
    for (const m of out.modes) runs.push({ name: m.mode, seed: Number(seed), accuracy: m.finalAccuracy, validationLoss: m.finalLoss, samplesPerSec: m.samplesPerSec });
  } else {
    for (const schedule of a.schedules.split(',')) {
      const out = sapipe(['train', 'pipeline', '--model', a.model, '--schedule', schedule, '--epochs', a.epochs, '--seed', seed, '--boundaries', 'params', '--report', join(dir, `${schedule}-${seed}.html`), ...extra]);
      const last = out.epochs.at(-1);
      runs.push({ name: schedule, seed: Number(seed), accuracy: last.accuracy, validationLoss: last.validationLoss, lr: out.config.lr });
    }
  }
  process.stderr.write(`seed ${seed}: ${runs.filter((r) => r.seed === Number(seed)).map((r) => `${r.name} ${(r.accuracy * 100).toFixed(2)}%${r.validationLoss === undefined ? '' : ` loss ${r.validationLoss.toFixed(4)}`}`).join(', ')}\n`);
}
if (a.json) console.log(JSON.stringify(runs, null, 2));
else {
  const lm = runs.some((r) => r.validationLoss !== undefined);
  const stat = (xs, digits) => `${(xs.reduce((x, y) => x + y, 0) / xs.length).toFixed(digits)} (${Math.min(...xs).toFixed(digits)}-${Math.max(...xs).toFixed(digits)})`;
  console.log(`| ${a.kind === 'modes' ? 'mode' : 'schedule'} | test accuracy after ${a.epochs} epochs, % |${lm ? ' validation loss | perplexity |' : ''}`);
  console.log(`|---|---|${lm ? '---|---|' : ''}`);
  for (const name of [...new Set(runs.map((r) => r.name))]) {
    const mine = runs.filter((r) => r.name === name);
    const loss = mine.map((r) => r.validationLoss);
    console.log(`| ${name} | ${stat(mine.map((r) => r.accuracy * 100), 2)} |${lm ? ` ${stat(loss, 4)} | ${stat(loss.map(Math.exp), 2)} |` : ''}`);
  }
  console.log(`\n(mean, min-max over seeds ${a.seeds}; every run's arguments besides the seed: ${extra.join(' ') || 'the defaults'})`);
}
