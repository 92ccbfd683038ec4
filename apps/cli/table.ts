/**
 * The CLI's tables: one look everywhere. Rows are not ruled off from each other (a rule between
 * every row doubles a table's height and hides its columns); on a terminal the header is bold
 * (cli-table3's default red reads as an error), and piped output has no colour codes.
 */
import Table from 'cli-table3';

const NO_ROW_RULES = { mid: '', 'left-mid': '', 'mid-mid': '', 'right-mid': '' };

export function cliTable(head: string[], plain = !process.stdout.isTTY): Table.Table {
  return new Table({ head, chars: NO_ROW_RULES, style: plain ? { head: [], border: [] } : { head: ['bold'], border: [] } });
}
