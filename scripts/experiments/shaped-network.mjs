#!/usr/bin/env node
// The overlap and compression experiments on a real shaped network (needs root): 2 hosts x 2
// ranks (scripts/shaped-net.sh: network namespaces, links limited by tbf), ucx between them.
//
//   node scripts/experiments/shaped-network.mjs [--rate 1gbit] [--reps 5] [--steps 60]
//        [--layers 784,128,10] [--batch 32] [--parts exchange,fused,training] [--json]
//
// Measures, on rank 0 (each part only when --parts names it; all three by default):
// (1) exchange: dense all-reduce against the top-k exchange (density 0.01, error feedback; flat
// sparseAllreduce and hierarchicalSparseAllreduce) per step at the demo model's size (101 770
// floats) and at 16M floats;
// (2) fused: at 16M floats (buffers in the communicator's shared memory), the all-reduce alone
// against allreduceAndStep, replicated and sharded, with SGD-momentum and Adam: whether the update
// hides behind the link;
// (3) training: DataParallelTrainer step time of an MLP (--layers, default the demo's 784-128-10;
// --batch per rank, default 32; synthetic inputs) in sync and sapipe-wp, dense and with top-k
// 0.01, beside the compute alone (forward and backward). A wider MLP and a larger batch make the
// compute comparable to the all-reduce, where SAPipe's overlap can show.
// Medians over the repetitions after warm-up. Build first (npm run build).
import { execFileSync, spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { performance } from 'node:perf_hooks';

const HERE = fileURLToPath(import.meta.url);
const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const NET = `${ROOT}scripts/shaped-net.sh`;
const arg = (name, fallback) => {
  const i = process.argv.indexOf(name);
  return i < 0 ? fallback : process.argv[i + 1];
};
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

if (process.argv[2] === '--rank') await rank(JSON.parse(process.argv[3]));
else await drive();

async function drive() {
  const options = {
    rate: arg('--rate', '1gbit'),
    reps: Number(arg('--reps', '5')),
    steps: Number(arg('--steps', '60')),
    layers: arg('--layers', '784,128,10').split(',').map(Number),
    batch: Number(arg('--batch', '32')),
    parts: arg('--parts', 'exchange,fused,training').split(','),
  };
  const prefix = `sapx${process.pid % 10000}`;
  execFileSync(NET, ['up', prefix, '2', options.rate]);
  try {
    const runs = [0, 1].map(
      (h) =>
        new Promise((resolve) => {
          const child = spawn(
            NET,
            ['exec', prefix, String(h), 'env', 'NODE_OPTIONS=', `SAPIPE_TOKEN=x${process.pid}`, 'SAPIPE_BIND_ADDR=10.77.0.1',
              process.execPath, `${ROOT}bin/sapipe.js`, 'launch', '--nnodes', '2', '--node-rank', String(h), '--master-addr', '10.77.0.1', '--master-port', '29500', '--nproc', '2',
              HERE, '--rank', JSON.stringify(options)],
            { stdio: ['ignore', 'pipe', 'inherit'] },
          );
          let out = '';
          child.stdout.on('data', (d) => (out += d));
          child.on('close', (code) => resolve({ code, out }));
        }),
    );
    const [host0, host1] = await Promise.all(runs);
    if (host0.code !== 0 || host1.code !== 0) throw new Error(`a launcher failed (${host0.code}, ${host1.code})`);
    const line = /\[0\] RESULT (.*)/.exec(host0.out);
    const result = JSON.parse(line[1]);
    if (process.argv.includes('--json')) return void console.log(JSON.stringify({ options, ...result }));
    console.log(`shaped network: 2 hosts x 2 ranks, links at ${options.rate} (tbf), ucx; medians of ${options.reps} (exchange, fused) and ${options.steps} steps (training)`);
    if (result.exchange.length > 0) console.log('exchange per step      dense all-reduce   top-k 0.01, flat   top-k 0.01, hierarchical   flat / dense   hierarchical / dense');
    for (const r of result.exchange)
      console.log(
        `${String(r.length).padStart(9)} floats     ${r.denseMs.toFixed(2).padStart(9)} ms     ${r.topkMs.toFixed(2).padStart(9)} ms     ${r.hierarchicalMs.toFixed(2).padStart(9)} ms              ` +
          `${(r.topkMs / r.denseMs).toFixed(3)}          ${(r.hierarchicalMs / r.denseMs).toFixed(3)}`,
      );
    for (const r of result.fused)
      console.log(
        `fused step, ${r.length} floats, ${r.optimizer}: all-reduce alone ${r.allreduceMs.toFixed(1)} ms, replicated ${r.fusedMs.toFixed(1)} ms (${(r.fusedMs / r.allreduceMs).toFixed(3)}x), ` +
          (r.shardedMs === null ? `sharded: ${r.shardedError}` : `sharded ${r.shardedMs.toFixed(1)} ms (${(r.shardedMs / r.allreduceMs).toFixed(3)}x)`) +
          `; standalone update ${r.updateMs.toFixed(1)} ms`,
      );
    if (result.training.length > 0) {
      console.log(`MLP ${options.layers.join('-')} (${result.params} parameters), batch ${options.batch} per rank: compute alone ${result.computeMs.toFixed(2)} ms per step`);
      for (const r of result.training) console.log(`  ${r.mode.padEnd(10)} ${r.exchange.padEnd(6)} ${r.stepMs.toFixed(2).padStart(8)} ms per step`);
    }
  } finally {
    execFileSync(NET, ['down', prefix]);
  }
}

async function rank(options) {
  const { createHostGroups, allreduceAndStep, Adam, DataParallelTrainer, FlatBuffer, MLP, ParamSet, SGD, sparseAllreduce, hierarchicalSparseAllreduce, hierarchicalPartLength } = await import(
    new URL('../../dist/index.js', import.meta.url).href
  );
  const groups = await createHostGroups();
  const comm = groups.world;
  const exchange = [];
  for (const length of options.parts.includes('exchange') ? [101_770, 16 << 20] : []) {
    const buf = FlatBuffer.allocate(length);
    const residual = FlatBuffer.allocate(length);
    const fill = () => {
      const a = buf.array;
      for (let i = 0; i < length; i++) a[i] = Math.sin(i * 0.37 + comm.rank);
    };
    const partResidual = FlatBuffer.allocate(hierarchicalPartLength(length, groups.local.size));
    const dense = [];
    const topk = [];
    const hier = [];
    for (let r = 0; r < options.reps + 1; r++) {
      fill();
      await comm.barrier();
      let t0 = performance.now();
      await comm.allreduce(buf, { op: 'avg' });
      if (r > 0) dense.push(performance.now() - t0);
      fill();
      await comm.barrier();
      t0 = performance.now();
      await sparseAllreduce(comm, buf, { density: 0.01, residual });
      if (r > 0) topk.push(performance.now() - t0);
      fill();
      await comm.barrier();
      t0 = performance.now();
      await hierarchicalSparseAllreduce(groups, buf, { density: 0.01, residual: partResidual });
      if (r > 0) hier.push(performance.now() - t0);
    }
    exchange.push({ length, denseMs: median(dense), topkMs: median(topk), hierarchicalMs: median(hier) });
    buf.dispose();
    residual.dispose();
    partResidual.dispose();
  }
  const fused = [];
  for (const kind of options.parts.includes('fused') ? ['sgd-momentum', 'adam'] : []) {
    const length = 16 << 20;
    const params = new ParamSet({ w: [length] }, { memory: comm });
    params.weights.array.fill(0.5);
    const opt = kind === 'adam' ? new Adam(params, { lr: 1e-3 }) : new SGD(params, { lr: 1e-3, momentum: 0.9 });
    const fill = () => {
      const g = params.grads.array;
      for (let i = 0; i < length; i++) g[i] = 1e-3 * Math.sin(i * 0.37 + comm.rank);
    };
    const times = { allreduce: [], fused: [], sharded: [], update: [] };
    for (let r = 0; r < options.reps + 1; r++) {
      const timed = async (name, fn) => {
        fill();
        await comm.barrier();
        const t0 = performance.now();
        await fn();
        if (r > 0) times[name].push(performance.now() - t0);
      };
      await timed('allreduce', () => comm.allreduce(params.grads, { op: 'avg' }));
      await timed('fused', () => allreduceAndStep(comm, opt));
      if (times.sharded !== null)
        await timed('sharded', () => allreduceAndStep(comm, opt, { update: 'sharded' })).catch((error) => {
          // Every rank reaches the same verdict (the backend cannot shard): report it, go on.
          times.sharded = null;
          times.shardedError = error.message;
        });
      await timed('update', () => opt.step({ gradChecked: true }));
    }
    fused.push({
      length,
      optimizer: kind,
      allreduceMs: median(times.allreduce),
      fusedMs: median(times.fused),
      shardedMs: times.sharded === null ? null : median(times.sharded),
      shardedError: times.shardedError,
      updateMs: median(times.update),
    });
    opt.dispose();
    params.dispose();
  }
  const batch = options.batch;
  const x = FlatBuffer.allocate(batch * options.layers[0]);
  const labels = new Uint8Array(batch);
  const classes = options.layers[options.layers.length - 1];
  for (let i = 0; i < x.length; i++) x.array[i] = ((i * 7919 + comm.rank) % 255) / 255;
  for (let b = 0; b < batch; b++) labels[b] = (b * 3 + comm.rank) % classes;
  const model = new MLP(options.layers, { seed: 1 });
  const compute = [];
  const steps = options.parts.includes('training') ? options.steps : -5;
  for (let s = 0; s < steps + 5; s++) {
    const t0 = performance.now();
    model.forward(x, batch, model.params.weights);
    model.loss(labels);
    model.backward(model.params.grads);
    if (s >= 5) compute.push(performance.now() - t0);
  }
  const training = [];
  for (const mode of steps > 0 ? ['sync', 'sapipe-wp'] : [])
    for (const compressed of [false, true]) {
      const trainer = await DataParallelTrainer.create({
        comm,
        params: model.params,
        mode,
        optimizer: { kind: 'sgd', lr: 0.01, momentum: 0.9 },
        ...(compressed ? { compression: { kind: 'topk', density: 0.01 } } : {}),
      });
      const times = [];
      for (let s = 0; s < options.steps + 5; s++) {
        const t0 = performance.now();
        model.forward(x, batch, trainer.forwardWeights);
        model.loss(labels);
        trainer.zeroGrad();
        model.backward(trainer.grads);
        await trainer.step();
        if (s >= 5) times.push(performance.now() - t0);
      }
      await trainer.flush();
      await trainer.dispose();
      training.push({ mode, exchange: compressed ? 'top-k' : 'dense', stepMs: median(times) });
    }
  if (comm.rank === 0) process.stdout.write(`RESULT ${JSON.stringify({ exchange, fused, params: model.params.length, computeMs: median(compute) ?? 0, training })}\n`);
  await comm.barrier();
  groups.destroy();
  process.exit(0);
}
