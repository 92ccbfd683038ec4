/** Picking a port for the rendezvous store when the user did not name one. */
import { readFileSync } from 'node:fs';
import { createServer } from 'node:net';

import { BackendUnavailableError } from '../errors.js';

/** Binds `port` (0: any) on every interface and lets it go; resolves with the port, or null if it is taken. */
function tryPort(port: number): Promise<number | null> {
  return new Promise((resolve) => {
    const server = createServer();
    server.unref();
    server.once('error', () => resolve(null));
    // No host: the port is then free on every interface, whichever one rank 0 binds.
    server.listen({ port, exclusive: true }, () => {
      const address = server.address();
      const bound = typeof address === 'object' && address !== null ? address.port : null;
      server.close(() => resolve(bound));
    });
  });
}

/** The kernel's range of ephemeral ports (Linux; the usual default elsewhere). */
function ephemeralRange(): [number, number] {
  try {
    const [lo, hi] = readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/).map(Number);
    if (Number.isInteger(lo) && Number.isInteger(hi) && lo! > 0 && hi! >= lo!) return [lo!, hi!];
  } catch {
    // not Linux
  }
  return [32768, 60999];
}

/**
 * A TCP port that is free now, for rank 0 to bind a moment later. It is drawn below the kernel's
 * ephemeral range: the kernel never hands such a port to another socket by itself, so the many
 * sockets that ranks and transports open meanwhile (UCX's TCP interfaces listen on ephemeral ports)
 * cannot take it; only a program binding that very port could. If no such port is free, any port
 * the kernel gives out (another process could then take it first, a short window: torchrun's trade).
 *
 * @category Launch
 */
export async function findFreePort(): Promise<number> {
  const [ephemeralLow] = ephemeralRange();
  const low = Math.min(20000, Math.max(1024, ephemeralLow - 8192));
  if (ephemeralLow - low >= 256)
    for (let attempt = 0; attempt < 32; attempt++) {
      const candidate = low + Math.floor(Math.random() * (ephemeralLow - low));
      const port = await tryPort(candidate);
      if (port !== null) return port;
    }
  const port = await tryPort(0);
  if (port === null) throw new BackendUnavailableError('no free TCP port for the rendezvous store; name one with --master-port (or MASTER_PORT)');
  return port;
}
