/**
 * The demo's HTML report: one self-contained file (inline SVG and CSS, no scripts or external
 * assets, so it opens anywhere offline) with the configuration, test accuracy per epoch for each
 * mode, and each mode's mean step split into compute and exposed communication.
 */
import { DEMO_DATASETS } from './models.js';
import { deviceWaitNote, speedupNote, type DemoResult } from './run-demo.js';

const COLORS = ['#1f77b4', '#d62728', '#2ca02c', '#9467bd', '#ff7f0e', '#8c564b'];

function esc(s: string): string {
  return s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;');
}

function accuracyChart(result: DemoResult): string {
  const W = 640, H = 320, L = 56, R = 150, T = 16, B = 40;
  const epochs = result.config.epochs;
  const all = result.modes.flatMap((m) => m.epochAccuracy);
  // Zoom on the range the curves use so differences between modes stay visible.
  const lo = Math.max(0, Math.floor((Math.min(...all) - 0.02) * 20) / 20);
  const hi = 1;
  const x = (e: number): number => L + (epochs === 1 ? (W - L - R) / 2 : ((e - 1) / (epochs - 1)) * (W - L - R));
  const y = (a: number): number => T + (1 - (a - lo) / (hi - lo)) * (H - T - B);
  const parts: string[] = [];
  for (let k = 0; k <= 4; k++) {
    const a = lo + ((hi - lo) * k) / 4;
    parts.push(`<line x1="${L}" x2="${W - R}" y1="${y(a)}" y2="${y(a)}" stroke="#ddd"/><text x="${L - 6}" y="${y(a) + 4}" text-anchor="end">${(a * 100).toFixed(1)}%</text>`);
  }
  for (let e = 1; e <= epochs; e++) parts.push(`<text x="${x(e)}" y="${H - B + 16}" text-anchor="middle">${e}</text>`);
  parts.push(`<text x="${(L + W - R) / 2}" y="${H - 6}" text-anchor="middle">epoch</text>`);
  result.modes.forEach((m, i) => {
    const c = COLORS[i % COLORS.length]!;
    const pts = m.epochAccuracy.map((a, e) => `${x(e + 1).toFixed(1)},${y(a).toFixed(1)}`);
    parts.push(`<polyline fill="none" stroke="${c}" stroke-width="2" points="${pts.join(' ')}"/>`);
    for (const p of pts) parts.push(`<circle cx="${p.split(',')[0]}" cy="${p.split(',')[1]}" r="3" fill="${c}"/>`);
    parts.push(`<rect x="${W - R + 12}" y="${T + i * 20}" width="12" height="12" fill="${c}"/><text x="${W - R + 30}" y="${T + i * 20 + 11}">${esc(m.mode)}</text>`);
  });
  return `<svg class="accuracy" xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" font-size="12" font-family="sans-serif">${parts.join('')}</svg>`;
}

function stepChart(result: DemoResult): string {
  const W = 640, L = 90, R = 150, T = 10, row = 30;
  const H = T + row * result.modes.length + 30;
  const max = Math.max(...result.modes.map((m) => m.stepMs.compute + m.stepMs.comm), 1e-9);
  const sx = (ms: number): number => (ms / max) * (W - L - R);
  const parts: string[] = [];
  result.modes.forEach((m, i) => {
    const yy = T + i * row;
    const wc = sx(m.stepMs.compute);
    parts.push(
      `<text x="${L - 6}" y="${yy + 16}" text-anchor="end">${esc(m.mode)}</text>` +
        `<rect class="compute" x="${L}" y="${yy + 4}" width="${wc.toFixed(1)}" height="18" fill="#4c78a8"/>` +
        `<rect class="comm" x="${(L + wc).toFixed(1)}" y="${yy + 4}" width="${sx(m.stepMs.comm).toFixed(1)}" height="18" fill="#e45756"/>` +
        `<text x="${(L + wc + sx(m.stepMs.comm) + 6).toFixed(1)}" y="${yy + 16}">${(m.stepMs.compute + m.stepMs.comm).toFixed(2)} ms</text>`,
    );
  });
  const ly = T + row * result.modes.length + 8;
  // The second swatch starts after the first label: about 7 px a character at 12 px sans-serif.
  const firstLabel = 'compute (forward, backward, update)';
  const second = L + 18 + Math.ceil(firstLabel.length * 7) + 24;
  parts.push(`<rect x="${L}" y="${ly}" width="12" height="12" fill="#4c78a8"/><text x="${L + 18}" y="${ly + 11}">${firstLabel}</text>`);
  parts.push(`<rect x="${second}" y="${ly}" width="12" height="12" fill="#e45756"/><text x="${second + 18}" y="${ly + 11}">exposed communication</text>`);
  return `<svg class="steps" xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" font-size="12" font-family="sans-serif">${parts.join('')}</svg>`;
}

