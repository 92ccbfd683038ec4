// What the experiment scripts share: splitting their own options from `sapipe demo`'s (after
// `--`), and running the built CLI's demo with --json in a scratch folder.
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const bin = fileURLToPath(new URL('../../bin/sapipe.js', import.meta.url));

/** `[own options..., '--', demo options...]` -> { own, demoArgs }; `reserved` demo options are refused. */
export function splitArgs(argv, reserved) {
  const split = argv.indexOf('--');
  const own = split < 0 ? argv : argv.slice(0, split);
  const demoArgs = split < 0 ? [] : argv.slice(split + 1);
  for (const f of reserved) if (demoArgs.includes(f)) throw new Error(`the script sets ${f} itself; leave it out of the demo's options`);
  return { own, demoArgs };
}

/** Calls `fn(demo)`, where `demo(args)` runs `sapipe demo ...args --json` and returns its parsed result. */
export function withDemo(fn) {
  const dir = mkdtempSync(join(tmpdir(), 'sapipe-exp-'));
  try {
    return fn((args) =>
      JSON.parse(
        execFileSync(process.execPath, [bin, 'demo', ...args, '--json', '--report', join(dir, 'r.html')], {
          encoding: 'utf8',
          maxBuffer: 1 << 24,
          stdio: ['ignore', 'pipe', 'inherit'],
        }),
      ),
    );
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** Runs `main`, printing an error's message (not its stack) and exiting non-zero on failure. */
export function runScript(main) {
  try {
    main();
  } catch (error) {
    console.error(error instanceof Error ? error.message : String(error));
    process.exitCode = 1;
  }
}
