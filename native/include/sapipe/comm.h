/* C ABI of communication transports. A transport moves bytes between the ranks of one group; the
 * collective algorithms (native/comm/ring.*) are written once against it, in the main addon.
 * The UCX plugin (native/comm/ucx, a dlopen'ed shared library) exports
 * `sapipe_comm_transport_open_v1` and fills a sapipe_comm_transport; the `local` backend needs no
 * transport (its ranks share memory and reduce peers' buffers directly).
 *
 * Every call returns a status and never throws. Every wait is bounded by deadline_ms, an absolute
 * CLOCK_MONOTONIC time in milliseconds: a transport returns SAPIPE_ERR_TIMEOUT when it passes, and
 * SAPIPE_ERR_PEER_LOST when the peer's endpoint closed or failed. */
#ifndef SAPIPE_COMM_H
#define SAPIPE_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "sapipe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SAPIPE_COMM_TRANSPORT_ABI_VERSION 1

/* An outstanding non-blocking send, owned by the transport until waited for. */
typedef struct sapipe_comm_request sapipe_comm_request;

typedef struct sapipe_comm_transport {
  uint32_t abi_version; /* SAPIPE_COMM_TRANSPORT_ABI_VERSION */
  void* self;
  int32_t rank;
  int32_t size;
  /* Starts sending bytes to peer; data must stay valid until wait_send returns. Messages between
   * one pair of ranks arrive in the order they were sent. */
  sapipe_status (*isend)(void* self, int32_t peer, const void* data, size_t bytes, sapipe_comm_request** request);
  sapipe_status (*wait_send)(void* self, sapipe_comm_request* request, int64_t deadline_ms);
  /* Receives the next message from peer into data; a message of another length is
   * SAPIPE_ERR_SIZE_MISMATCH (the message is consumed, nothing is written). */
  sapipe_status (*recv)(void* self, int32_t peer, void* data, size_t bytes, int64_t deadline_ms);
  /* Closes the endpoints; pending and later operations of peers fail with SAPIPE_ERR_PEER_LOST. */
  void (*destroy)(void* self);
} sapipe_comm_transport;

/* Entry point of a transport plugin. `address_exchange` is called by the plugin to swap opaque
 * endpoint addresses with every rank (the addon implements it over the rendezvous store). */
typedef sapipe_status (*sapipe_comm_address_exchange_fn)(void* context, const void* mine, size_t bytes,
                                                         void* all /* size * bytes */, int64_t deadline_ms);
typedef sapipe_status (*sapipe_comm_transport_open_v1_fn)(int32_t rank, int32_t size,
                                                          sapipe_comm_address_exchange_fn exchange,
                                                          void* exchange_context, sapipe_comm_transport* out);

#ifdef __cplusplus
}
#endif

#endif
