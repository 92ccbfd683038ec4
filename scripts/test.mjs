#!/usr/bin/env node
// The test runner: `npm test` runs the fast suite (every test file but those listed in
// test/slow-tests.txt: end-to-end runs of real processes, networks and large data, which take
// minutes), `npm run test:all` runs everything (CI). Further arguments go to tap; naming test
// files runs just those.
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('..', import.meta.url));
const args = process.argv.slice(2);
const all = args[0] === '--all';
const rest = all ? args.slice(1) : args;

/** The slow files: one path per line, `#` starts a comment (each line says why it is slow). */
const slow = readFileSync(new URL('../test/slow-tests.txt', import.meta.url), 'utf8')
  .split('\n')
  .map((line) => line.replace(/#.*/, '').trim())
  .filter((line) => line !== '');

const excludes = all ? [] : slow.map((path) => `--exclude=${path}`);
const run = spawnSync('npx', ['tap', ...excludes, ...rest], { cwd: root, stdio: 'inherit' });
if (!all && run.status === 0 && rest.length === 0)
  console.log(`\nThe fast suite passed; ${slow.length} slower end-to-end files run with \`npm run test:all\` (as CI does).`);
process.exit(run.status ?? 1);
