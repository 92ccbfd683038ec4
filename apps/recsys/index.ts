export { checkClickData, readClickData, syntheticClicks, writeClickData, type ClickData, type ClickDataOptions } from './clicks.js';
export { ShardedEmbedding, type ShardedEmbeddingOptions } from './embedding.js';
export { ClickModel, type ClickMetrics, type ClickModelOptions } from './model.js';
export { CprCheckpointer, RECOVERY_POLICIES, cprIntervalSeconds, expectedOverhead, youngIntervalSeconds, type CprOptions, type CprResume, type CprStats, type RecoveryPolicy } from './cpr.js';
