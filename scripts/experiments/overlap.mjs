#!/usr/bin/env node
// Overlap experiment: for every mode, measures its steady-state step time C on local shared
// memory (nothing to wait for: forward, backward, update and the local reduction's CPU work) and T
// on an emulated network whose modelled ring all-reduce M of the gradient is `--ratio` x sync's C,
// runs alternating so that drift in the machine's load hits both alike, and reports the median T
// against C + M (what sync should pay) and max(C, M) (a perfectly overlapped staleness-1 mode),
// with the overlap efficiency (C + M - T) / min(C, M): 1 hides all of the shorter, 0 none.
//
//   npm run build
//   node scripts/experiments/overlap.mjs --repeats 3 -- --workers 2 --batch 250 --epochs 10
//
// Options before `--` are the script's (--ratio R, default 1; --repeats N, default 3; --json);
// everything after it goes to `sapipe demo`. The all-reduce cost is emulation.ts's, from dist/.
import { emulatedMs } from '../../dist/index.js';
import { runScript, splitArgs, withDemo } from './demo-runs.mjs';

function parseArgs(argv) {
  const { own, demoArgs } = splitArgs(argv, ['--gbps', '--latency-us', '--modes', '--json', '--report']);
  const opts = { ratio: 1, repeats: 3, json: false, demoArgs };
  for (let i = 0; i < own.length; i++) {
    const a = own[i];
    if (a === '--ratio') {
      opts.ratio = Number(own[++i]);
      if (!(opts.ratio > 0) || !Number.isFinite(opts.ratio)) throw new Error(`--ratio must be a number > 0, got "${own[i]}"`);
    } else if (a === '--repeats') {
      opts.repeats = Number(own[++i]);
      if (!Number.isInteger(opts.repeats) || opts.repeats < 1) throw new Error(`--repeats must be an integer >= 1, got "${own[i]}"`);
    } else if (a === '--json') opts.json = true;
    else throw new Error(`unknown option "${a}"; the script takes --ratio, --repeats, --json, then -- and sapipe demo's options`);
  }
  return opts;
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor((xs.length - 1) / 2)];

function main() {
  const opts = parseArgs(process.argv.slice(2));
  withDemo((demo) => {
    const modes = ['sync', 'pipe-sgd', 'sapipe-dc', 'sapipe-wp'];
    const plain = new Map(modes.map((m) => [m, []]));
    const emulated = new Map(modes.map((m) => [m, []]));
    let config;
    let gbps;
    let commMs;
    let params;
    for (let r = 0; r < opts.repeats; r++) {
      const base = demo([...opts.demoArgs, '--modes', modes.join(',')]);
      for (const m of base.modes) plain.get(m.mode).push(m.loopStepMs);
      if (r === 0) {
        // Fix the network once, from the first sync measurement: M = ratio x C(sync).
        config = base.config;
        params = config.layers.slice(1).reduce((a, out, i) => a + (config.layers[i] + 1) * out, 0);
        // emulatedMs is linear in 1/gbps (no latency here): solve M(gbps) = ratio x C.
        const msAt1 = emulatedMs({ gbps: 1, latencyUs: 0 }, 'allreduce', 4 * params, config.workers);
        gbps = msAt1 / (opts.ratio * base.modes[0].loopStepMs);
        commMs = emulatedMs({ gbps, latencyUs: 0 }, 'allreduce', 4 * params, config.workers);
      }
      const res = demo([...opts.demoArgs, '--modes', modes.join(','), '--gbps', String(gbps)]);
      for (const m of res.modes) emulated.get(m.mode).push(m.loopStepMs);
    }
    const rows = modes.map((mode) => {
      const computeMs = median(plain.get(mode));
      const stepMs = median(emulated.get(mode));
      return {
        mode,
        computeMs,
        stepMs,
        sumMs: computeMs + commMs,
        maxMs: Math.max(computeMs, commMs),
        efficiency: (computeMs + commMs - stepMs) / Math.min(computeMs, commMs),
        computeRuns: plain.get(mode),
        stepRuns: emulated.get(mode),
      };
    });
    const summary = { config: { ...config, modes: modes, emulate: { gbps, latencyUs: 0 } }, params, commMs, repeats: opts.repeats, rows };
    if (opts.json) {
      console.log(JSON.stringify(summary, null, 2));
      return;
    }
    const c = config;
    console.log(
      `MLP ${c.layers.join('-')} (${params} parameters, ${4 * params} B gradient), ${c.workers} workers x batch ${c.batch}, ${c.epochs} epochs, ` +
        `medians of ${opts.repeats} alternating runs; emulated ${gbps.toFixed(4)} Gbit/s -> modelled ring all-reduce M = ${commMs.toFixed(3)} ms ` +
        `(${opts.ratio} x the first sync C)\n`,
    );
    console.log('| mode | C: step ms, no network | T: step ms, emulated network | C + M | max(C, M) | overlap efficiency (C + M - T) / min(C, M) |');
    console.log('|---|---:|---:|---:|---:|---:|');
    for (const r of rows)
      console.log(
        `| ${r.mode} | ${r.computeMs.toFixed(2)} (${r.computeRuns.map((x) => x.toFixed(1)).join(', ')}) | ${r.stepMs.toFixed(2)} (${r.stepRuns.map((x) => x.toFixed(1)).join(', ')}) | ` +
          `${r.sumMs.toFixed(2)} | ${r.maxMs.toFixed(2)} | ${r.efficiency.toFixed(2)} |`,
      );
  });
}

runScript(main);
