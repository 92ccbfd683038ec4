/* Status codes shared by the core, the CPU kernels and every plugin.
 * The C ABI never throws: every entry point returns one of these. The addon maps
 * each to a JS error whose `code` is the string returned by sapipe_status_code(). */
#ifndef SAPIPE_STATUS_H
#define SAPIPE_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum sapipe_status {
  SAPIPE_OK = 0,
  SAPIPE_ERR_INVALID_ARGUMENT = 1,
  SAPIPE_ERR_SIZE_MISMATCH = 2,
  SAPIPE_ERR_ALIASING = 3,
  SAPIPE_ERR_DISPOSED = 4,
  SAPIPE_ERR_BUSY = 5,
  SAPIPE_ERR_OUT_OF_MEMORY = 6,
  SAPIPE_ERR_BACKEND_UNAVAILABLE = 7,
  SAPIPE_ERR_PEER_LOST = 8, /* a peer of a collective left, died or broke the group */
  SAPIPE_ERR_TIMEOUT = 9,   /* a wait for peers ran past its timeout */
  SAPIPE_ERR_INTERNAL = 99
} sapipe_status;

/* Stable string form ("ERR_SIZE_MISMATCH", ...). Never returns NULL. */
const char* sapipe_status_code(sapipe_status status);

#ifdef __cplusplus
}
#endif

#endif
