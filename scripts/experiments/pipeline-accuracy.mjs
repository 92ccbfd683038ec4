// Accuracy of the pipeline schedules on MNIST: each configuration trains the pipeline demo's MLP
// with `sapipe train pipeline` for the same epochs over several seeds; prints final test accuracy
// (mean, spread and each seed), training wall time and the exact command of each row as a markdown
// table.
//
//   node scripts/experiments/pipeline-accuracy.mjs [--seeds 1,2,3] [--schedules a,b] -- [sapipe train pipeline options]
//   node scripts/experiments/pipeline-accuracy.mjs --study [--seeds 1,2,3] [--rows label,label] -- [options for every row]
//
// --study runs the accuracy study of docs/pipeline.md (bench/RESULTS.md): every schedule the
// papers compare, each row with its own options after the common ones.
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const bin = fileURLToPath(new URL('../../bin/sapipe.js', import.meta.url));
const argv = process.argv.slice(2);
const split = argv.indexOf('--');
const own = split < 0 ? argv : argv.slice(0, split);
const common = split < 0 ? [] : argv.slice(split + 1);
for (const f of ['--seed', '--json', '--report']) if (common.includes(f)) throw new Error(`the script sets ${f} itself`);
const option = (name, fallback) => {
  const i = own.indexOf(name);
  return i < 0 ? fallback : own[i + 1];
};
const seeds = option('--seeds', '1,2,3').split(',').map(Number);

// The small-batch rule of docs/ALGORITHMS.md section 4 from the table's (lr 0.05, momentum 0.9) at
// batch 128 (8 x 16) down to batch 1: the same per-sample step, momentum over the same samples.
const BATCH_1 = ['--lr', '0.0000032140248', '--momentum', '0.99917721'];
const ADAMW = ['--optimizer', 'adamw', '--lr', '0.001'];
/** [label, options]: the study's rows. */
const STUDY = [
  ['gpipe', ['--schedule', 'gpipe']],
  ['1f1b', ['--schedule', '1f1b']],
  ['wavelet', ['--schedule', 'wavelet']],
  // Wavelet's data-parallel form: `stages` workers, each with a tick and a tock replica of the whole model.
  ['wavelet-dp', ['--schedule', 'wavelet', '--form', 'data-parallel']],
  ['pipedream', ['--schedule', 'pipedream']],
  // 2BW's delay of one batch shows only between the batches of a round: 8 of them per round.
  ['pipedream-2bw', ['--schedule', 'pipedream-2bw', '--iterations', '8']],
  ['spectrain', ['--schedule', 'spectrain']],
  ['pipeoptim', ['--schedule', 'pipeoptim']],
  ['gpipe-adamw', ['--schedule', 'gpipe', ...ADAMW]],
  ['pipedream-adamw', ['--schedule', 'pipedream', ...ADAMW]],
  ['pipeoptim-adamw', ['--schedule', 'pipeoptim', ...ADAMW]],
  ['avgpipe-n2', ['--schedule', 'avgpipe', '--pipelines', '2']],
  ['1f1b-x2-sync', ['--schedule', '1f1b', '--pipelines', '2', '--dp-mode', 'sync']],
  ['1f1b-x2-sapipe-wp', ['--schedule', '1f1b', '--pipelines', '2', '--dp-mode', 'sapipe-wp']],
  ['pb-b1-sc-lwp', ['--schedule', 'pipelined-backprop', '--microbatch-size', '1', '--microbatches', '64', ...BATCH_1]],
  ['pb-b1-plain', ['--schedule', 'pipelined-backprop', '--microbatch-size', '1', '--microbatches', '64', ...BATCH_1, '--no-spike-compensation', '--no-weight-prediction']],
  ['sgd-b1-1worker', ['--schedule', 'gpipe', '--stages', '1', '--microbatches', '1', '--microbatch-size', '1', ...BATCH_1]],
];

let rows;
if (own.includes('--study')) {
  const only = option('--rows', undefined)?.split(',');
  rows = STUDY.filter(([label]) => !only || only.includes(label));
  if (only && rows.length !== only.length) throw new Error(`--rows: unknown label among ${only.join(', ')}; known: ${STUDY.map((r) => r[0]).join(', ')}`);
} else {
  if (common.includes('--schedule')) throw new Error('the script sets --schedule itself (or use --study)');
  rows = option('--schedules', 'gpipe,pipedream,pipedream-2bw,spectrain,pipeoptim').split(',').map((s) => [s, ['--schedule', s]]);
}

const dir = mkdtempSync(join(tmpdir(), 'sapipe-pipeline-acc-'));
const results = [];
const mean = (xs) => xs.reduce((a, b) => a + b, 0) / xs.length;
try {
  for (const [label, args] of rows) {
    const runs = seeds.map((seed) => {
      const out = execFileSync(process.execPath, [bin, 'train', 'pipeline', ...common, ...args, '--seed', String(seed), '--json', '--report', join(dir, 'r.html')], {
        encoding: 'utf8',
        stdio: ['ignore', 'pipe', 'inherit'],
      });
      const r = JSON.parse(out);
      const last = r.epochs[r.epochs.length - 1];
      return { accuracy: last.accuracy, wallS: r.epochs.reduce((a, e) => a + e.wallMs, 0) / 1000, config: r.config };
    });
    const acc = runs.map((r) => r.accuracy * 100);
    results.push({ label, args, runs, accuracy: mean(acc), spread: Math.max(...acc) - Math.min(...acc), wallS: mean(runs.map((r) => r.wallS)) });
    process.stderr.write(`${label}: ${acc.map((a) => a.toFixed(2)).join(', ')}\n`);
  }
} finally {
  rmSync(dir, { recursive: true, force: true });
}
const c = results[0].runs[0].config;
console.log(`common: \`npx sapipe train pipeline ${common.join(' ')} --seed <s>\` + the row's options; first row: MLP ${c.sizes.join('-')}, ${c.stages} stages, M=${c.microBatches} x ${c.microBatchSize}, ${c.epochs} epochs, seeds ${seeds.join(', ')}\n`);
console.log('| row | options | test accuracy, mean | spread (max - min) | per seed | training wall s, mean |');
console.log('|---|---|---:|---:|---|---:|');
for (const r of results)
  console.log(`| ${r.label} | \`${r.args.join(' ')}\` | ${r.accuracy.toFixed(2)}% | ${r.spread.toFixed(2)} | ${r.runs.map((x) => (x.accuracy * 100).toFixed(2)).join(', ')} | ${r.wallS.toFixed(2)} |`);