export function renderDemoReport(result: DemoResult, generatedAt = new Date()): string {
  const c = result.config;
  const onGpu = c.device.kind === 'cuda';
  const network = onGpu ? `NCCL between ${c.device.ranks.join(', ')}` : c.emulate ? `emulated network: ${c.emulate.gbps} Gbit/s, ${c.emulate.latencyUs ?? 0} µs latency` : 'local shared memory (no network emulation)';
  const configRows: [string, string][] = [
    ['model', `${c.description}, SGD momentum ${c.momentum}`],
    ['device', `${onGpu ? c.device.ranks.map((d, r) => `worker ${r} on ${d}`).join(', ') : 'cpu (every worker a thread)'} (${c.device.reason})`],
    ['data', `${c.trainSamples} training, ${c.testSamples} test samples (seed ${c.seed})`],
    ['workers', String(c.workers)],
    ['epochs', String(c.epochs)],
    ['batch per worker', String(c.batch)],
    ['learning rate', String(c.lr)],
    ...(c.lambda === undefined ? [] : [['delay-compensation lambda', String(c.lambda)] as [string, string]]),
    ...(c.dcKind === undefined ? [] : [['delay-compensation form', c.dcKind] as [string, string]]),
    ...(c.overlap === false ? [['staleness-1 update', 'at the next step() (--no-overlap)'] as [string, string]] : []),
    ...(c.topk ? [['gradient exchange', `top-k, density ${c.topk.density}, ${c.topk.errorFeedback ? 'with' : 'without'} error feedback (--topk)`] as [string, string]] : []),
    ['modes', c.modes.map((m) => (m.mode === 'sapipe-wp' && m.label === 'sapipe-wp' ? `sapipe-wp (estimate ${m.estimate})` : m.label)).join(', ')],
    ['communication', network],
  ];
  const rows = result.modes
    .map(
      (m) =>
        `<tr><td>${esc(m.mode)}</td><td>${(m.finalAccuracy * 100).toFixed(2)}%</td><td>${(m.wallMs / 1000).toFixed(2)} s</td><td>${m.samplesPerSec.toFixed(0)}</td>` +
        `<td>${m.speedup === undefined ? '-' : m.speedup.toFixed(2) + 'x'}</td><td>${(m.exposedCommMs / 1000).toFixed(2)} s</td></tr>`,
    )
    .join('');
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>sapipe demo report</title>
<style>body{font-family:sans-serif;max-width:900px;margin:2em auto;color:#222}table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 10px;text-align:left}h2{margin-top:1.6em}</style>
</head><body>
<h1>sapipe demo: data-parallel ${esc(DEMO_DATASETS[c.model ?? 'mlp'])}</h1>
<p>Generated ${esc(generatedAt.toISOString())}. Device: ${esc(onGpu ? c.device.ranks.join(', ') : 'cpu')}. Communication: ${esc(network)}.</p>
<h2 id="configuration">Configuration</h2>
<table>${configRows.map(([k, v]) => `<tr><th>${esc(k)}</th><td>${esc(v)}</td></tr>`).join('')}</table>
<h2 id="results">Results</h2>
<table><tr><th>mode</th><th>test accuracy</th><th>wall time</th><th>samples/s</th><th>speedup over sync</th><th>exposed communication</th></tr>${rows}</table>
<h2 id="accuracy">Test accuracy per epoch</h2>
${accuracyChart(result)}
<h2 id="step-time">Time per step: compute and exposed communication</h2>
${stepChart(result)}
<p>Exposed communication is the time step() waited for an all-reduce (the whole fused all-reduce and update in sync), per worker, averaged over the workers. ${esc([deviceWaitNote(result), speedupNote(result)].filter(Boolean).join(' '))}</p>
</body></html>
`;
}
