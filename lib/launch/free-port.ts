/** Picking a port for the rendezvous store when the user did not name one. */
import { createServer } from 'node:net';

/**
 * A TCP port that is free now, found by binding port 0 and letting it go. Another process could
 * take it before rank 0 binds it; that window is short and the same trade torchrun makes.
 */
export function findFreePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.unref();
    server.once('error', reject);
    // No host: the port is then free on every interface, whichever one rank 0 binds.
    server.listen({ port: 0, exclusive: true }, () => {
      const address = server.address();
      const port = typeof address === 'object' && address !== null ? address.port : 0;
      server.close(() => resolve(port));
    });
  });
}
