/**
 * Lists kept in more than one language stay one list: the update configuration's fields (the C
 * ABI struct in native/include/sapipe/kernels.h, what native/addon/update_binding.* reads, and
 * NativeUpdateConfig in lib/native.ts), the update buffers likewise, and the kernel variants
 * (native/tests/variants.cpp, printed by the C++ harness, against apps/bench/kernel-variants.ts). A field
 * or a variant added on one side only fails here.
 */
import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import t from 'tap';

import { KERNEL_VARIANTS } from '../../dist/apps/bench/kernel-variants.js';

const root = fileURLToPath(new URL('../..', import.meta.url));
const read = (path: string): string => readFileSync(`${root}/${path}`, 'utf8');
const camel = (snake: string): string => snake.replace(/_([a-z])/g, (_, c: string) => c.toUpperCase());

/** Field names of a C struct typedef in kernels.h. */
function cStructFields(name: string): string[] {
  const header = read('native/include/sapipe/kernels.h');
  const body = new RegExp(`typedef struct ${name} \\{([\\s\\S]*?)\\} ${name};`).exec(header)?.[1] ?? '';
  return [...body.replace(/\/\*[\s\S]*?\*\//g, '').matchAll(/^\s*[\w ]+?[\s*]+(\w+);/gm)].map((m) => m[1]!);
}

/** Keys of a TypeScript interface in lib/native.ts. */
function tsInterfaceKeys(name: string): string[] {
  const source = read('lib/native.ts');
  const body = new RegExp(`export interface ${name} \\{([\\s\\S]*?)\\n\\}`).exec(source)?.[1] ?? '';
  return [...body.replace(/\/\*\*[\s\S]*?\*\//g, '').matchAll(/^\s*(\w+)\??:/gm)].map((m) => m[1]!);
}

t.test('the update configuration: C struct, binding and TypeScript name the same fields', async (t) => {
  const fields = cStructFields('sapipe_update_config');
  t.ok(fields.length >= 20, `${fields.length} fields in sapipe_update_config`);
  const binding = read('native/addon/update_binding.cpp');
  const parsed = new Map([...binding.matchAll(/cfg\.(\w+) = [^;]*?"(\w+)"/g)].map((m) => [m[1]!, m[2]!]));
  t.same([...parsed.keys()].sort(), [...fields].sort(), 'the binding sets every field of the struct, and only those');
  for (const [field, key] of parsed) t.equal(key, camel(field), `${field} is read from "${camel(field)}"`);
  t.same(tsInterfaceKeys('NativeUpdateConfig').sort(), fields.map(camel).sort(), 'NativeUpdateConfig has a key per field');
});

t.test('the update buffers: C struct, binding and TypeScript name the same buffers', async (t) => {
  const fields = cStructFields('sapipe_update_buffers');
  const binding = read('native/addon/update_binding.h') + read('native/addon/update_binding.cpp');
  const read_ = new Set([...binding.matchAll(/(?:optional|get_index)\((?:b, )?"(\w+)"/g)].map((m) => m[1]!));
  for (const m of binding.matchAll(/b\.Get\("(\w+)"\)/g)) read_.add(m[1]!);
  const expected = fields.map((f) => (f === 'weights' ? 'weights' : camel(f)));
  t.same([...read_].sort(), [...expected].sort(), 'the binding reads every buffer of the struct, and only those');
  t.same(tsInterfaceKeys('NativeUpdateBuffers').sort(), [...expected].sort(), 'NativeUpdateBuffers has a key per buffer');
});

t.test('the kernel variants: the C++ harness and apps/bench/kernel-variants.ts hold one list', async (t) => {
  const binary = `${root}/build/Release/sapipe_cpu_check`;
  const { stdout } = await promisify(execFile)(binary, ['--list-variants']);
  const native = stdout.trim().split('\n').map((line) => JSON.parse(line) as Record<string, number | boolean | string>);
  t.same(native.map((v) => v.name), KERNEL_VARIANTS.map((v) => v.name), 'same names, same order');
  const defaults = { weightDecay: 0, momentum: 0, dampening: 0, nesterov: false, spikeDelay: -1, gradScale: 1, compensation: 0, prediction: 0, compensateEstimate: false, predictionSteps: 0 };
  for (const v of KERNEL_VARIANTS) {
    const n = native.find((x) => x.name === v.name);
    if (!n) continue;
    const c = { ...defaults, ...v.config } as Record<string, number | boolean>;
    const close = (a: unknown, b: unknown): boolean => (typeof a === 'number' && typeof b === 'number' ? Math.abs(a - b) <= 1e-6 * Math.max(1, Math.abs(b)) : a === b);
    const keys = ['optimizer', 'lr', 'weightDecay', 'momentum', 'dampening', 'nesterov', 'spikeDelay', 'gradScale', 'compensation', 'prediction', 'compensateEstimate', 'predictionSteps'];
    if (c.compensation !== 0) keys.push('compensationLambda');
    if (c.prediction === 1) keys.push('estimate', 'worldSize');
    const differing = keys.filter((k) => !close(n[k], c[k]));
    t.same(differing, [], `${v.name}: the same settings`);
  }
});
