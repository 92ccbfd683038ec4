// The UCX transport plugin (sapipe_ucx.so): one UCP worker per rank, tag-matched messages between
// ranks over whatever UCX picks (shared memory, TCP, RDMA). See include/sapipe/comm.h for the ABI.
//
// Threading: the worker is created in UCS_THREAD_MODE_SINGLE and every worker call (posting,
// probing, progress) happens under one mutex. Waits progress in short slices and release the mutex
// between slices, so a receive blocked on a quiet peer never starves a collective on another
// thread: each waiting thread's progress call drives every outstanding operation.
//
// Tags: [channel: 2 bits][source rank: 20 bits][sequence: 42 bits]. Each (peer, channel,
// direction) has its own sequence counter, and receives match the full tag, so a collective never
// takes a user message (or the reverse) and messages of one channel are taken in the order sent.
//
// Receives probe first and receive the matched message only once its length is known: a message
// of the wrong length is consumed into scratch space and reported, never written to the caller's
// buffer (so a mismatch cannot write past it).
//
// Lost peers: endpoints to other machines are created with UCP_ERR_HANDLING_MODE_PEER, so that
// TCP and RDMA report a dead peer through the error callback. UCX 1.13's shared-memory transports
// do not offer that mode (asking for it moves the bytes to TCP loopback, 2-3x slower), so endpoints
// on one machine use no error handling and rely on the caller's liveness signal (peer_lost()).
// Either way, messages the peer sent before leaving get a short grace period to arrive before
// operations fail.
//
// Regions (direct access between ranks of one machine): UCX allocates the memory itself
// (ucp_mem_map with UCP_MEM_MAP_ALLOCATE, which prefers System V and POSIX shared memory), packs a
// remote key for it, and a peer turns the key into a pointer in its own address space with
// ucp_rkey_ptr. The key travels as [address: u64][length: u64][packed remote key].
#include <ucp/api/ucp.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "sapipe/comm.h"

namespace {

using Clock = std::chrono::steady_clock;

thread_local std::string g_last_error;

sapipe_status fail(sapipe_status s, std::string message) {
  g_last_error = std::move(message);
  return s;
}

// Milliseconds of CLOCK_MONOTONIC, the clock deadlines are given in (steady_clock on Linux).
int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch()).count();
}

constexpr int kChannelConnect = 2;  // the handshake of connect(), beside the ABI's two channels
constexpr int kChannels = 3;
constexpr int kSourceBits = 20, kSequenceBits = 42;
constexpr int64_t kLostGraceMs = 200;
constexpr int64_t kCloseBoundMs = 1000;

uint64_t make_tag(int channel, int source, uint64_t sequence) {
  return (static_cast<uint64_t>(channel) << (kSourceBits + kSequenceBits)) |
         (static_cast<uint64_t>(source) << kSequenceBits) | (sequence & ((uint64_t{1} << kSequenceBits) - 1));
}

struct ErrorContext {
  sapipe_comm_transport* t;
  int32_t peer;
};

struct PeerState {
  bool lost = false;
  int64_t lost_at_ms = 0;
  std::string reason;
};

}  // namespace

struct sapipe_comm_request {
  void* ucx = nullptr;  // a UCX request, or null when the send completed at once
  int32_t peer = 0;
  int32_t channel = 0;
};

struct sapipe_comm_region {
  ucp_mem_h memh = nullptr;
  void* data = nullptr;
  size_t length = 0;
  std::vector<uint8_t> key;
};

struct sapipe_comm_peer_region {
  ucp_rkey_h rkey = nullptr;
};

struct sapipe_comm_transport {
  int32_t rank = 0, size = 0;
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  ucp_address_t* address = nullptr;
  size_t address_bytes = 0;
  std::vector<ucp_ep_h> endpoints;
  // The endpoints' error callback arguments, one per rank; filled once at create (stable addresses).
  std::vector<ErrorContext> error_contexts;

  std::mutex mutex;  // every worker call and everything below
  std::vector<uint64_t> send_sequence, recv_sequence;  // [peer * kChannels + channel]
  std::vector<PeerState> peers;
  bool shut_down = false;
  // A request that could not be cancelled may still write into a buffer its caller has released;
  // the worker is then never progressed again, so nothing is written.
  bool poisoned = false;
  std::string poisoned_reason;
  // Regions still allocated keep the context (not the worker) alive past destroy().
  size_t live_regions = 0;
  bool destroyed = false;

