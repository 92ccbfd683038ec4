/**
 * The two ends of a bench that runs its ranks as processes (`sapipe launch`'s way): the driver
 * launches a rank script of this folder and collects the ranks' prefixed output, and the rank
 * script runs its main only when started as a script (so the driver can import its constants).
 */
import { Writable } from 'node:stream';
import { fileURLToPath } from 'node:url';

import { launch, type LaunchOptions, type LaunchResult } from 'sapipe';

/**
 * Launches `name` (a rank script next to this file, `.ts` from the sources, `.js` from the build)
 * on this machine with `args`, and resolves with the launcher's result and everything the ranks
 * printed.
 */
export async function launchRankScript(
  name: string,
  options: Omit<LaunchOptions, 'script' | 'stdout' | 'stderr' | 'nodeArgs'>,
): Promise<{ result: LaunchResult; stdout: string; stderr: string }> {
  const fromSource = import.meta.url.endsWith('.ts');
  let stdout = '';
  let stderr = '';
  const collect = (append: (s: string) => void): Writable =>
    new Writable({
      write(chunk: Buffer, _encoding, callback): void {
        append(chunk.toString());
        callback();
      },
    });
  const result = await launch({
    ...options,
    script: fileURLToPath(new URL(`./${name}.${fromSource ? 'ts' : 'js'}`, import.meta.url)),
    // From source, the ranks need the TypeScript loader this process runs under.
    nodeArgs: fromSource ? process.execArgv : [],
    stdout: collect((s) => (stdout += s)),
    stderr: collect((s) => (stderr += s)),
  });
  return { result, stdout, stderr };
}

/** Runs `main` when the module at `moduleUrl` is the script this launched rank started with; exits 0, or 1 printing the error. */
export function runAsRankScript(moduleUrl: string, main: () => Promise<void>): void {
  if (process.env.RANK === undefined || process.argv[1] === undefined || !moduleUrl.endsWith(process.argv[1].split('/').pop() ?? '\0')) return;
  main().then(
    () => process.exit(0),
    (e: unknown) => {
      process.stderr.write(`${String((e as { code?: string }).code ?? '')} ${String(e)}\n`);
      process.exit(1);
    },
  );
}
