/* C ABI of communication transport plugins. A transport moves bytes between the ranks of one
 * group; the collective algorithms (native/comm/ring.*) are written once against it, in the main
 * addon. The UCX plugin (native/comm/ucx, sapipe_ucx.so, a dlopen'ed shared library) exports
 * sapipe_plugin_entry (sapipe/plugin.h) and returns a sapipe_comm_plugin_v1 named "ucx"; the
 * `local` backend needs no plugin (its ranks share memory and reduce peers' buffers directly).
 *
 * Connecting a group takes two calls around an exchange that the caller does: create() makes this
 * rank's endpoint (for UCX: a UCP worker) and local_address() returns its opaque address; the
 * caller swaps the addresses of all ranks (sapipe does it in TypeScript through the rendezvous
 * store, MASTER_ADDR/MASTER_PORT) and passes them all to connect(). Keeping the exchange outside
 * the plugin leaves the plugin free of any knowledge of the store or of JS.
 *
 * Messages travel on channels (user point-to-point, collective) that never mix: a receive on one
 * channel never takes a message sent on the other. Between one pair of ranks, messages on one
 * channel arrive in the order they were sent.
 *
 * Every call returns a status and never throws; last_error() describes the latest failure of the
 * calling thread. Every wait is bounded by deadline_ms, an absolute CLOCK_MONOTONIC time in
 * milliseconds: a transport returns SAPIPE_ERR_TIMEOUT when it passes, SAPIPE_ERR_PEER_LOST when
 * the peer's endpoint failed or the peer was reported lost (peer_lost()), and SAPIPE_ERR_DISPOSED
 * once shutdown() was called. The calls may come from several threads at once. */
#ifndef SAPIPE_COMM_H
#define SAPIPE_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "sapipe/plugin.h"
#include "sapipe/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SAPIPE_COMM_TRANSPORT_ABI_VERSION 1

/* One rank's transport, owned by the plugin. */
typedef struct sapipe_comm_transport sapipe_comm_transport;
/* An outstanding non-blocking send, owned by the transport until wait_send returns. */
typedef struct sapipe_comm_request sapipe_comm_request;
/* Memory this rank allocated so that peers on the same machine can map it (region_alloc). */
typedef struct sapipe_comm_region sapipe_comm_region;
/* A peer's region, mapped into this process (peer_map). */
typedef struct sapipe_comm_peer_region sapipe_comm_peer_region;

typedef enum sapipe_comm_channel {
  SAPIPE_COMM_CHANNEL_USER = 0,       /* Communicator.send / recv */
  SAPIPE_COMM_CHANNEL_COLLECTIVE = 1  /* the ring algorithms and the collectives' size checks */
} sapipe_comm_channel;

typedef struct sapipe_comm_plugin_v1 {
  sapipe_plugin_header header; /* abi_version SAPIPE_COMM_TRANSPORT_ABI_VERSION, name "ucx" */

  /* The library underneath, e.g. "UCX 1.13.1". */
  const char* (*library_version)(void);
  /* Details of the calling thread's latest failure. */
  const char* (*last_error)(void);

  /* Makes this rank's endpoint; *out is released with destroy(). */
  sapipe_status (*create)(int32_t rank, int32_t size, sapipe_comm_transport** out);
  /* This rank's address, valid until destroy(). */
  sapipe_status (*local_address)(sapipe_comm_transport* t, const void** address, size_t* bytes);
  /* Connects to every rank: addresses[r] (lengths[r] bytes) is rank r's local_address(). With
   * detect_failure[r] set, the transport itself watches rank r for failure (for UCX:
   * UCP_ERR_HANDLING_MODE_PEER, which UCX 1.13 offers over TCP and RDMA but not over shared
   * memory, so asking for it between ranks of one machine sends their bytes over TCP); ranks of
   * the same machine pass 0 and rely on the caller's liveness signal (peer_lost()). */
  sapipe_status (*connect)(sapipe_comm_transport* t, const void* const* addresses, const size_t* lengths,
                           const int32_t* detect_failure, int64_t deadline_ms);

  /* Starts sending bytes to peer; data must stay valid until wait_send returns. With synchronous
   * set, the send completes only once the peer has received the message. */
  sapipe_status (*isend)(sapipe_comm_transport* t, int32_t peer, int32_t channel, int32_t synchronous,
                         const void* data, size_t bytes, sapipe_comm_request** request);
  /* Waits for a send and releases its request (also when it fails or times out: the send is then
   * cancelled, and data is no longer read once this returns). */
  sapipe_status (*wait_send)(sapipe_comm_transport* t, sapipe_comm_request* request, int64_t deadline_ms);
  /* Receives the next message from peer on channel into data. A message of another length is
   * SAPIPE_ERR_SIZE_MISMATCH: it is consumed and nothing is written to data. */
  sapipe_status (*recv)(sapipe_comm_transport* t, int32_t peer, int32_t channel, void* data, size_t bytes,
                        int64_t deadline_ms);

  /* Reports that peer is gone (a liveness signal the caller watches, e.g. a closed socket): its
   * pending and later operations fail with SAPIPE_ERR_PEER_LOST, once messages it sent before
   * leaving have had a short grace period to arrive. */
  void (*peer_lost)(sapipe_comm_transport* t, int32_t peer, const char* reason);
  /* This rank leaves: pending and later operations fail with SAPIPE_ERR_DISPOSED. */
  void (*shutdown)(sapipe_comm_transport* t);
  /* Closes the endpoints and frees t; no call on t may be running or follow, except region_free
   * of regions still allocated (t then lives on, endpoint-less, until the last is freed). Every
   * peer_map must have been undone by peer_unmap before. */
  void (*destroy)(sapipe_comm_transport* t);

  /* Direct access between ranks of one machine. A region is memory that peers can map into their
   * own address space and then read and write with plain loads and stores (for UCX:
   * ucp_mem_map(UCP_MEM_MAP_ALLOCATE) on a shared-memory transport, ucp_rkey_ptr on the peer).
   * region_alloc returns zeroed, page-aligned memory of at least `bytes` (1 at least) in *data.
   * A peer's mapping must stay valid until the peer unmaps it, even after the owner freed the
   * region or died (true of System V and POSIX shared memory, which UCX allocates from): a rank may
   * still touch a peer's buffer while a failed collective unwinds. */
  sapipe_status (*region_alloc)(sapipe_comm_transport* t, size_t bytes, void** data, sapipe_comm_region** region);
  /* The region's key, to hand to peers (its address and length are part of it); valid until
   * region_free. */
  sapipe_status (*region_key)(sapipe_comm_transport* t, sapipe_comm_region* region, const void** key, size_t* bytes);
  /* Frees the region. Peers that mapped it keep their mapping valid until they unmap it. */
  void (*region_free)(sapipe_comm_transport* t, sapipe_comm_region* region);
  /* Maps peer's region, given its key: *data is its first byte here, *length its length.
   * SAPIPE_ERR_BACKEND_UNAVAILABLE when this peer cannot be mapped (another machine, or no
   * shared-memory transport between the two): callers then move the bytes by messages. */
  sapipe_status (*peer_map)(sapipe_comm_transport* t, int32_t peer, const void* key, size_t bytes, void** data, size_t* length,
                            sapipe_comm_peer_region** mapping);
  void (*peer_unmap)(sapipe_comm_transport* t, sapipe_comm_peer_region* mapping);
} sapipe_comm_plugin_v1;

#ifdef __cplusplus
}
#endif

#endif
