/**
 * A shaped multi-host network for tests: scripts/shaped-net.sh makes H network namespaces
 * ("hosts", 10.77.0.1 ... 10.77.0.H) joined by veth pairs to a bridge, each link rate-limited by
 * tbf, and runs commands on a host with its own hostname and boot id (so UCX and sapipe see
 * separate machines). Everything is torn down when the test ends, and at process exit if a test
 * died first. Needs root and network namespaces: elsewhere `unavailable` says why, and a test
 * under CI=true fails with that reason instead of skipping.
 */
import { execFileSync, spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';

const SCRIPT = fileURLToPath(new URL('../../scripts/shaped-net.sh', import.meta.url));

export interface ShapedNetwork {
  readonly prefix: string;
  /** Host i's address (10.77.0.i+1). */
  address(host: number): string;
  /** Runs `command` on host `host` (`onStdout` sees its output as it comes); resolves with its exit code and output. */
  run(host: number, command: string[], env?: Record<string, string>, onStdout?: (text: string) => void): Promise<{ code: number | null; stdout: string; stderr: string }>;
  /** A counter of host `host`'s interface (`lo` or `eth0`), e.g. tx_bytes. */
  counter(host: number, device: 'lo' | 'eth0', name: 'tx_bytes' | 'rx_bytes'): number;
  /** Kills everything host `host` runs and deletes its namespace (its link goes with it). */
  tearDownHost(host: number): void;
  /** Removes every namespace of the network; safe to call twice. */
  down(): void;
}

/** Why shaped networks cannot be made here, or undefined when they can. */
export function shapedNetworkUnavailable(): string | undefined {
  if (process.platform !== 'linux') return 'network namespaces need Linux';
  if (process.getuid?.() !== 0) return 'network namespaces need root';
  const probe = `sapprobe${process.pid}`;
  try {
    execFileSync('ip', ['netns', 'add', probe], { stdio: 'pipe' });
    execFileSync('ip', ['netns', 'del', probe], { stdio: 'pipe' });
    execFileSync('tc', ['-V'], { stdio: 'pipe' });
    return undefined;
  } catch (error) {
    return `cannot create a network namespace or find tc: ${(error as Error).message.split('\n')[0]}`;
  }
}

let serial = 0;

/** Makes `hosts` hosts whose links carry `rate` (a tbf rate such as `1gbit`) each way. */
export function createShapedNetwork(hosts: number, rate: string): ShapedNetwork {
  const prefix = `sap${process.pid % 100000}n${serial++}`;
  const down = (): void => {
    try {
      execFileSync(SCRIPT, ['down', prefix], { stdio: 'pipe' });
    } catch {
      // Nothing left to remove.
    }
  };
  process.once('exit', down);
  try {
    execFileSync(SCRIPT, ['up', prefix, String(hosts), rate], { stdio: 'pipe' });
  } catch (error) {
    down();
    throw error;
  }
  return {
    prefix,
    address: (host) => `10.77.0.${host + 1}`,
    run: (host, command, env = {}, onStdout) =>
      new Promise((resolve) => {
        const child = spawn(SCRIPT, ['exec', prefix, String(host), 'env', ...Object.entries(env).map(([k, v]) => `${k}=${v}`), ...command], { stdio: ['ignore', 'pipe', 'pipe'] });
        let stdout = '';
        let stderr = '';
        child.stdout.on('data', (d: Buffer) => {
          stdout += d.toString();
          onStdout?.(stdout);
        });
        child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
        child.on('close', (code) => resolve({ code, stdout, stderr }));
      }),
    counter: (host, device, name) => Number(execFileSync('ip', ['netns', 'exec', `${prefix}-h${host}`, 'cat', `/sys/class/net/${device}/statistics/${name}`], { encoding: 'utf8' }).trim()),
    tearDownHost: (host) => {
      const ns = `${prefix}-h${host}`;
      const pids = execFileSync('ip', ['netns', 'pids', ns], { encoding: 'utf8' }).split('\n').filter(Boolean);
      for (const pid of pids) {
        try {
          process.kill(Number(pid), 'SIGKILL');
        } catch {
          // Already gone.
        }
      }
      execFileSync('ip', ['netns', 'del', ns], { stdio: 'pipe' });
    },
    down: () => {
      process.off('exit', down);
      down();
    },
  };
}
