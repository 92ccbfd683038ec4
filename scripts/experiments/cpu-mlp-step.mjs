// The time of one SGD-momentum training step of an MLP 784-512x6-10 at batch 256 on the CPU,
// through the public API that every version since the model-operation table shares, so that a
// build of another commit can be timed beside this one (bench/RESULTS.md, "CPU MLP step"):
//   node scripts/experiments/cpu-mlp-step.mjs <a dist/ folder> [steps]
const dist = process.argv[2];
const steps = Number(process.argv[3] ?? 40);
const { MLP, SGD } = await import(`${dist}/index.js`);
const sizes = [784, 512, 512, 512, 512, 512, 512, 10];
const batch = 256;
const model = new MLP(sizes, { seed: 1 });
const opt = new SGD(model.params, { lr: 0.01, momentum: 0.9 });
const x = Float32Array.from({ length: batch * 784 }, (_, i) => ((i * 2654435761) % 1000) / 1000);
const labels = Array.from({ length: batch }, (_, i) => i % 10);
const step = () => { model.forward(x, batch, opt.forwardWeights); model.loss(labels); model.backward(); opt.stepSync(); };
for (let i = 0; i < 5; i++) step();
const t = performance.now();
for (let i = 0; i < steps; i++) step();
console.log(`${((performance.now() - t) / steps).toFixed(2)} ms/step`);
