/** The backends: what each probe reports (registry.ts) and the choice among them (select.ts). */
export type { BackendProbe, BackendStatus } from './status.js';
export { backendStatuses } from './registry.js';
export * from './select.js';
