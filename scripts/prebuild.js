#!/usr/bin/env node
/**
 * `npm run prebuild`: copies the built addon (and any plugin libraries built beside it) into
 * prebuilds/<platform>-<arch>/, where node-gyp-build finds them in an installed package, so that
 * `npm pack` ships binaries and installs need no compiler.
 *
 * npm also runs this before every `npm run build` (a `pre` hook of `build`), so when a build
 * exists it only copies: it never recompiles behind the caller's back. It compiles (through
 * cmake-js, the full build that also makes the plugins) only when no addon has been built at all.
 */
import { spawnSync } from 'node:child_process';
import { copyFileSync, existsSync, mkdirSync, readdirSync, renameSync, rmSync, statSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const release = path.join(root, 'build', 'Release');
const addon = path.join(release, 'sapipe.node');
const target = path.join(root, 'prebuilds', `${process.platform}-${process.arch}`);

// node-gyp-build tags: `node.napi` = any Node.js with Node-API 8 (the addon's NAPI_VERSION),
// `glibc` = not for musl (Alpine), which then builds from source instead of failing to load.
export const PREBUILT_ADDON_NAME = 'node.napi.glibc.node';

// Sources of the addon; a binary older than any of them is stale.
const sourceDirs = ['native/include', 'native/core', 'native/cpu', 'native/comm', 'native/addon'];

function log(message) {
  console.log(`[sapipe prebuild] ${message}`);
}

function newestSource() {
  let newest = { file: '', mtimeMs: 0 };
  const visit = (dir) => {
    if (!existsSync(dir)) return;
    for (const entry of readdirSync(dir, { withFileTypes: true })) {
      const file = path.join(dir, entry.name);
      if (entry.isDirectory()) visit(file);
      else {
        const { mtimeMs } = statSync(file);
        if (mtimeMs > newest.mtimeMs) newest = { file, mtimeMs };
      }
    }
  };
  for (const dir of sourceDirs) visit(path.join(root, dir));
  return newest;
}

function buildWithCmakeJs() {
  log('no build/Release/sapipe.node yet: building the native tree with cmake-js (npm run build:native)');
  const cmakeJs = path.join(root, 'node_modules', 'cmake-js', 'bin', 'cmake-js');
  const result = spawnSync(process.execPath, [cmakeJs, 'compile', '--out', 'build'], { cwd: root, stdio: 'inherit' });
  if (result.status !== 0) {
    console.error('[sapipe prebuild] the native build failed; it needs CMake >= 3.18 and a C++17 compiler (g++ >= 9)');
    process.exit(result.status ?? 1);
  }
}

/** Copies src to dst through a temporary name, so a reader never sees half a binary; strips symbols when it can. */
function install(src, dst) {
  const tmp = `${dst}.tmp-${process.pid}`;
  copyFileSync(src, tmp);
  // Symbols are only for debugging; dropping them halves the binary. `strip` ships with binutils
  // beside the compiler; without it the binary is copied as it is.
  spawnSync('strip', ['--strip-unneeded', tmp], { stdio: 'ignore' });
  renameSync(tmp, dst);
}

function main() {
  if (!existsSync(addon)) buildWithCmakeJs();
  const built = statSync(addon).mtimeMs;
  const newest = newestSource();
  if (newest.mtimeMs > built)
    log(`warning: ${path.relative(root, newest.file)} is newer than build/Release/sapipe.node; run \`npm run build:native\` first to ship it`);

  mkdirSync(target, { recursive: true });
  install(addon, path.join(target, PREBUILT_ADDON_NAME));
  // Plugins are shared libraries that the addon dlopens from its own folder.
  const plugins = readdirSync(release).filter((f) => /\.so(\.\d+)*$/.test(f));
  for (const plugin of plugins) install(path.join(release, plugin), path.join(target, plugin));
  // A plugin that is no longer built must not linger in the package. Removed after the copies
  // (not by emptying the folder first) so that a concurrent `npm pack` never sees it empty.
  const shipped = new Set([PREBUILT_ADDON_NAME, ...plugins]);
  for (const stale of readdirSync(target).filter((f) => !shipped.has(f))) rmSync(path.join(target, stale), { force: true });
  const files = readdirSync(target).map((f) => `${f} (${statSync(path.join(target, f)).size} B)`);
  log(`${path.relative(root, target)}: ${files.join(', ')}`);
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) main();