  size_t index(int peer, int channel) const { return static_cast<size_t>(peer) * kChannels + static_cast<size_t>(channel); }
};

namespace {

void mark_lost(sapipe_comm_transport* t, int32_t peer, const std::string& reason) {
  PeerState& p = t->peers[static_cast<size_t>(peer)];
  if (p.lost) return;
  p.lost = true;
  p.lost_at_ms = now_ms();
  p.reason = reason;
}

// Runs inside ucp_worker_progress, so under the mutex.
void on_endpoint_error(void* arg, ucp_ep_h, ucs_status_t status) {
  auto* c = static_cast<ErrorContext*>(arg);
  mark_lost(c->t, c->peer, std::string("the UCX endpoint to rank ") + std::to_string(c->peer) + " failed: " + ucs_status_string(status));
}

// Why an operation involving `peer` (or, for a collective, any peer) must fail now; SAPIPE_OK if
// it may go on. Under the mutex.
sapipe_status blocked(sapipe_comm_transport* t, int32_t peer, int32_t channel) {
  if (t->shut_down) return fail(SAPIPE_ERR_DISPOSED, "the communicator was destroyed");
  if (t->poisoned) return fail(SAPIPE_ERR_PEER_LOST, t->poisoned_reason);
  const int64_t now = now_ms();
  for (int32_t r = 0; r < t->size; ++r) {
    if (r == t->rank || (channel == SAPIPE_COMM_CHANNEL_USER && r != peer)) continue;
    const PeerState& p = t->peers[static_cast<size_t>(r)];
    if (p.lost && now - p.lost_at_ms >= kLostGraceMs)
      return fail(SAPIPE_ERR_PEER_LOST, "rank " + std::to_string(r) + " is gone (" + p.reason + ")");
  }
  return SAPIPE_OK;
}

// How long a waiter spins on a quiet worker before it sleeps: SAPIPE_UCX_SPIN_US, default 1 ms.
int64_t spin_micros() {
  static const int64_t us = [] {
    const char* v = std::getenv("SAPIPE_UCX_SPIN_US");
    return v && *v ? std::strtoll(v, nullptr, 10) : 1000;
  }();
  return us;
}

// Progresses until done() (called under the mutex) returns true, the deadline passes, or blocked()
// says the operation cannot complete. Spins briefly, then backs off to short sleeps so that idle
// waiters (a receive from a quiet peer) leave the cores to the ranks that work.
template <class Done>
sapipe_status progress_until(sapipe_comm_transport* t, int32_t peer, int32_t channel, int64_t deadline_ms, const char* what,
                             Done done) {
  Clock::time_point last_event = Clock::now();
  for (;;) {
    unsigned events = 0;
    {
      std::lock_guard<std::mutex> lock(t->mutex);
      if (!t->poisoned)
        while (events < 64 && ucp_worker_progress(t->worker) != 0) ++events;
      if (done()) return SAPIPE_OK;
      if (sapipe_status s = blocked(t, peer, channel); s != SAPIPE_OK) return s;
    }
    const Clock::time_point now = Clock::now();
    if (events) last_event = now;
    if (now_ms() >= deadline_ms)
      return fail(SAPIPE_ERR_TIMEOUT, std::string(what) + (peer >= 0 ? " rank " + std::to_string(peer) : std::string()) +
                                          ": no progress before the timeout");
    // Spin while messages are flowing (a short wait costs no wake-up latency); once the worker
    // has been quiet for a while, sleep, so that a waiting rank leaves its core to the ranks that
    // work (ranks often share cores with each other and with the training itself).
    const auto quiet = now - last_event;
    if (quiet < std::chrono::microseconds(spin_micros()))
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(quiet < std::chrono::milliseconds(10) ? 20 : 200));
  }
}

