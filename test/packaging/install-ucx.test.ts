/**
 * `npm install` in a checkout builds the UCX plugin beside the addon when UCX's development files
 * are installed (it once left the ucx backend unavailable until `npm run build:native`): the
 * install script, run in a copy of the checkout's relevant files, compiles sapipe_ucx.so there.
 * Where UCX is not installed, the install says so and how to get it (.ci/run installs libucx-dev,
 * so CI runs the build path).
 */
import { execFile, spawnSync } from 'node:child_process';
import { cpSync, existsSync, mkdirSync, mkdtempSync, rmSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import t from 'tap';

const run = promisify(execFile);
const root = fileURLToPath(new URL('../..', import.meta.url));

t.test('the install builds the UCX plugin beside the addon when UCX is installed', async (t) => {
  const work = mkdtempSync(path.join(tmpdir(), 'sapipe-install-ucx-'));
  t.teardown(() => rmSync(work, { recursive: true, force: true }));
  for (const part of ['scripts/install.js', 'native/include', 'native/comm/ucx/ucx_transport.cpp', 'package.json'])
    cpSync(path.join(root, part), path.join(work, part), { recursive: true });
  mkdirSync(path.join(work, 'build', 'Release'), { recursive: true });
  cpSync(path.join(root, 'build', 'Release', 'sapipe.node'), path.join(work, 'build', 'Release', 'sapipe.node'));
  mkdirSync(path.join(work, 'node_modules'));
  symlinkSync(path.join(root, 'node_modules', 'node-gyp-build'), path.join(work, 'node_modules', 'node-gyp-build'));

  const { stdout } = await run(process.execPath, ['scripts/install.js'], { cwd: work, timeout: 120_000 });
  t.match(stdout, /using build\/Release\/sapipe\.node/, 'the addon in place is used');
  const plugin = path.join(work, 'build', 'Release', 'sapipe_ucx.so');
  const ucx = spawnSync('pkg-config', ['--exists', 'ucx']).status === 0;
  if (!ucx) {
    t.match(stdout, /UCX not found .*apt-get install libucx-dev/, 'without UCX: says how to get the ucx backend');
    t.notOk(existsSync(plugin));
    return;
  }
  t.match(stdout, /building the UCX plugin/);
  t.ok(existsSync(plugin), 'sapipe_ucx.so is beside the addon');
  const symbols = spawnSync('nm', ['-D', '--defined-only', plugin], { encoding: 'utf8' }).stdout;
  t.match(symbols, /sapipe_plugin_entry/, 'and exports the plugin entry');
  const again = await run(process.execPath, ['scripts/install.js'], { cwd: work, timeout: 60_000 });
  t.notMatch(again.stdout, /building the UCX plugin/, 'a second install keeps the plugin');
});
