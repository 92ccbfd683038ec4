/**
 * The HTML report of `sapipe train pipeline`: one self-contained file (inline SVG and CSS) with
 * the configuration, loss and test accuracy per epoch, and a measured round drawn beside the
 * simulator's prediction from the measured stage costs, with the same renderer at the same scale.
 */
import { renderSvg } from 'sapipe';
import { describeModel, parallelPipelinesNote, pipelinesCoupling, type MnistPipelineResult } from './pipeline-run.js';

function esc(s: string): string {
  return s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;');
}

const pct = (x: number): string => `${(x * 100).toFixed(1)}%`;

/** The comparison rows of measured and simulated figures. */
export function pipelineComparison(r: MnistPipelineResult): [string, string, string][] {
  const m = r.measured;
  const s = r.simulated;
  return [
    ['makespan of a round (ms)', m.makespan.toFixed(2), s.makespan.toFixed(2)],
    ['bubble fraction', pct(m.bubbleFraction), pct(s.bubbleFraction)],
    ['peak stored activations per stage (micro-batches)', r.peakActivations.join(' / '), s.analysis.peakActivations.join(' / ')],
    // Counted as the schedule analysis counts them: the weights, the stashed copies and a predicted copy.
    ['weight versions per stage (current + stashed + predicted)', r.peakStashed.map((n, k) => n + 1 + (r.predictedCopies[k] ?? 0)).join(' / '), s.analysis.weightVersions.join(' / ')],
    ['peak activation memory per stage (KiB)', m.peakActivationBytes.map(kib).join(' / '), '-'],
    ['peak memory per stage (KiB, with weights, grads, state)', m.peakMemoryBytes.map(kib).join(' / '), '-'],
  ];
}

const kib = (bytes: number): string => (bytes / 1024).toFixed(0);

/** The measured round above the simulated one, one SVG at one scale (the picture the docs link). */
export function renderPipelineSvg(r: MnistPipelineResult): string {
  const c = r.config;
  const span = Math.max(r.measured.makespan, r.simulated.makespan);
  const scale = span > 0 ? 1000 / span : 1;
  const title = `${c.schedule}, ${c.stages} stages, M=${c.microBatches} x ${c.microBatchSize} samples`;
  const top = renderSvg(r.measured, { title: `measured round: ${title} (${r.measured.makespan.toFixed(1)} ms, bubble ${pct(r.measured.bubbleFraction)})`, scale });
  const bottom = renderSvg(r.simulated, { title: `simulated from the measured stage costs (${r.simulated.makespan.toFixed(1)} ms, bubble ${pct(r.simulated.bubbleFraction)})`, scale });
  const size = (svg: string): { w: number; h: number } => ({ w: Number(/width="([\d.]+)"/.exec(svg)?.[1] ?? 0), h: Number(/height="([\d.]+)"/.exec(svg)?.[1] ?? 0) });
  const a = size(top);
  const b = size(bottom);
  const w = Math.max(a.w, b.w);
  const h = a.h + b.h + 10;
  const at = (svg: string, y: number): string => svg.replace('<svg ', `<svg x="0" y="${y}" `);
  return `<svg xmlns="http://www.w3.org/2000/svg" width="${w}" height="${h}" viewBox="0 0 ${w} ${h}"><rect width="100%" height="100%" fill="white"/>${at(top, 0)}${at(bottom, a.h + 10)}</svg>\n`;
}

export function renderPipelineReport(r: MnistPipelineResult): string {
  const c = r.config;
  const span = Math.max(r.measured.makespan, r.simulated.makespan);
  const scale = span > 0 ? 1000 / span : 1;
  const title = `${c.schedule}, ${c.stages} stages, M=${c.microBatches} x ${c.microBatchSize} samples`;
  const rows = r.epochs.map((e) => `<tr><td>${e.epoch}</td><td>${e.loss.toFixed(4)}</td><td>${pct(e.accuracy)}</td><td>${(e.wallMs / 1000).toFixed(2)}</td></tr>`).join('');
  const comparison = pipelineComparison(r)
    .map(([what, measured, simulated]) => `<tr><td>${esc(what)}</td><td>${esc(measured)}</td><td>${esc(simulated)}</td></tr>`)
    .join('');
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>sapipe pipeline training: ${esc(title)}</title>
<style>body{font-family:sans-serif;max-width:1150px;margin:2em auto;color:#222}table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 10px;text-align:right}th{background:#f4f4f4}td:first-child{text-align:left}h2{margin-top:1.6em}.note{color:#555}</style>
</head><body>
<h1>Pipeline training: ${esc(title)}</h1>
<p>${esc(describeModel(c))} (${r.trainSamples} train / ${r.testSamples} test samples), cut at layers [${r.boundaries.join(', ')}]
(${esc(String(c.boundaries === 'measured' ? 'balanced by measured layer times' : c.boundaries === 'params' ? 'balanced by parameter count' : 'explicit boundaries'))}),
${esc(c.optimizer)} lr ${c.lr}${c.optimizer === 'sgd' ? ` momentum ${c.momentum}` : ''}, seed ${c.seed}; one worker thread per stage over the <code>local</code> backend${pipelinesCoupling(c) ? `; ${esc(pipelinesCoupling(c)!)} (timelines: pipeline 0)` : ''}.</p>
<h2>Training</h2>
<table><tr><th>epoch</th><th>mean loss</th><th>test accuracy</th><th>wall s</th></tr>${rows}</table>
<h2>Measured against simulated</h2>
<p class="note">The simulator is fed the per-part forward, backward and step times the runtime measured (medians over the last epoch); transfers are taken as free (threads share memory).</p>
<table><tr><th></th><th>measured</th><th>simulated</th></tr>${comparison}</table>
<p class="note">Runtime overhead (time between actions and posting sends, worst stage): ${r.overhead.perActionMs.toFixed(3)} ms per action, ${pct(r.overhead.shareOfRound)} of the round.</p>
<h3>Measured round (median wall time of the last epoch)</h3>
${renderSvg(r.measured, { title: `measured: ${title}`, scale })}
${parallelPipelinesNote(c) ? `<p class="note">${esc(parallelPipelinesNote(c)!)}</p>` : ''}
<h3>Simulated from the measured costs</h3>
${renderSvg(r.simulated, { title: `simulated: ${title}`, scale })}
</body></html>
`;
}