// Closes the endpoint to a lost peer at once: UCX then fails the requests still queued on it
// (with no error handling on the endpoint, a send to a dead peer would otherwise stay pending
// forever, holding its buffer). Under the mutex.
void drop_endpoint(sapipe_comm_transport* t, int32_t peer) {
  ucp_ep_h& ep = t->endpoints[static_cast<size_t>(peer)];
  if (ep == nullptr) return;
  ucp_request_param_t p;
  std::memset(&p, 0, sizeof p);
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_EP_CLOSE_FLAG_FORCE;
  ucs_status_ptr_t sp = ucp_ep_close_nbx(ep, &p);
  ep = nullptr;
  if (sp == nullptr || UCS_PTR_IS_ERR(sp)) return;
  const int64_t until = now_ms() + 200;
  while (ucp_request_check_status(sp) == UCS_INPROGRESS && now_ms() < until) ucp_worker_progress(t->worker);
  ucp_request_free(sp);
}

// Gives up on a request that will not be waited for (its operation failed or timed out) and frees
// it. Its peer's endpoint is closed first when the peer is lost, which fails the request; a
// receive is cancelled. If it still does not finish within a short bound it might yet touch its
// buffer, which its owner is about to release: the worker is then never progressed again. Under
// the mutex.
void abandon(sapipe_comm_transport* t, void* request, int32_t peer) {
  if (request == nullptr) return;
  if (!t->poisoned) {
    if (peer >= 0 && t->peers[static_cast<size_t>(peer)].lost) drop_endpoint(t, peer);
    if (ucp_request_check_status(request) == UCS_INPROGRESS) ucp_request_cancel(t->worker, request);
    const int64_t until = now_ms() + 200;
    while (ucp_request_check_status(request) == UCS_INPROGRESS && now_ms() < until) ucp_worker_progress(t->worker);
    if (ucp_request_check_status(request) == UCS_INPROGRESS) {
      t->poisoned = true;
      t->poisoned_reason = "a cancelled UCX request did not finish; the transport stopped to protect its buffers";
    }
  }
  ucp_request_free(request);
}

// The empty-callback parameters of a non-blocking call (UCX then returns a request to poll).
ucp_request_param_t plain_param() {
  ucp_request_param_t p;
  std::memset(&p, 0, sizeof p);
  return p;
}

const char* plugin_library_version() {
  static const std::string v = std::string("UCX ") + ucp_get_version_string();
  return v.c_str();
}

const char* plugin_last_error() { return g_last_error.c_str(); }

void release_worker(sapipe_comm_transport* t) {
  if (t->address) ucp_worker_release_address(t->worker, t->address);
  if (t->worker) ucp_worker_destroy(t->worker);
  t->address = nullptr;
  t->worker = nullptr;
}

void release(sapipe_comm_transport* t) {
  release_worker(t);
  if (t->context) ucp_cleanup(t->context);
  delete t;
}

sapipe_status plugin_create(int32_t rank, int32_t size, sapipe_comm_transport** out) {
  if (out == nullptr || size < 1 || size > (1 << kSourceBits) || rank < 0 || rank >= size)
    return fail(SAPIPE_ERR_INVALID_ARGUMENT, "create: rank must be in [0, size) and size in [1, 2^20]");
  *out = nullptr;
  auto* t = new (std::nothrow) sapipe_comm_transport();
  if (t == nullptr) return fail(SAPIPE_ERR_OUT_OF_MEMORY, "create: out of memory");
  t->rank = rank;
  t->size = size;
  const size_t slots = static_cast<size_t>(size) * kChannels;
  t->send_sequence.assign(slots, 0);
  t->recv_sequence.assign(slots, 0);
  t->peers.resize(static_cast<size_t>(size));

  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);  // honours UCX_* variables (UCX_TLS, ...)
  if (st != UCS_OK) {
    delete t;
    return fail(SAPIPE_ERR_BACKEND_UNAVAILABLE, std::string("reading the UCX configuration failed: ") + ucs_status_string(st));
  }
  ucp_params_t params;
  std::memset(&params, 0, sizeof params);
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_ESTIMATED_NUM_EPS;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_RMA;  // RMA: remote keys for regions
  params.estimated_num_eps = static_cast<size_t>(size);
  st = ucp_init(&params, config, &t->context);
  ucp_config_release(config);
  if (st != UCS_OK) {
    delete t;
    return fail(SAPIPE_ERR_BACKEND_UNAVAILABLE, std::string("ucp_init failed: ") + ucs_status_string(st));
  }
  ucp_worker_params_t wp;
  std::memset(&wp, 0, sizeof wp);
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;  // serialised by t->mutex
  st = ucp_worker_create(t->context, &wp, &t->worker);
  if (st == UCS_OK) st = ucp_worker_get_address(t->worker, &t->address, &t->address_bytes);
  if (st != UCS_OK) {
    release(t);
    return fail(SAPIPE_ERR_BACKEND_UNAVAILABLE, std::string("creating the UCX worker failed: ") + ucs_status_string(st));
  }
  t->error_contexts.reserve(static_cast<size_t>(size));
  for (int32_t r = 0; r < size; ++r) t->error_contexts.push_back({t, r});
  *out = t;
  return SAPIPE_OK;
}

