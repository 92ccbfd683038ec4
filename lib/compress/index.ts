/** Compressed communication: MSTopK selection with error feedback and its sparse aggregation. */
export { mstopk, scatterAdd, topkExact, type TopkOptions, type TopkSelection } from './topk.js';
export { sparseAllreduce, type SparseAllreduceOptions, type SparseAllreduceResult } from './sparse-allreduce.js';
export { hierarchicalPartLength, hierarchicalSparseAllreduce, type HierarchicalSparseResult } from './hierarchical.js';
