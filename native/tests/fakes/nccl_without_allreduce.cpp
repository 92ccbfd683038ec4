// Built as a file named libnccl.so.2 that exports NCCL's entry points except ncclAllReduce: the
// NCCL loader must name the missing symbol and the file.
extern "C" {
#define SAPIPE_FAKE(name) __attribute__((visibility("default"))) int name() { return 0; }
__attribute__((visibility("default"))) int ncclGetVersion(int* v) {
  *v = 22703;
  return 0;
}
SAPIPE_FAKE(ncclGetUniqueId)
SAPIPE_FAKE(ncclCommInitRank)
SAPIPE_FAKE(ncclCommDestroy)
SAPIPE_FAKE(ncclCommAbort)
SAPIPE_FAKE(ncclCommGetAsyncError)
SAPIPE_FAKE(ncclReduceScatter)
SAPIPE_FAKE(ncclAllGather)
SAPIPE_FAKE(ncclGroupStart)
SAPIPE_FAKE(ncclGroupEnd)
SAPIPE_FAKE(ncclGetErrorString)
}