sapipe_status plugin_local_address(sapipe_comm_transport* t, const void** address, size_t* bytes) {
  if (t == nullptr || address == nullptr || bytes == nullptr) return fail(SAPIPE_ERR_INVALID_ARGUMENT, "local_address: null argument");
  *address = t->address;
  *bytes = t->address_bytes;
  return SAPIPE_OK;
}

sapipe_status plugin_isend(sapipe_comm_transport* t, int32_t peer, int32_t channel, int32_t synchronous, const void* data,
                           size_t bytes, sapipe_comm_request** request);
sapipe_status plugin_wait_send(sapipe_comm_transport* t, sapipe_comm_request* request, int64_t deadline_ms);
sapipe_status plugin_recv(sapipe_comm_transport* t, int32_t peer, int32_t channel, void* data, size_t bytes, int64_t deadline_ms);

sapipe_status plugin_connect(sapipe_comm_transport* t, const void* const* addresses, const size_t* lengths,
                             const int32_t* detect_failure, int64_t deadline_ms) {
  if (t == nullptr || addresses == nullptr || lengths == nullptr || detect_failure == nullptr)
    return fail(SAPIPE_ERR_INVALID_ARGUMENT, "connect: null argument");
  {
    std::lock_guard<std::mutex> lock(t->mutex);
    if (!t->endpoints.empty()) return fail(SAPIPE_ERR_INVALID_ARGUMENT, "connect: already connected");
    t->endpoints.assign(static_cast<size_t>(t->size), nullptr);
    for (int32_t r = 0; r < t->size; ++r) {
      if (r == t->rank) continue;
      if (addresses[r] == nullptr || lengths[r] == 0) return fail(SAPIPE_ERR_INVALID_ARGUMENT, "connect: rank " + std::to_string(r) + " has no address");
      ucp_ep_params_t ep;
      std::memset(&ep, 0, sizeof ep);
      ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
      ep.address = static_cast<const ucp_address_t*>(addresses[r]);
      ep.err_mode = detect_failure[r] ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
      ep.err_handler.cb = on_endpoint_error;
      ep.err_handler.arg = &t->error_contexts[static_cast<size_t>(r)];
      ucs_status_t st = ucp_ep_create(t->worker, &ep, &t->endpoints[static_cast<size_t>(r)]);
      if (st != UCS_OK)
        return fail(SAPIPE_ERR_PEER_LOST, "connecting to rank " + std::to_string(r) + " failed: " + ucs_status_string(st));
    }
  }
  // A handshake with every peer: wires the endpoints up now (UCX connects lazily) and shows that
  // every rank reached this point, so the first collective does not pay for it.
  std::vector<sapipe_comm_request*> sends;
  sapipe_status result = SAPIPE_OK;
  const uint8_t hello = 1;
  for (int32_t r = 0; r < t->size && result == SAPIPE_OK; ++r) {
    if (r == t->rank) continue;
    sapipe_comm_request* req = nullptr;
    result = plugin_isend(t, r, kChannelConnect, 0, &hello, 1, &req);
    if (result == SAPIPE_OK) sends.push_back(req);
  }
  for (int32_t r = 0; r < t->size && result == SAPIPE_OK; ++r) {
    if (r == t->rank) continue;
    uint8_t got = 0;
    result = plugin_recv(t, r, kChannelConnect, &got, 1, deadline_ms);
  }
  for (sapipe_comm_request* req : sends) {
    sapipe_status s = plugin_wait_send(t, req, result == SAPIPE_OK ? deadline_ms : 0);
    if (result == SAPIPE_OK) result = s;
  }
  return result;
}

