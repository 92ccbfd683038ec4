#!/usr/bin/env node
/**
 * The package's `install` step. It replaces a bare `node-gyp-build` so that a user sees what is
 * happening and what to install when it goes wrong:
 *   1. load the addon node-gyp-build resolves (build/Release, else prebuilds/<platform>-<arch>/)
 *      in a child process, so a corrupt or incompatible binary cannot take the install down;
 *   2. if none loads, build the CPU addon from source with node-gyp (binding.gyp), then load it;
 *   3. if that fails, say which tools are missing and exit non-zero.
 * `npm install --build-from-source` (or SAPIPE_BUILD_FROM_SOURCE=1) skips step 1.
 * Only Node.js built-ins and runtime dependencies are used: this runs on users' machines.
 */
import { spawnSync } from 'node:child_process';
import { accessSync, constants, existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const require = createRequire(import.meta.url);
const target = `${process.platform}-${process.arch}, Node.js ${process.version}`;

function log(message) {
  console.log(`[sapipe install] ${message}`);
}

/** Resolves and loads the addon in a child process; returns the file it loaded or why it could not. */
function probeAddon() {
  const script = `
    try {
      const file = require(process.argv[1]).resolve(process.argv[2]);
      const addon = require(file);
      if (typeof addon.info !== 'function') throw new Error(file + ' is not the sapipe addon');
      addon.info();
      process.stdout.write(file);
    } catch (error) {
      process.stderr.write(String(error && error.message ? error.message : error).split('\\n')[0]);
      process.exit(1);
    }`;
  const result = spawnSync(process.execPath, ['-e', script, require.resolve('node-gyp-build'), root], { encoding: 'utf8' });
  if (result.status === 0) return { file: result.stdout };
  return { reason: result.signal ? `loading it killed the process (${result.signal})` : result.stderr.trim() };
}

function onPath(tool) {
  for (const dir of (process.env.PATH ?? '').split(path.delimiter)) {
    if (!dir) continue;
    try {
      accessSync(path.join(dir, tool), constants.X_OK);
      return true;
    } catch {
      // not in this directory
    }
  }
  return false;
}

/** node-gyp: npm's own (npm tells scripts where it is), else a local one, else the PATH's. */
function nodeGypCommand() {
  const candidates = [process.env.npm_config_node_gyp];
  try {
    candidates.push(require.resolve('node-gyp/bin/node-gyp.js'));
  } catch {
    // not installed beside us
  }
  const script = candidates.find((file) => file && existsSync(file));
  return script ? [process.execPath, [script]] : ['node-gyp', []];
}

function buildFromSource() {
  const [command, prefix] = nodeGypCommand();
  const args = [...prefix, 'rebuild', '--jobs=max'];
  // node-gyp downloads Node.js headers unless told where they are; most Node.js installs carry
  // them in <prefix>/include/node, which keeps a source build working offline.
  const headersPrefix = path.resolve(path.dirname(process.execPath), '..');
  if (!process.env.npm_config_nodedir && existsSync(path.join(headersPrefix, 'include', 'node', 'node_api.h')))
    args.push(`--nodedir=${headersPrefix}`);
  log(`building the CPU addon from source: node-gyp ${args.slice(prefix.length).join(' ')} (about a minute)`);
  const result = spawnSync(command, args, { cwd: root, stdio: 'inherit' });
  return result.status === 0 && !result.error;
}

/**
 * The UCX plugin (sapipe_ucx.so, the ucx communication backend) beside the addon that loaded, when
 * UCX's development files are installed and no plugin is there yet: one C++ file against
 * `pkg-config ucx`, a few seconds. Never fails the install: without UCX the ucx backend stays
 * unavailable, and `sapipe info` and the backend's error say how to get it.
 */
function buildUcxPlugin(addonFile) {
  const dir = path.dirname(addonFile);
  const plugin = path.join(dir, 'sapipe_ucx.so');
  if (existsSync(plugin)) return;
  if (process.platform !== 'linux') return;
  const flags = spawnSync('pkg-config', ['--cflags', '--libs', 'ucx'], { encoding: 'utf8' });
  if (flags.status !== 0 || flags.error) {
    log('UCX not found (pkg-config ucx): the ucx backend is not built; `apt-get install libucx-dev` and reinstall (or `npm run build:native`) to add it');
    return;
  }
  const compiler = ['c++', 'g++', 'clang++'].find(onPath);
  if (!compiler) {
    log('UCX is installed but no C++ compiler is on PATH: the ucx backend is not built');
    return;
  }
  const source = path.join(root, 'native', 'comm', 'ucx', 'ucx_transport.cpp');
  if (!existsSync(source)) return;
  const args = ['-std=c++17', '-O3', '-Wall', '-Wextra', '-fPIC', '-shared', '-fvisibility=hidden', `-I${path.join(root, 'native', 'include')}`, source,
    ...flags.stdout.trim().split(/\s+/).filter(Boolean), '-pthread', '-Wl,--no-undefined', '-o', plugin];
  log(`building the UCX plugin (the ucx backend) against the installed UCX: ${compiler} ... -o ${path.relative(root, plugin)}`);
  const result = spawnSync(compiler, args, { cwd: root, stdio: 'inherit' });
  if (result.status !== 0 || result.error) log('the UCX plugin did not build (messages above); the ucx backend stays unavailable until `npm run build:native` succeeds');
}

function explainFailure() {
  const missing = ['python3', 'make'].filter((tool) => !onPath(tool));
  if (!onPath('g++') && !onPath('c++') && !onPath('clang++')) missing.push('a C++17 compiler (g++ >= 9 or clang++ >= 10)');
  console.error('[sapipe install] the source build of the sapipe addon failed.');
  console.error('[sapipe install] it needs python3, make and a C++17 compiler (g++ >= 9 or clang++ >= 10);');
  console.error('[sapipe install] on Debian/Ubuntu: apt-get install python3 make g++');
  if (missing.length > 0) console.error(`[sapipe install] not found on PATH: ${missing.join(', ')}`);
  console.error('[sapipe install] the messages above say what else went wrong.');
}

function main() {
  const fromSource = process.env.npm_config_build_from_source === 'true' || process.env.SAPIPE_BUILD_FROM_SOURCE === '1';
  if (!fromSource) {
    const probe = probeAddon();
    if (probe.file) {
      const prebuilt = path.relative(root, probe.file).startsWith('prebuilds');
      log(`using ${path.relative(root, probe.file)}${prebuilt ? ' (prebuilt: no compiler needed)' : ''}`);
      buildUcxPlugin(probe.file);
      return;
    }
    log(`no usable prebuilt binary for ${target}: ${probe.reason}`);
  } else {
    log('building from source as requested');
  }
  if (!buildFromSource()) {
    explainFailure();
    process.exit(1);
  }
  const probe = probeAddon();
  if (!probe.file) {
    console.error(`[sapipe install] the addon was built but does not load: ${probe.reason}`);
    process.exit(1);
  }
  log(`built and loaded ${path.relative(root, probe.file)}`);
  buildUcxPlugin(probe.file);
}

main();
