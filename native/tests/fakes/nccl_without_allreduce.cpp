// Built as a file named libnccl.so.2 that exports NCCL's entry points except ncclAllReduce: the
// NCCL loader must name the missing symbol and the file. Built again with SAPIPE_FAKE_COMPLETE_NCCL
// as an NCCL with every symbol (that does nothing): NCCL then loads, and what must fail is the
// missing device.
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
SAPIPE_FAKE(ncclBroadcast)
SAPIPE_FAKE(ncclSend)
SAPIPE_FAKE(ncclRecv)
SAPIPE_FAKE(ncclGroupStart)
SAPIPE_FAKE(ncclGroupEnd)
SAPIPE_FAKE(ncclGetErrorString)
#ifdef SAPIPE_FAKE_COMPLETE_NCCL
SAPIPE_FAKE(ncclAllReduce)
#endif
}