sapipe_status check_peer(sapipe_comm_transport* t, int32_t peer, int32_t channel) {
  if (peer < 0 || peer >= t->size || peer == t->rank) return fail(SAPIPE_ERR_INVALID_ARGUMENT, "peer must be another rank of the group");
  if (channel < 0 || channel >= kChannels) return fail(SAPIPE_ERR_INVALID_ARGUMENT, "unknown channel");
  if (t->endpoints.empty()) return fail(SAPIPE_ERR_INVALID_ARGUMENT, "the transport is not connected");
  return SAPIPE_OK;
}

sapipe_status plugin_isend(sapipe_comm_transport* t, int32_t peer, int32_t channel, int32_t synchronous, const void* data,
                           size_t bytes, sapipe_comm_request** request) {
  if (t == nullptr || request == nullptr || (data == nullptr && bytes > 0)) return fail(SAPIPE_ERR_INVALID_ARGUMENT, "isend: null argument");
  *request = nullptr;
  std::lock_guard<std::mutex> lock(t->mutex);
  if (sapipe_status s = check_peer(t, peer, channel); s != SAPIPE_OK) return s;
  if (sapipe_status s = blocked(t, peer, channel); s != SAPIPE_OK) return s;
  auto* req = new (std::nothrow) sapipe_comm_request();
  if (req == nullptr) return fail(SAPIPE_ERR_OUT_OF_MEMORY, "isend: out of memory");
  req->peer = peer;
  req->channel = channel;
  static const uint8_t empty = 0;
  const uint64_t tag = make_tag(channel, t->rank, t->send_sequence[t->index(peer, channel)]++);
  ucp_request_param_t p = plain_param();
  ucp_ep_h ep = t->endpoints[static_cast<size_t>(peer)];
  if (ep == nullptr) {
    delete req;
    return fail(SAPIPE_ERR_PEER_LOST, "rank " + std::to_string(peer) + " is gone (" + t->peers[static_cast<size_t>(peer)].reason + ")");
  }
  const void* buffer = bytes ? data : &empty;
  ucs_status_ptr_t sp = synchronous ? ucp_tag_send_sync_nbx(ep, buffer, bytes, tag, &p) : ucp_tag_send_nbx(ep, buffer, bytes, tag, &p);
  if (UCS_PTR_IS_ERR(sp)) {
    delete req;
    mark_lost(t, peer, std::string("sending failed: ") + ucs_status_string(UCS_PTR_STATUS(sp)));
    return fail(SAPIPE_ERR_PEER_LOST, "sending to rank " + std::to_string(peer) + " failed: " + ucs_status_string(UCS_PTR_STATUS(sp)));
  }
  req->ucx = sp;  // null: completed at once
  *request = req;
  return SAPIPE_OK;
}

sapipe_status plugin_wait_send(sapipe_comm_transport* t, sapipe_comm_request* req, int64_t deadline_ms) {
  if (t == nullptr || req == nullptr) return fail(SAPIPE_ERR_INVALID_ARGUMENT, "wait_send: null argument");
  ucs_status_t completed = UCS_OK;
  sapipe_status s = progress_until(t, req->peer, req->channel, deadline_ms, "sending to", [&] {
    if (req->ucx == nullptr) return true;
    completed = ucp_request_check_status(req->ucx);
    return completed != UCS_INPROGRESS;
  });
  std::lock_guard<std::mutex> lock(t->mutex);
  if (s == SAPIPE_OK && req->ucx != nullptr) {
    ucp_request_free(req->ucx);
    req->ucx = nullptr;
    if (completed != UCS_OK) {
      mark_lost(t, req->peer, std::string("a send failed: ") + ucs_status_string(completed));
      s = fail(SAPIPE_ERR_PEER_LOST, "sending to rank " + std::to_string(req->peer) + " failed: " + ucs_status_string(completed));
    }
  }
  if (req->ucx != nullptr) abandon(t, req->ucx, req->peer);
  delete req;
  return s;
}

