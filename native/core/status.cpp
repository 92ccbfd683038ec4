#include "sapipe/status.h"

extern "C" const char* sapipe_status_code(sapipe_status status) {
  switch (status) {
    case SAPIPE_OK: return "OK";
    case SAPIPE_ERR_INVALID_ARGUMENT: return "ERR_INVALID_ARGUMENT";
    case SAPIPE_ERR_SIZE_MISMATCH: return "ERR_SIZE_MISMATCH";
    case SAPIPE_ERR_ALIASING: return "ERR_ALIASING";
    case SAPIPE_ERR_DISPOSED: return "ERR_DISPOSED";
    case SAPIPE_ERR_BUSY: return "ERR_BUSY";
    case SAPIPE_ERR_OUT_OF_MEMORY: return "ERR_OUT_OF_MEMORY";
    case SAPIPE_ERR_BACKEND_UNAVAILABLE: return "ERR_BACKEND_UNAVAILABLE";
    case SAPIPE_ERR_PEER_LOST: return "ERR_PEER_LOST";
    case SAPIPE_ERR_TIMEOUT: return "ERR_TIMEOUT";
    case SAPIPE_ERR_INTERNAL: return "ERR_INTERNAL";
  }
  return "ERR_INTERNAL";
}
