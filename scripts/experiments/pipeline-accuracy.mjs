// The first accuracy table of the pipeline runtime: each schedule trains the pipeline demo's MLP
// on MNIST on 4 stages for the same epochs, over several seeds; prints final test accuracy (mean
// and each seed) and wall time as a markdown table.
//
//   node scripts/experiments/pipeline-accuracy.mjs [--seeds 1,2,3] [--schedules a,b] -- [sapipe train pipeline options]
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const bin = fileURLToPath(new URL('../../bin/sapipe.js', import.meta.url));
const argv = process.argv.slice(2);
const split = argv.indexOf('--');
const own = split < 0 ? argv : argv.slice(0, split);
const trainArgs = split < 0 ? [] : argv.slice(split + 1);
for (const f of ['--schedule', '--seed', '--json', '--report']) if (trainArgs.includes(f)) throw new Error(`the script sets ${f} itself`);
const option = (name, fallback) => {
  const i = own.indexOf(name);
  return i < 0 ? fallback : own[i + 1];
};
const seeds = option('--seeds', '1,2,3').split(',').map(Number);
const schedules = option('--schedules', 'gpipe,pipedream,pipedream-2bw,spectrain,pipeoptim').split(',');

const dir = mkdtempSync(join(tmpdir(), 'sapipe-pipeline-acc-'));
const rows = [];
try {
  for (const schedule of schedules) {
    const runs = seeds.map((seed) => {
      const out = execFileSync(process.execPath, [bin, 'train', 'pipeline', '--schedule', schedule, '--seed', String(seed), ...trainArgs, '--json', '--report', join(dir, 'r.html')], {
        encoding: 'utf8',
        stdio: ['ignore', 'pipe', 'inherit'],
      });
      const r = JSON.parse(out);
      const last = r.epochs[r.epochs.length - 1];
      return { accuracy: last.accuracy, wallS: r.epochs.reduce((a, e) => a + e.wallMs, 0) / 1000, config: r.config };
    });
    const mean = (xs) => xs.reduce((a, b) => a + b, 0) / xs.length;
    rows.push({ schedule, runs, accuracy: mean(runs.map((r) => r.accuracy)), wallS: mean(runs.map((r) => r.wallS)) });
    process.stderr.write(`${schedule}: ${runs.map((r) => (r.accuracy * 100).toFixed(2)).join(', ')}\n`);
  }
} finally {
  rmSync(dir, { recursive: true, force: true });
}
const c = rows[0].runs[0].config;
console.log(`MLP ${c.sizes.join('-')} on MNIST, ${c.stages} stages, M=${c.microBatches} x ${c.microBatchSize}, ${c.epochs} epochs, ${c.optimizer} lr ${c.lr}${c.optimizer === 'sgd' ? ` momentum ${c.momentum}` : ''}, seeds ${seeds.join(', ')}\n`);
console.log('| schedule | test accuracy, mean | per seed | training wall s, mean |');
console.log('|---|---:|---|---:|');
for (const r of rows) console.log(`| ${r.schedule} | ${(r.accuracy * 100).toFixed(2)}% | ${r.runs.map((x) => (x.accuracy * 100).toFixed(2)).join(', ')} | ${r.wallS.toFixed(2)} |`);