sapipe_status plugin_recv(sapipe_comm_transport* t, int32_t peer, int32_t channel, void* data, size_t bytes, int64_t deadline_ms) {
  if (t == nullptr || (data == nullptr && bytes > 0)) return fail(SAPIPE_ERR_INVALID_ARGUMENT, "recv: null argument");
  uint64_t tag = 0;
  {
    std::lock_guard<std::mutex> lock(t->mutex);
    if (sapipe_status s = check_peer(t, peer, channel); s != SAPIPE_OK) return s;
    tag = make_tag(channel, peer, t->recv_sequence[t->index(peer, channel)]);
  }
  ucp_tag_message_h message = nullptr;
  ucp_tag_recv_info_t info{};
  sapipe_status s = progress_until(t, peer, channel, deadline_ms, "receiving from", [&] {
    message = ucp_tag_probe_nb(t->worker, tag, ~ucp_tag_t{0}, 1, &info);
    return message != nullptr;
  });
  if (s != SAPIPE_OK) return s;  // nothing was matched: the sequence stays, a late message is taken next time
  // A message of the wrong length lands in scratch space (so does an empty one: UCX wants a buffer).
  const bool fits = info.length == bytes;
  std::vector<uint8_t> scratch;
  if (!fits || bytes == 0) scratch.resize(info.length ? info.length : 1);
  void* into = fits && bytes ? data : scratch.data();
  void* request = nullptr;
  {
    std::lock_guard<std::mutex> lock(t->mutex);
    t->recv_sequence[t->index(peer, channel)]++;  // the message is taken, whatever happens next
    ucp_request_param_t p = plain_param();
    ucs_status_ptr_t sp = ucp_tag_msg_recv_nbx(t->worker, into, info.length, message, &p);
    if (UCS_PTR_IS_ERR(sp)) return fail(SAPIPE_ERR_PEER_LOST, std::string("receiving failed: ") + ucs_status_string(UCS_PTR_STATUS(sp)));
    request = sp;
  }
  ucs_status_t completed = UCS_OK;
  s = progress_until(t, peer, channel, deadline_ms, "receiving from", [&] {
    if (request == nullptr) return true;
    completed = ucp_request_check_status(request);
    return completed != UCS_INPROGRESS;
  });
  std::lock_guard<std::mutex> lock(t->mutex);
  if (s != SAPIPE_OK) {
    abandon(t, request, peer);
    return s;
  }
  if (request != nullptr) ucp_request_free(request);
  if (completed != UCS_OK) {
    mark_lost(t, peer, std::string("a receive failed: ") + ucs_status_string(completed));
    return fail(SAPIPE_ERR_PEER_LOST, "receiving from rank " + std::to_string(peer) + " failed: " + ucs_status_string(completed));
  }
  if (!fits)
    return fail(SAPIPE_ERR_SIZE_MISMATCH, "rank " + std::to_string(peer) + " sent " + std::to_string(info.length) +
                                              " bytes where " + std::to_string(bytes) + " were expected; every rank must pass the same sizes");
  return SAPIPE_OK;
}

void plugin_peer_lost(sapipe_comm_transport* t, int32_t peer, const char* reason) {
  if (t == nullptr || peer < 0 || peer >= t->size || peer == t->rank) return;
  std::lock_guard<std::mutex> lock(t->mutex);
  mark_lost(t, peer, reason ? reason : "reported lost");
}

void plugin_shutdown(sapipe_comm_transport* t) {
  if (t == nullptr) return;
  std::lock_guard<std::mutex> lock(t->mutex);
  t->shut_down = true;
}

