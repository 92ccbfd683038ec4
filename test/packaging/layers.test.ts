/**
 * The layering rule of docs/DESIGN.md holds: no native backend (cpu, cuda, comm) includes another
 * backend's header, native/core includes no backend, and no lib/ module takes part in an import
 * cycle (scripts/check-layers.mjs, which also runs alone). The checker itself is checked on a
 * violation of each kind.
 */
import { execFile } from 'node:child_process';
import { mkdirSync, mkdtempSync, writeFileSync, cpSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import t from 'tap';

const run = promisify(execFile);
const script = fileURLToPath(new URL('../../scripts/check-layers.mjs', import.meta.url));

t.test('the tree keeps the layers', async (t) => {
  const { stdout } = await run(process.execPath, [script, '--json']);
  t.same(JSON.parse(stdout), []);
});

t.test('the checker finds a backend including another, and a lib import cycle', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'sapipe-layers-'));
  mkdirSync(join(dir, 'scripts'));
  cpSync(script, join(dir, 'scripts', 'check-layers.mjs'));
  for (const d of ['native/cpu', 'native/comm', 'native/core', 'native/include', 'lib/a']) mkdirSync(join(dir, d), { recursive: true });
  writeFileSync(join(dir, 'native/cpu/kernel.h'), '#pragma once\n');
  writeFileSync(join(dir, 'native/core/queue.h'), '#pragma once\n#include "../cpu/kernel.h"\n');
  writeFileSync(join(dir, 'native/comm/ring.cpp'), '#include "../cpu/kernel.h"\n#include "../core/queue.h"\n');
  writeFileSync(join(dir, 'lib/a/x.ts'), "import { y } from './y.js';\nexport const x = y;\n");
  writeFileSync(join(dir, 'lib/a/y.ts'), "import type { x } from './x.js';\nexport const y = 1 as unknown as typeof x;\n");
  writeFileSync(join(dir, 'lib/z.ts'), "export { x } from './a/x.js';\n");
  const failed = (await run(process.execPath, [join(dir, 'scripts', 'check-layers.mjs'), '--json']).catch((e: unknown) => e)) as { code: number; stdout: string };
  t.equal(failed.code, 1, 'exits 1');
  const found = JSON.parse(failed.stdout) as string[];
  t.equal(found.length, 3, found.join('\n'));
  t.ok(found.some((v) => v.startsWith('native/comm/ring.cpp:1 includes native/cpu/kernel.h')), 'a backend including another');
  t.ok(found.some((v) => v.startsWith('native/core/queue.h:2 includes native/cpu/kernel.h')), 'core including a backend');
  t.ok(found.some((v) => v === 'import cycle among lib/a/x.ts, lib/a/y.ts'), 'a type-only import still makes a cycle');
});

t.test('the checker finds the library importing an application, and an application reaching into lib/', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'sapipe-layers-'));
  mkdirSync(join(dir, 'scripts'));
  cpSync(script, join(dir, 'scripts', 'check-layers.mjs'));
  for (const d of ['native/core', 'lib/comm', 'apps/cli']) mkdirSync(join(dir, d), { recursive: true });
  writeFileSync(join(dir, 'package.json'), JSON.stringify({ name: 'sapipe', exports: { '.': './dist/index.js', './tfjs': './dist/tfjs/index.js' } }));
  writeFileSync(join(dir, 'lib/comm/x.ts'), "export const x = 1;\nexport const load = () => import('../../apps/cli/main.js');\n");
  writeFileSync(join(dir, 'apps/cli/main.ts'), "import { x } from '../../lib/comm/x.js';\nimport { y } from 'sapipe/internal';\nimport { z } from 'sapipe';\nimport { w } from 'sapipe/tfjs';\nimport { v } from './table.js';\nexport const all = [x, y, z, w, v];\n");
  writeFileSync(join(dir, 'apps/cli/table.ts'), 'export const v = 1;\n');
  const failed = (await run(process.execPath, [join(dir, 'scripts', 'check-layers.mjs'), '--json']).catch((e: unknown) => e)) as { code: number; stdout: string };
  t.equal(failed.code, 1, 'exits 1');
  const found = JSON.parse(failed.stdout) as string[];
  t.equal(found.length, 3, found.join('\n'));
  t.ok(found.some((v) => v.startsWith('lib/comm/x.ts:2 imports ../../apps/cli/main.js')), 'the library importing an application (a dynamic import)');
  t.ok(found.some((v) => v.startsWith('apps/cli/main.ts:1 imports ../../lib/comm/x.js')), 'an application reaching into lib/');
  t.ok(found.some((v) => v.startsWith("apps/cli/main.ts:2 imports sapipe/internal")), 'a subpath the package does not export');
});

