// NCCL opened at run time (libnccl.so.2), so neither the plugin nor the addon needs NCCL to
// build or load. Only the functions the communicator and the fused all-reduce need are resolved;
// their types are declared here from NCCL's stable C ABI (nccl.h of NCCL 2), so no NCCL headers
// are required.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "sapipe/status.h"

namespace sapipe::nccl {

// From nccl.h (NCCL 2.x); values are part of NCCL's ABI.
using Result = int;  // ncclResult_t: 0 is ncclSuccess
constexpr Result kSuccess = 0;
constexpr Result kInProgress = 7;
struct UniqueId {
  char internal[128];  // NCCL_UNIQUE_ID_BYTES
};
using Comm = struct ncclComm*;
enum DataType : int { kFloat32 = 7 };        // ncclFloat32
enum RedOp : int { kSum = 0, kAvg = 4 };     // ncclSum, ncclAvg (NCCL >= 2.10)

struct Api {
  Result (*GetVersion)(int* version);
  Result (*GetUniqueId)(UniqueId* id);
  Result (*CommInitRank)(Comm* comm, int nranks, UniqueId id, int rank);
  Result (*CommDestroy)(Comm comm);
  Result (*CommAbort)(Comm comm);
  Result (*CommGetAsyncError)(Comm comm, Result* async_error);
  Result (*AllReduce)(const void* send, void* recv, size_t count, DataType type, RedOp op, Comm comm, void* stream);
  Result (*ReduceScatter)(const void* send, void* recv, size_t recv_count, DataType type, RedOp op, Comm comm,
                          void* stream);
  Result (*AllGather)(const void* send, void* recv, size_t send_count, DataType type, Comm comm, void* stream);
  Result (*Broadcast)(const void* send, void* recv, size_t count, DataType type, int root, Comm comm, void* stream);
  Result (*Send)(const void* send, size_t count, DataType type, int peer, Comm comm, void* stream);
  Result (*Recv)(void* recv, size_t count, DataType type, int peer, Comm comm, void* stream);
  Result (*GroupStart)();
  Result (*GroupEnd)();
  const char* (*GetErrorString)(Result result);
  int version;
  std::string path;  // the file that was opened
};

// Opens NCCL once per process. On failure returns SAPIPE_ERR_BACKEND_UNAVAILABLE and sets
// *reason to every place looked at and why each failed (or the symbol that was missing).
// search_path: SAPIPE_NCCL_PATH's value (colon-separated folders or files), may be null.
sapipe_status load(const char* search_path, const Api** api, std::string* reason);

// The same, without caching: for tests of the failure paths.
sapipe_status load_uncached(const char* search_path, Api* api, std::string* reason);

}  // namespace sapipe::nccl
