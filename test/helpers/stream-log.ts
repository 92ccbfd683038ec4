/**
 * The host-memory CUDA plugin's log of which stream each checked operation went to
 * (native/tests/fakes/plugin_host_memory.cpp, SAPIPE_FAKE_STREAM_LOG), for the device tests.
 */
import { appendFileSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { cudaStatus } from '../../dist/device/index.js';

/** Whether cuda:0 is the host-memory plugin's: only it checks the stream order and logs the streams. */
export const emulated = (cudaStatus().devices ?? []).some((d) => (d.name ?? '').includes('host memory'));

/** The operations `fn` enqueues and their streams' ids (0: the default stream), from the host-memory plugin's log. */
export async function logged<T>(fn: () => Promise<T>): Promise<{ result: T; ops: Array<{ op: string; stream: number }> }> {
  const dir = mkdtempSync(join(tmpdir(), 'sapipe-streams-'));
  const path = join(dir, 'log');
  appendFileSync(path, '');
  process.env.SAPIPE_FAKE_STREAM_LOG = path;
  try {
    const result = await fn();
    const ops = readFileSync(path, 'utf8')
      .split('\n')
      .filter((l) => l !== '')
      .map((l) => {
        const [op, stream] = l.split(' ');
        return { op: op!, stream: Number(stream) };
      });
    return { result, ops };
  } finally {
    delete process.env.SAPIPE_FAKE_STREAM_LOG;
    rmSync(dir, { recursive: true, force: true });
  }
}
