/**
 * The CLI's tables: on a terminal the header is bold, not cli-table3's default red (which reads as
 * an error); piped output carries no colour codes at all.
 */
import t from 'tap';

import { cliTable } from '../dist/apps/cli/table.js';

t.test('terminal tables have bold headers, piped ones plain', async (t) => {
  const style = (plain: boolean): { head: string[]; border: string[] } => (cliTable(['epoch'], plain) as unknown as { options: { style: { head: string[]; border: string[] } } }).options.style;
  t.same(style(false).head, ['bold'], 'bold on a terminal');
  t.notOk(style(false).head.includes('red'), 'never red');
  t.same(style(true).head, [], 'no colour when piped');
  t.same(style(true).border, []);
});
