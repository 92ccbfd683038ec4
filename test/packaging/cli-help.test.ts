/**
 * Every command and subcommand of the installed CLI explains itself: a description, described
 * options and arguments, and `--help` that prints them and exits 0. Walks the real command tree,
 * so a command added later is checked without touching this file.
 */
import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import type { Command } from 'commander';
import t from 'tap';

import { buildProgram } from '../../dist/apps/cli/main.js';

const run = promisify(execFile);
const bin = fileURLToPath(new URL('../../bin/sapipe.js', import.meta.url));

function commandPaths(command: Command, prefix: string[] = []): { path: string[]; command: Command }[] {
  return command.commands.flatMap((sub) => {
    const path = [...prefix, sub.name()];
    return [{ path, command: sub }, ...commandPaths(sub, path)];
  });
}

const program = buildProgram();
const commands = commandPaths(program);

t.test('every command, option and argument has a description', async (t) => {
  t.ok(program.description(), 'the program');
  t.ok(commands.length >= 7, `${commands.length} commands`);
  for (const { path, command } of commands) {
    const name = path.join(' ');
    t.ok(command.description().length > 10, `${name}: described`);
    const undocumented = [
      ...command.options.filter((o) => !o.description).map((o) => o.flags),
      ...command.registeredArguments.filter((a) => !a.description).map((a) => `<${a.name()}>`),
    ];
    t.same(undocumented, [], `${name}: every option and argument is described`);
  }
});

t.test('`sapipe <command> --help` prints usage, description and options, and exits 0', async (t) => {
  const top = await run(process.execPath, [bin, '--help']);
  t.match(top.stdout, /^Usage: sapipe /);
  for (const { path } of commands.filter((c) => c.path.length === 1))
    t.match(top.stdout, new RegExp(`\\n\\s+${path[0]}\\b`), `sapipe --help lists ${path[0]}`);
  for (const { path, command } of commands) {
    const { stdout } = await run(process.execPath, [bin, ...path, '--help']);
    const name = path.join(' ');
    t.match(stdout, new RegExp(`^Usage: sapipe ${name}\\b`), `${name} --help: usage line`);
    // Help wraps long lines: compare with runs of whitespace collapsed.
    const flat = (text: string) => text.replace(/\s+/g, ' ');
    t.ok(flat(stdout).includes(flat(command.description())), `${name} --help: description`);
    for (const option of command.options) t.ok(stdout.includes(option.long ?? option.flags), `${name} --help: ${option.flags}`);
  }
});