void plugin_destroy(sapipe_comm_transport* t) {
  if (t == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(t->mutex);
    // A flush close lets messages already sent reach live peers; endpoints to lost peers, or all
    // of them once the worker is poisoned, are closed at once.
    std::vector<void*> closing;
    for (size_t r = 0; r < t->endpoints.size(); ++r) {
      if (t->endpoints[r] == nullptr) continue;
      ucp_request_param_t p = plain_param();
      p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      p.flags = (t->peers[r].lost || t->poisoned) ? UCP_EP_CLOSE_FLAG_FORCE : 0;
      ucs_status_ptr_t sp = ucp_ep_close_nbx(t->endpoints[r], &p);
      if (sp != nullptr && !UCS_PTR_IS_ERR(sp)) closing.push_back(sp);
    }
    const int64_t until = now_ms() + kCloseBoundMs;
    for (void* request : closing) {
      while (!t->poisoned && ucp_request_check_status(request) == UCS_INPROGRESS && now_ms() < until) ucp_worker_progress(t->worker);
      ucp_request_free(request);
    }
    t->endpoints.clear();
    // Messages that arrived and were never received (from a peer that died mid-collective) are
    // taken and dropped, so that UCX does not warn about each one as the worker goes.
    const int64_t drain_until = now_ms() + 100;
    std::vector<uint8_t> sink;
    ucp_tag_recv_info_t info{};
    while (!t->poisoned && now_ms() < drain_until) {
      ucp_tag_message_h message = ucp_tag_probe_nb(t->worker, 0, 0, 1, &info);
      if (message == nullptr) break;
      sink.resize(info.length ? info.length : 1);
      ucp_request_param_t p = plain_param();
      ucs_status_ptr_t sp = ucp_tag_msg_recv_nbx(t->worker, sink.data(), info.length, message, &p);
      if (UCS_PTR_IS_ERR(sp) || sp == nullptr) continue;
      while (ucp_request_check_status(sp) == UCS_INPROGRESS && now_ms() < drain_until) ucp_worker_progress(t->worker);
      if (ucp_request_check_status(sp) == UCS_INPROGRESS) {
        t->poisoned = true;  // a transfer from a dead peer that never ends: stop touching the worker
        break;
      }
      ucp_request_free(sp);
    }
    if (t->live_regions > 0) {
      // Regions are freed later (their buffers outlive the communicator); the context stays.
      release_worker(t);
      t->destroyed = true;
      return;
    }
  }
  release(t);
}

sapipe_status allocate_region(sapipe_comm_transport* t, size_t bytes, void** data, sapipe_comm_region** region);

sapipe_status plugin_region_alloc(sapipe_comm_transport* t, size_t bytes, void** data, sapipe_comm_region** region) {
  if (t == nullptr || data == nullptr || region == nullptr) return fail(SAPIPE_ERR_INVALID_ARGUMENT, "region_alloc: null argument");
  *data = nullptr;
  *region = nullptr;
  sapipe_status s = allocate_region(t, bytes, data, region);
  // Zeroed like every sapipe buffer: shared memory is, but UCX may fall back to the heap
  // (UCX_ALLOC_PRIO). Outside the mutex, so that a large region does not hold up collectives.
  if (s == SAPIPE_OK) std::memset(*data, 0, (*region)->length);
  return s;
}

// ucp_mem_map(ALLOCATE) and the region's key; under the mutex (UCX calls).
sapipe_status allocate_region(sapipe_comm_transport* t, size_t bytes, void** data, sapipe_comm_region** region) {
  std::lock_guard<std::mutex> lock(t->mutex);
  if (t->shut_down) return fail(SAPIPE_ERR_DISPOSED, "the communicator was destroyed");
  auto* r = new (std::nothrow) sapipe_comm_region();
  if (r == nullptr) return fail(SAPIPE_ERR_OUT_OF_MEMORY, "region_alloc: out of memory");
  ucp_mem_map_params_t mp;
  std::memset(&mp, 0, sizeof mp);
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  mp.address = nullptr;
  mp.length = bytes ? bytes : 1;
  mp.flags = UCP_MEM_MAP_ALLOCATE;
  ucs_status_t st = ucp_mem_map(t->context, &mp, &r->memh);
  if (st != UCS_OK) {
    delete r;
    return fail(SAPIPE_ERR_OUT_OF_MEMORY, "UCX could not allocate " + std::to_string(bytes) + " bytes: " + ucs_status_string(st));
  }
  ucp_mem_attr_t attr;
  std::memset(&attr, 0, sizeof attr);
  attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
  void* packed = nullptr;
  size_t packed_bytes = 0;
  st = ucp_mem_query(r->memh, &attr);
  if (st == UCS_OK) st = ucp_rkey_pack(t->context, r->memh, &packed, &packed_bytes);
  if (st != UCS_OK) {
    ucp_mem_unmap(t->context, r->memh);
    delete r;
    return fail(SAPIPE_ERR_OUT_OF_MEMORY, std::string("UCX could not describe its allocation: ") + ucs_status_string(st));
  }
  r->data = attr.address;
  r->length = attr.length;
  const uint64_t head[2] = {reinterpret_cast<uintptr_t>(attr.address), attr.length};
  r->key.resize(sizeof head + packed_bytes);
  std::memcpy(r->key.data(), head, sizeof head);
  std::memcpy(r->key.data() + sizeof head, packed, packed_bytes);
  ucp_rkey_buffer_release(packed);
  ++t->live_regions;
  *data = r->data;
  *region = r;
  return SAPIPE_OK;
}

