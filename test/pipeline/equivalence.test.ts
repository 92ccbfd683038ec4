/**
 * The generators, validator, simulator and pictures give exactly what they gave before they were
 * rewritten to run in linear time: fixtures/equivalence.json holds the digests of 1110 cases
 * (every generator over many shapes and options, five cost models, per-part costs, text and SVG
 * pictures, hand-written schedules, and 400 randomly broken ones with the error each gets),
 * recorded from that earlier code (commit 1bbf884). Equal digests mean the same actions in the
 * same order, the same analysis, the same times to the last bit, and the same first broken action
 * named in the same words. Wavelet's data-parallel cases were re-recorded on purpose when its row
 * came to run each wave's backward before the other wave's forward (and a wave's step to wait for
 * its own wave's all-reduces only); no other case changed.
 *
 * To see what changed after an intended change, compile test/pipeline/equivalence-cases.ts and
 * call equivalenceDigests() with both builds' lib/pipeline/index.js; to re-record on purpose, write
 * its output over the fixture and say why in the commit.
 */
import { readFileSync } from 'node:fs';
import t from 'tap';

import * as pipeline from '../../lib/pipeline/index.js';
import { type PipelineApi, equivalenceDigests } from './equivalence-cases.js';

const fixture = JSON.parse(readFileSync(new URL('./fixtures/equivalence.json', import.meta.url), 'utf8')) as Record<string, Record<string, string>>;

t.test('every case gives the recorded schedule, analysis, simulation, picture or error', async (t) => {
  const now = equivalenceDigests(pipeline as unknown as PipelineApi);
  t.same(Object.keys(now).sort(), Object.keys(fixture).sort(), 'the same cases');
  let differing = 0;
  for (const [id, expected] of Object.entries(fixture)) {
    const got = now[id];
    if (JSON.stringify(got) === JSON.stringify(expected)) continue;
    differing++;
    if (differing <= 20) t.same(got, expected, id);
  }
  t.equal(differing, 0, `cases whose outcome changed (of ${Object.keys(fixture).length})`);
});