// native/addon sits above core: it includes core, the C ABI and native/comm's protocols, never a
// kernel backend (native/cpu, native/cuda); and only it may use Node-API.
t.test('the checker finds the addon including a kernel backend, and Node-API below the addon', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'sapipe-layers-addon-'));
  mkdirSync(join(dir, 'scripts'));
  cpSync(script, join(dir, 'scripts', 'check-layers.mjs'));
  for (const d of ['native/addon', 'native/cpu', 'native/cuda', 'native/comm/local', 'native/core', 'native/include/sapipe', 'native/tests', 'lib'])
    mkdirSync(join(dir, d), { recursive: true });
  writeFileSync(join(dir, 'native/cpu/simd.h'), '#pragma once\n');
  writeFileSync(join(dir, 'native/cuda/launch.cuh'), '#pragma once\n');
  writeFileSync(join(dir, 'native/comm/local/local_ops.h'), '#pragma once\n');
  writeFileSync(join(dir, 'native/core/latch.h'), '#pragma once\n');
  writeFileSync(join(dir, 'native/include/sapipe/kernels.h'), '#pragma once\n');
  writeFileSync(join(dir, 'native/addon/queue.h'), '#pragma once\n#include <napi.h>\n');
  writeFileSync(
    join(dir, 'native/addon/binding.cpp'),
    '#include <napi.h>\n#include "queue.h"\n#include "../core/latch.h"\n#include "sapipe/kernels.h"\n#include "../comm/local/local_ops.h"\n' +
      '#include "../cpu/simd.h"\n#include "../cuda/launch.cuh"\n',
  );
  writeFileSync(join(dir, 'native/core/latch.cpp'), '#include "latch.h"\n#include <napi.h>\n');
  writeFileSync(join(dir, 'native/tests/check.cpp'), '#include "node_api.h"\n');
  const failed = (await run(process.execPath, [join(dir, 'scripts', 'check-layers.mjs'), '--json']).catch((e: unknown) => e)) as { code: number; stdout: string };
  t.equal(failed.code, 1, 'exits 1');
  const found = JSON.parse(failed.stdout) as string[];
  t.equal(found.length, 4, found.join('\n'));
  t.ok(found.some((v) => v.startsWith('native/addon/binding.cpp:6 includes native/cpu/simd.h')), 'the addon including the CPU backend');
  t.ok(found.some((v) => v.startsWith('native/addon/binding.cpp:7 includes native/cuda/launch.cuh')), 'the addon including the CUDA backend');
  t.ok(found.some((v) => v.startsWith('native/core/latch.cpp:2 includes napi.h')), 'core using Node-API');
  t.ok(found.some((v) => v.startsWith('native/tests/check.cpp:1 includes node_api.h')), 'a harness using Node-API');
});

// Device code sits in subfolders (native/core/device, native/addon/device): a file there belongs to
// the component of its first folder under native/, and its includes resolve from where it is.
t.test('the checker holds the device subfolders to their component', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'sapipe-layers-device-'));
  mkdirSync(join(dir, 'scripts'));
  cpSync(script, join(dir, 'scripts', 'check-layers.mjs'));
  for (const d of ['native/addon/device', 'native/core/device', 'native/cuda', 'native/comm/nccl', 'native/include/sapipe', 'lib'])
    mkdirSync(join(dir, d), { recursive: true });
  writeFileSync(join(dir, 'native/cuda/launch.cuh'), '#pragma once\n');
  writeFileSync(join(dir, 'native/comm/nccl/nccl_ops.h'), '#pragma once\n');
  writeFileSync(join(dir, 'native/include/sapipe/plugin.h'), '#pragma once\n');
  writeFileSync(join(dir, 'native/core/plugin_loader.h'), '#pragma once\n');
  writeFileSync(join(dir, 'native/addon/errors.h'), '#pragma once\n#include <napi.h>\n');
  writeFileSync(
    join(dir, 'native/core/device/cuda_plugin.h'),
    '#pragma once\n#include "../plugin_loader.h"\n#include "sapipe/plugin.h"\n#include "../../cuda/launch.cuh"\n',
  );
  writeFileSync(join(dir, 'native/core/device/device_memory.cpp'), '#include "cuda_plugin.h"\n#include <napi.h>\n');
  writeFileSync(
    join(dir, 'native/addon/device/cuda_binding.cpp'),
    '#include <napi.h>\n#include "../errors.h"\n#include "../../core/device/cuda_plugin.h"\n#include "../../comm/nccl/nccl_ops.h"\n' +
      '#include "../../cuda/launch.cuh"\n',
  );
  const failed = (await run(process.execPath, [join(dir, 'scripts', 'check-layers.mjs'), '--json']).catch((e: unknown) => e)) as { code: number; stdout: string };
  t.equal(failed.code, 1, 'exits 1');
  const found = JSON.parse(failed.stdout) as string[];
  t.equal(found.length, 3, found.join('\n'));
  t.ok(found.some((v) => v.startsWith('native/core/device/cuda_plugin.h:4 includes native/cuda/launch.cuh: native/core may include only')), 'core/device is core: no backend');
  t.ok(found.some((v) => v.startsWith('native/core/device/device_memory.cpp:2 includes napi.h')), 'core/device is below the addon: no Node-API');
  t.ok(found.some((v) => v.startsWith('native/addon/device/cuda_binding.cpp:5 includes native/cuda/launch.cuh: native/addon may include only')), 'addon/device is the addon: no kernel backend');
});
