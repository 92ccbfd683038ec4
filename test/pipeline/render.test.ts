import t from 'tap';

import { avgpipe, oneFOneB, renderAscii, renderHtml, renderSvg, sapipe, simulateSchedule, summarize, zbH1 } from '../../lib/pipeline/index.js';

t.test('text timeline: one row per stage, passes labelled, idle dotted, figures below', async (t) => {
  const r = simulateSchedule(oneFOneB({ stages: 4, microBatches: 8 }), { forward: 1, backward: 2 });
  const text = renderAscii(r);
  const lines = text.split('\n');
  t.equal(lines[0], '1f1b (S=4 M=8)');
  t.match(lines[1]!, /^stage  0 \|F0 F1 F2 F3 \.+B0=+F4 /);
  t.match(lines[4]!, /^stage  3 \|\.{9}F0 B0=+F1 /);
  t.match(text, /makespan:\s+33/);
  t.match(text, /bubble fraction: 0\.2727/);
  t.match(text, /legend: F forward, B backward/);
  // every row spans the makespan at 3 characters per unit
  for (const line of lines.slice(1, 5)) t.equal(line.length, 'stage  0 |'.length + 33 * 3 + 1);
  const multi = renderAscii(simulateSchedule(avgpipe({ stages: 2, microBatches: 2, pipelines: 2 })));
  t.match(multi, /F1\.0/, 'pipelines are told apart');
  t.throws(() => renderAscii(r, { cellWidth: 1 }), { code: 'ERR_INVALID_ARGUMENT' });
  t.throws(() => renderAscii({} as never), /simulateSchedule/);
});

t.test('SVG: a rectangle per pass, hatched bubbles, legend and figures', async (t) => {
  const r = simulateSchedule(zbH1({ stages: 3, microBatches: 4 }));
  const svg = renderSvg(r);
  t.match(svg, /^<svg xmlns="http:\/\/www.w3.org\/2000\/svg"/);
  t.match(svg, /<\/svg>$/);
  t.equal((svg.match(/<title>\dF\d/g) ?? []).length, 12, 'one forward rectangle per stage and micro-batch');
  t.equal((svg.match(/<title>\dB\d/g) ?? []).length, 12);
  t.equal((svg.match(/<title>\dW\d/g) ?? []).length, 12);
  t.match(svg, /fill="url\(#idle\)"/);
  for (const word of ['forward', 'backward', 'weight gradient', 'optimizer step', 'idle (bubble)', 'micro-batch:']) t.match(svg, word);
  t.match(svg, /bubble fraction 0\.\d+/);
  t.notMatch(svg, /NaN|undefined/);
  const reduce = renderSvg(simulateSchedule(sapipe({ stages: 2, microBatches: 3 }), { allReduce: 1 }));
  t.match(reduce, /#2b6cb0/, 'all-reduces are drawn');
  t.throws(() => renderSvg(r, { scale: -1 }), { code: 'ERR_INVALID_ARGUMENT' });
});

t.test('HTML wraps the SVG in a page', async (t) => {
  const html = renderHtml(simulateSchedule(oneFOneB({ stages: 2, microBatches: 2 })), { title: 'a <small> one' });
  t.match(html, /^<!doctype html>/);
  t.match(html, /<title>a &lt;small&gt; one<\/title>/);
  t.match(html, /<svg /);
});

t.test('summarize lists the per-stage analysis', async (t) => {
  const lines = summarize(simulateSchedule(oneFOneB({ stages: 2, microBatches: 3 }), { weightBytes: 8 }));
  t.match(lines.join('\n'), /peak-memory-bytes/);
  t.equal(lines.length, 4 + 2);
});
