/**
 * binding.gyp (the source-install fallback) and CMakeLists.txt (the full build) must compile the
 * same addon sources, and every C++ source of the addon must be in both.
 */
import { readFileSync, readdirSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import t from 'tap';

const root = fileURLToPath(new URL('..', import.meta.url));

function gypSources(): string[] {
  const gyp = JSON.parse(readFileSync(`${root}/binding.gyp`, 'utf8')) as { targets: { target_name: string; sources: string[] }[] };
  const addon = gyp.targets.find((target) => target.target_name === 'sapipe');
  if (!addon) throw new Error('binding.gyp has no sapipe target');
  return [...addon.sources].sort();
}

function cmakeSources(): string[] {
  const text = readFileSync(`${root}/CMakeLists.txt`, 'utf8');
  const match = /set\(SAPIPE_ADDON_SOURCES\s+([^)]*)\)/.exec(text);
  if (!match) throw new Error('CMakeLists.txt has no SAPIPE_ADDON_SOURCES');
  return match[1]!.split(/\s+/).filter(Boolean).sort();
}

t.test('binding.gyp and CMakeLists.txt list the same addon sources', async (t) => {
  t.same(gypSources(), cmakeSources());
});

// Backend-neutral code the addon does not use: the NCCL and cuBLAS loaders (and the dlopen helpers
// they share) serve the CUDA plugin and the C++ harness that checks their failure paths; the
// addon never opens NCCL or cuBLAS itself.
// The UCX plugin's transport (native/comm/ucx/ucx_transport.cpp) links UCX and is a plugin of its own.
const NOT_IN_ADDON = new Set(['native/core/device/nccl_loader.cpp', 'native/core/device/cublas_loader.cpp', 'native/core/device/dl_library.cpp', 'native/comm/ucx/ucx_transport.cpp']);

// Every .cpp under a folder and its subfolders (core/device, addon/device, comm/local, ...).
const cppUnder = (dir: string): string[] =>
  readdirSync(`${root}/${dir}`, { withFileTypes: true }).flatMap((e) =>
    e.isDirectory() ? cppUnder(`${dir}/${e.name}`) : e.name.endsWith('.cpp') ? [`${dir}/${e.name}`] : [],
  );

t.test('every .cpp of the addon, core and CPU backend is built', async (t) => {
  const onDisk = ['native/addon', 'native/core', 'native/cpu', 'native/comm']
    .flatMap(cppUnder)
    .filter((f) => !NOT_IN_ADDON.has(f))
    .sort();
  t.same(cmakeSources(), onDisk);
});