sapipe_status plugin_region_key(sapipe_comm_transport* t, sapipe_comm_region* region, const void** key, size_t* bytes) {
  if (t == nullptr || region == nullptr || key == nullptr || bytes == nullptr) return fail(SAPIPE_ERR_INVALID_ARGUMENT, "region_key: null argument");
  *key = region->key.data();
  *bytes = region->key.size();
  return SAPIPE_OK;
}

void plugin_region_free(sapipe_comm_transport* t, sapipe_comm_region* region) {
  if (t == nullptr || region == nullptr) return;
  bool last = false;
  {
    std::lock_guard<std::mutex> lock(t->mutex);
    ucp_mem_unmap(t->context, region->memh);
    delete region;
    --t->live_regions;
    last = t->destroyed && t->live_regions == 0;
  }
  if (last) release(t);
}

sapipe_status plugin_peer_map(sapipe_comm_transport* t, int32_t peer, const void* key, size_t bytes, void** data, size_t* length,
                              sapipe_comm_peer_region** mapping) {
  if (t == nullptr || key == nullptr || data == nullptr || length == nullptr || mapping == nullptr)
    return fail(SAPIPE_ERR_INVALID_ARGUMENT, "peer_map: null argument");
  *mapping = nullptr;
  uint64_t head[2];
  if (bytes <= sizeof head) return fail(SAPIPE_ERR_INVALID_ARGUMENT, "peer_map: the key is too short");
  std::memcpy(head, key, sizeof head);
  std::lock_guard<std::mutex> lock(t->mutex);
  if (sapipe_status s = check_peer(t, peer, SAPIPE_COMM_CHANNEL_COLLECTIVE); s != SAPIPE_OK) return s;
  if (sapipe_status s = blocked(t, peer, SAPIPE_COMM_CHANNEL_USER); s != SAPIPE_OK) return s;
  ucp_ep_h ep = t->endpoints[static_cast<size_t>(peer)];
  if (ep == nullptr) return fail(SAPIPE_ERR_PEER_LOST, "rank " + std::to_string(peer) + " is gone");
  auto* m = new (std::nothrow) sapipe_comm_peer_region();
  if (m == nullptr) return fail(SAPIPE_ERR_OUT_OF_MEMORY, "peer_map: out of memory");
  ucs_status_t st = ucp_ep_rkey_unpack(ep, static_cast<const uint8_t*>(key) + sizeof head, &m->rkey);
  void* local = nullptr;
  if (st == UCS_OK) st = ucp_rkey_ptr(m->rkey, head[0], &local);
  if (st != UCS_OK) {
    if (m->rkey != nullptr) ucp_rkey_destroy(m->rkey);
    delete m;
    return fail(SAPIPE_ERR_BACKEND_UNAVAILABLE, "rank " + std::to_string(peer) + "'s memory cannot be mapped here: " + ucs_status_string(st));
  }
  *data = local;
  *length = head[1];
  *mapping = m;
  return SAPIPE_OK;
}

void plugin_peer_unmap(sapipe_comm_transport* t, sapipe_comm_peer_region* mapping) {
  if (t == nullptr || mapping == nullptr) return;
  std::lock_guard<std::mutex> lock(t->mutex);
  ucp_rkey_destroy(mapping->rkey);
  delete mapping;
}

const sapipe_comm_plugin_v1 kTable = {
    {SAPIPE_COMM_TRANSPORT_ABI_VERSION, sizeof(sapipe_comm_plugin_v1), "ucx"},
    plugin_library_version,
    plugin_last_error,
    plugin_create,
    plugin_local_address,
    plugin_connect,
    plugin_isend,
    plugin_wait_send,
    plugin_recv,
    plugin_peer_lost,
    plugin_shutdown,
    plugin_destroy,
    plugin_region_alloc,
    plugin_region_key,
    plugin_region_free,
    plugin_peer_map,
    plugin_peer_unmap,
};

}  // namespace

extern "C" __attribute__((visibility("default"))) const sapipe_plugin_header* sapipe_plugin_entry(uint32_t abi_version) {
  return abi_version == SAPIPE_COMM_TRANSPORT_ABI_VERSION ? &kTable.header : nullptr;
}
