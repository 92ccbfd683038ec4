/** The rendezvous store: how ranks find each other and swap connection details. */
export { createRendezvous, Rendezvous, type RendezvousOptions } from './rendezvous.js';
export { fromEnv, DEFAULT_MASTER_PORT, type RendezvousEnv } from './env.js';
export { RendezvousClient, DEFAULT_RENDEZVOUS_TIMEOUT_MS, type CallOptions, type RendezvousClientOptions } from './client.js';
export { DEFAULT_MAX_PENDING_CONNECTIONS, RendezvousServer, type RendezvousServerOptions } from './server.js';
export { DEFAULT_MAX_MESSAGE_BYTES } from './frame.js';
