#!/usr/bin/env node
// Staleness-1 accuracy experiment: runs `sapipe demo --json` once per seed with the given modes
// and prints, per mode, the final test accuracy over the seeds (mean, min, max), its drop against
// sync and how much of pipe-sgd's drop it recovers, as a Markdown table for bench/RESULTS.md.
//
//   npm run build
//   node scripts/experiments/staleness-accuracy.mjs --seeds 3 -- --workers 8 --lr 0.2 \
//     --modes sync,pipe-sgd,sapipe-dc,sapipe-wp:local,sapipe-wp:local+dc
//
// Options before `--` are the script's (--seeds N, --first-seed S, --json); everything after it
// goes to `sapipe demo` unchanged. Runs are sequential: the demo's workers already use every core.
import { runScript, splitArgs, withDemo } from './demo-runs.mjs';

function parseArgs(argv) {
  const { own, demoArgs } = splitArgs(argv, ['--seed', '--json', '--report']);
  const opts = { seeds: 3, firstSeed: 1, json: false, demoArgs };
  for (let i = 0; i < own.length; i++) {
    const a = own[i];
    const int = (name) => {
      const v = Number(own[++i]);
      if (!Number.isInteger(v) || v < (name === '--seeds' ? 1 : 0)) throw new Error(`${name} must be an integer${name === '--seeds' ? ' >= 1' : ' >= 0'}, got "${own[i]}"`);
      return v;
    };
    if (a === '--seeds') opts.seeds = int(a);
    else if (a === '--first-seed') opts.firstSeed = int(a);
    else if (a === '--json') opts.json = true;
    else throw new Error(`unknown option "${a}"; the script takes --seeds, --first-seed, --json, then -- and sapipe demo's options`);
  }
  return opts;
}

const stats = (xs) => {
  const mean = xs.reduce((a, b) => a + b, 0) / xs.length;
  return { mean, min: Math.min(...xs), max: Math.max(...xs) };
};
const pct = (x) => (x * 100).toFixed(2);

function main() {
  const opts = parseArgs(process.argv.slice(2));
  const runs = withDemo((demo) => {
    const all = [];
    for (let s = opts.firstSeed; s < opts.firstSeed + opts.seeds; s++) {
      const result = demo([...opts.demoArgs, '--seed', String(s)]);
      all.push(result);
      process.stderr.write(`seed ${s}: ${result.modes.map((m) => `${m.mode} ${pct(m.finalAccuracy)}%`).join(', ')}\n`);
    }
    return all;
  });
  const labels = runs[0].modes.map((m) => m.mode);
  const acc = (label) => runs.map((r) => r.modes.find((m) => m.mode === label).finalAccuracy);
  const rows = labels.map((label) => ({ mode: label, accuracy: acc(label), ...stats(acc(label)) }));
  const sync = rows.find((r) => r.mode === 'sync');
  const pipe = rows.find((r) => r.mode === 'pipe-sgd');
  for (const r of rows) {
    r.dropVsSync = sync ? sync.mean - r.mean : undefined;
    // The share of pipe-sgd's loss against sync that this mode wins back (1 = all of it).
    r.recovered = sync && pipe && sync.mean - pipe.mean > 0 ? (r.mean - pipe.mean) / (sync.mean - pipe.mean) : undefined;
  }
  const c = runs[0].config;
  if (opts.json) {
    console.log(JSON.stringify({ config: { ...c, seeds: runs.map((r) => r.config.seed) }, rows }, null, 2));
    return;
  }
  console.log(
    `MLP ${c.layers.join('-')} on MNIST (${c.trainSamples} train / ${c.testSamples} test), ${c.workers} workers x batch ${c.batch}, ` +
      `${c.epochs} epochs, SGD lr ${c.lr} momentum ${c.momentum}, DC ${c.dcKind === undefined && c.lambda === undefined ? "the trainer's default" : `${c.dcKind ?? 'elementwise'}, lambda ${c.lambda ?? "the kind's default"}`}, seeds ${runs.map((r) => r.config.seed).join(', ')}\n`,
  );
  console.log('| mode | final test accuracy, mean (min - max) | per seed | drop vs sync | share of pipe-sgd loss recovered |');
  console.log('|---|---:|---|---:|---:|');
  for (const r of rows)
    console.log(
      `| ${r.mode} | ${pct(r.mean)}% (${pct(r.min)} - ${pct(r.max)}) | ${r.accuracy.map(pct).join(', ')} | ` +
        `${r.dropVsSync === undefined ? '-' : `${pct(r.dropVsSync)} pt`} | ${r.recovered === undefined || r.mode === 'sync' || r.mode === 'pipe-sgd' ? '-' : `${(r.recovered * 100).toFixed(0)}%`} |`,
    );
}

runScript(main);
