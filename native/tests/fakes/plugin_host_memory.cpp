// A CUDA plugin whose "device" is host memory: every entry does on the CPU what the real plugin does
// on a GPU, synchronously (a stream is done as soon as anything is enqueued on it), with the CPU
// kernels; its NCCL joins any number of ranks, threads or processes of this machine, over Unix
// domain sockets (host_nccl.h). It lets the addon's device and NCCL bindings and the
// TypeScript above them (DeviceBuffer, DeviceParamSet, NcclCommunicator, the data-parallel trainer
// over nccl) run where no GPU is: the ordering of queued operations, the staging of host buffers,
// the guard's outcomes and the recheck, and pipeline stages or data-parallel ranks in several
// processes are exercised for real; only the GPU's arithmetic and NCCL's own transport are not
// (test/cuda/device.test.ts and nccl-ranks.test.ts check those on GPUs). Errors are the real
// plugin's: roots and peers that are no rank, a lost peer (SAPIPE_ERR_PEER_LOST).
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "../../core/update_plan.h"
#include "host_nccl.h"
#include "sapipe/kernels.h"
#include "sapipe/nn.h"
#include "sapipe/plugin.h"

namespace {

thread_local std::string last_error_text;

sapipe_status fail(sapipe_status s, const std::string& why) {
  last_error_text = why;
  return s;
}

// A stream: a distinct heap address each (the fused steps refuse one stream as both). An event
// keeps whether it was recorded since a step last waited on it: streams finish on enqueue here,
// so the only order left to check is that each bucket's event was recorded (its gradient
// enqueued) before the step that waits on it; the real plugin cannot tell (a wait on an event
// never recorded returns at once), so this plugin refuses what would race on a GPU.
//
// Streams do finish on enqueue here, but a GPU runs them concurrently: so this plugin also keeps
// the order a GPU would guarantee between them, and refuses (SAPIPE_ERR_INTERNAL, "stream order")
// a model operation, copy or update that touches memory last touched on another stream without an
// order between the two: a wait on an event recorded behind that access, or a host
// synchronisation of that stream (stream_synchronize, free_device) before this one was enqueued.
// Each stream's operations are numbered; a stream's clock says how far it is ordered behind every
// other (a vector clock); an allocation keeps the last access of each stream. The legacy default
// stream (id 0) is a stream like any other: the plugin's streams are non-blocking. With
// SAPIPE_FAKE_STREAM_LOG set, each checked operation appends "<op> <stream id>" to that file.
using Clock = std::map<uint64_t, uint64_t>;  // stream id -> operations it is ordered behind

void merge(Clock& into, const Clock& from) {
  for (const auto& [id, n] : from)
    if (into[id] < n) into[id] = n;
}

struct Event {
  bool recorded = false;
  Clock clock;  // the recording stream's clock, itself included
};

struct StreamClock {
  uint64_t id = 0;
  uint64_t seq = 0;
  Clock known;
};

struct Allocation {
  size_t bytes = 0;
  Clock last;  // stream id -> its last operation on this memory
};

struct Order {
  std::mutex mutex;
  uint64_t next_id = 1;
  std::map<const void*, StreamClock> streams;  // nullptr: the legacy default stream (id 0)
  std::map<uintptr_t, Allocation> allocations;
  Clock host;  // what the host has seen complete
};

Order& order() {
  static Order o;
  return o;
}

StreamClock& clock_of(Order& o, const void* stream) {
  auto it = o.streams.find(stream);
  if (it == o.streams.end()) it = o.streams.emplace(stream, StreamClock{}).first;  // the legacy stream on first use
  return it->second;
}

// The pointer arguments an operation touches (host pointers and shapes find no allocation).
template <class T>
std::enable_if_t<std::is_arithmetic_v<T>> touched(std::vector<const void*>&, T) {}
void touched(std::vector<const void*>&, void*) {}  // the stream
void touched(std::vector<const void*>&, const sapipe_nn_conv2d_shape*) {}
void touched(std::vector<const void*>& out, const float* p) { out.push_back(p); }
void touched(std::vector<const void*>& out, const sapipe_nn_gemm_args* g) {
  if (g != nullptr) out.insert(out.end(), {g->a, g->b, g->c});
}
void touched(std::vector<const void*>& out, const sapipe_update_buffers* b) {
  if (b != nullptr)
    out.insert(out.end(), {b->weights, b->grad, b->momentum, b->second_moment, b->backup, b->predicted, b->local_grad, b->prev_local_grad,
                           b->weights_in});
}

// The allocation holding p, or nullptr (host memory, a shape, no pointer).
Allocation* allocation_of(Order& o, const void* p) {
  if (p == nullptr) return nullptr;
  const auto at = reinterpret_cast<uintptr_t>(p);
  auto it = o.allocations.upper_bound(at);
  if (it == o.allocations.begin()) return nullptr;
  --it;
  return at < it->first + std::max<size_t>(it->second.bytes, 1) ? &it->second : nullptr;
}

// One operation `op` enqueued on `stream` touching `pointers`: refused when it is not ordered
// behind another stream's last access to the same memory.
sapipe_status enqueue(const char* op, const void* stream, const std::vector<const void*>& pointers) {
  Order& o = order();
  std::lock_guard<std::mutex> lock(o.mutex);
  StreamClock& s = clock_of(o, stream);
  merge(s.known, o.host);
  ++s.seq;
  for (const void* p : pointers) {
    Allocation* a = allocation_of(o, p);
    if (a == nullptr) continue;
    for (const auto& [other, n] : a->last) {
      if (other == s.id) continue;
      auto k = s.known.find(other);
      if (k == s.known.end() || k->second < n)
        return fail(SAPIPE_ERR_INTERNAL, std::string("stream order: ") + op + " on stream " + std::to_string(s.id) +
                                             " touches memory that stream " + std::to_string(other) +
                                             " used without an event wait or host synchronisation between them (a race on a GPU)");
    }
  }
  for (const void* p : pointers)
    if (Allocation* a = allocation_of(o, p)) a->last[s.id] = s.seq;
  if (const char* path = std::getenv("SAPIPE_FAKE_STREAM_LOG"); path != nullptr && *path != 0) {
    if (std::FILE* f = std::fopen(path, "a")) {
      std::fprintf(f, "%s %llu\n", op, static_cast<unsigned long long>(s.id));
      std::fclose(f);
    }
  }
  return SAPIPE_OK;
}

// The host has waited for `stream` (or, for every stream, the device: cudaFree).
void host_saw(const void* stream) {
  Order& o = order();
  std::lock_guard<std::mutex> lock(o.mutex);
  StreamClock& s = clock_of(o, stream);
  merge(o.host, s.known);
  if (o.host[s.id] < s.seq) o.host[s.id] = s.seq;
}

void host_saw_all() {
  Order& o = order();
  std::lock_guard<std::mutex> lock(o.mutex);
  for (auto& [key, s] : o.streams) {
    if (o.host[s.id] < s.seq) o.host[s.id] = s.seq;
  }
}

// The CPU's model operation `Member`, checked for stream order first (the stream is every entry's
// last argument).
template <class F, F sapipe_nn_ops::*Member>
struct Checked;
template <class... A, sapipe_status (*sapipe_nn_ops::*Member)(A...)>
struct Checked<sapipe_status (*)(A...), Member> {
  static sapipe_status call(A... a) {
    std::vector<const void*> pointers;
    (touched(pointers, a), ...);
    const void* stream = std::get<sizeof...(A) - 1>(std::tie(a...));
    if (sapipe_status s = enqueue("nn", stream, pointers); s != SAPIPE_OK) return s;
    return (sapipe_cpu_nn_ops()->*Member)(a...);
  }
};
#define SAPIPE_CHECKED(member) t.member = &Checked<decltype(t.member), &sapipe_nn_ops::member>::call

const sapipe_nn_ops* checked_nn_ops() {
  static const sapipe_nn_ops table = [] {
    sapipe_nn_ops t = *sapipe_cpu_nn_ops();
    SAPIPE_CHECKED(gemm);
    SAPIPE_CHECKED(bias_add);
    SAPIPE_CHECKED(bias_grad);
    SAPIPE_CHECKED(relu);
    SAPIPE_CHECKED(relu_backward);
    SAPIPE_CHECKED(softmax_xent);
    SAPIPE_CHECKED(gelu);
    SAPIPE_CHECKED(gelu_backward);
    SAPIPE_CHECKED(add);
    SAPIPE_CHECKED(layer_norm);
    SAPIPE_CHECKED(layer_norm_backward);
    SAPIPE_CHECKED(embedding);
    SAPIPE_CHECKED(embedding_backward);
    SAPIPE_CHECKED(dropout);
    SAPIPE_CHECKED(attention);
    SAPIPE_CHECKED(attention_backward);
    SAPIPE_CHECKED(conv2d);
    SAPIPE_CHECKED(conv2d_backward);
    SAPIPE_CHECKED(pool2d);
    SAPIPE_CHECKED(pool2d_backward);
    return t;
  }();
  return &table;
}
#undef SAPIPE_CHECKED

struct Comm {
  sapipe::fakes::HostNccl* ranks = nullptr;  // null for one rank: nothing to join
  int32_t rank = 0;
  int32_t size = 1;
  sapipe_nccl_step_result last{};
  ~Comm() { delete ranks; }
};

// Runs a collective over the ranks (none with one rank), recording its reason on failure.
template <class Call>
sapipe_status over_ranks(Comm* c, Call call) {
  std::string why;
  const sapipe_status s = call(*c->ranks, &why);
  return s == SAPIPE_OK ? s : fail(s, why);
}

bool valid_op(int32_t op) { return op == SAPIPE_NCCL_SUM || op == SAPIPE_NCCL_AVG; }

sapipe_status check_comm(void* comm) {
  return comm == nullptr ? fail(SAPIPE_ERR_INVALID_ARGUMENT, "the communicator is null") : SAPIPE_OK;
}

// The real plugin's checks of a fused step's arguments (native/cuda/nccl_entry.cpp).
sapipe_status check_step(void* comm, const sapipe_update_config* config, const sapipe_update_buffers* buffers, void* comm_stream,
                         void* compute_stream) {
  if (sapipe_status s = check_comm(comm); s != SAPIPE_OK) return s;
  if (config == nullptr || buffers == nullptr) return fail(SAPIPE_ERR_INVALID_ARGUMENT, "fused step: null config or buffers");
  if (comm_stream == compute_stream) return fail(SAPIPE_ERR_INVALID_ARGUMENT, "fused step: the two streams must differ");
  if (sapipe_status s = sapipe::core::check_update_config(*config); s != SAPIPE_OK) return fail(s, "fused step: bad config");
  if (sapipe_status s = sapipe::core::check_update_buffers(*config, *buffers); s != SAPIPE_OK) return fail(s, "fused step: bad buffers");
  return SAPIPE_OK;
}

void copy_if_apart(float* dst, const float* src, size_t count) {
  if (dst != src && count > 0) std::memmove(dst, src, count * sizeof(float));
}

// Whether a sum of `size` finite inputs of squared norm `norm` could overflow (bucket_update.cu).
bool overflow_risk(int64_t bad, double norm, int32_t size) {
  return bad == 0 && !(std::sqrt(norm) * size < static_cast<double>(FLT_MAX) / 2);
}

// The real fused step's guard on one rank: the non-finite inputs, and whether a sum of `size`
// inputs bounded by the norm could overflow (native/cuda/bucket_update.cu).
void guard(const sapipe_update_config& config, const sapipe_update_buffers& b, int32_t size, int64_t* bad, bool* risk) {
  int64_t n = 0;
  sapipe_cpu_count_non_finite(b.grad + b.offset, b.count, &n);
  if (sapipe::core::update_reads_local_grad(config)) {
    int64_t m = 0;
    sapipe_cpu_count_non_finite(b.local_grad + b.offset, b.count, &m);
    n += m;
  }
  double norm = 0;
  sapipe_cpu_squared_norm(b.grad + b.offset, b.count, &norm);
  *bad = n;
  *risk = overflow_risk(n, norm, size);
}

// The guard's two words summed over the ranks, and the step's outcome from them (c->last).
sapipe_status agree_on_guard(Comm* c, int64_t bad, bool risk) {
  if (c->size > 1) {
    float words[2] = {static_cast<float>(bad), risk ? 1.0f : 0.0f};
    if (sapipe_status s = over_ranks(c, [&](auto& r, std::string* why) { return r.all_reduce(words, words, 2, false, why); }); s != SAPIPE_OK)
      return s;
    bad = static_cast<int64_t>(words[0]);
    risk = words[0] == 0.0f && words[1] != 0.0f;
  }
  c->last = {bad == 0 && !risk ? 1 : 0, risk ? 1 : 0, bad};
  return SAPIPE_OK;
}

sapipe_status update_range(const sapipe_update_config& config, const sapipe_update_buffers& b, size_t offset, size_t count) {
  sapipe_update_config c = config;
  c.grad_checked = 1;
  sapipe_update_buffers part = b;
  part.offset = offset;
  part.count = count;
  sapipe_update_result r{};
  if (sapipe_status s = sapipe_cpu_update(&c, &part, &r); s != SAPIPE_OK) return fail(s, "fused step: the update refused its buffers");
  return SAPIPE_OK;
}

// The sharded step's all-gathers in place: every rank's part of the weights and predicted weights.
sapipe_status gather_parts(Comm* c, const sapipe_update_buffers& b) {
  if (c->size == 1) return SAPIPE_OK;
  const size_t part = b.count / static_cast<size_t>(c->size);
  const size_t own = b.offset + static_cast<size_t>(c->rank) * part;
  for (float* x : {b.weights, b.predicted})
    if (x != nullptr)
      if (sapipe_status s = over_ranks(c, [&](auto& r, std::string* why) { return r.all_gather(x + own, x + b.offset, part, why); });
          s != SAPIPE_OK)
        return s;
  return SAPIPE_OK;
}

sapipe_cuda_plugin_v1 make_table() {
  sapipe_cuda_plugin_v1 t;
  std::memset(&t, 0, sizeof t);
  t.header = {SAPIPE_CUDA_PLUGIN_ABI_VERSION, sizeof(sapipe_cuda_plugin_v1), "cuda"};
  t.build_architectures = [] { return "host-memory emulation"; };
  t.runtime_version = []() -> int32_t { return 13000; };
  t.last_error = [] { return last_error_text.c_str(); };
  t.device_count = [](int32_t* n) {
    if (n == nullptr) return fail(SAPIPE_ERR_INVALID_ARGUMENT, "device_count: null");
    *n = 1;
    return SAPIPE_OK;
  };
  t.device_info = [](int32_t device, sapipe_cuda_device_info* out) {
    if (device != 0 || out == nullptr) return fail(SAPIPE_ERR_BACKEND_UNAVAILABLE, "cuda:" + std::to_string(device) + " does not exist");
    std::memset(out, 0, sizeof *out);
    std::strncpy(out->name, "host memory (emulated device)", sizeof out->name - 1);
    out->major = 9, out->minor = 0, out->multiprocessors = 1, out->total_memory = uint64_t{1} << 32, out->kernels_available = 1;
    return SAPIPE_OK;
  };
  t.set_device = [](int32_t device) { return device == 0 ? SAPIPE_OK : fail(SAPIPE_ERR_BACKEND_UNAVAILABLE, "only cuda:0 is emulated"); };
  t.malloc_device = [](void** ptr, size_t bytes) {
    if (ptr == nullptr) return fail(SAPIPE_ERR_INVALID_ARGUMENT, "malloc_device: null");
    *ptr = std::calloc(std::max<size_t>(bytes, 1), 1);
    if (*ptr == nullptr) return fail(SAPIPE_ERR_OUT_OF_MEMORY, "malloc_device");
    Order& o = order();
    std::lock_guard<std::mutex> lock(o.mutex);
    o.allocations[reinterpret_cast<uintptr_t>(*ptr)] = Allocation{bytes, {}};
    return SAPIPE_OK;
  };
  t.free_device = [](void* ptr) {
    // cudaFree waits for the device: every stream's work so far is done.
    host_saw_all();
    {
      Order& o = order();
      std::lock_guard<std::mutex> lock(o.mutex);
      o.allocations.erase(reinterpret_cast<uintptr_t>(ptr));
    }
    std::free(ptr);
    return SAPIPE_OK;
  };
  t.copy_to_device = [](void* dst, const void* src, size_t bytes, void* stream) {
    if (sapipe_status s = enqueue("copy", stream, {dst, src}); s != SAPIPE_OK) return s;
    std::memmove(dst, src, bytes);
    return SAPIPE_OK;
  };
  t.copy_to_host = t.copy_to_device;
  t.copy_on_device = t.copy_to_device;
  t.stream_create = [](void** stream) {
    if (stream == nullptr) return fail(SAPIPE_ERR_INVALID_ARGUMENT, "stream_create: null");
    *stream = new int(0);
    Order& o = order();
    std::lock_guard<std::mutex> lock(o.mutex);
    StreamClock& c = o.streams[*stream];
    c = StreamClock{};
    c.id = o.next_id++;
    return SAPIPE_OK;
  };
  t.stream_destroy = [](void* stream) {
    {
      // Its clock is dropped with it (the address may be reused); memory it touched keeps the id.
      Order& o = order();
      std::lock_guard<std::mutex> lock(o.mutex);
      o.streams.erase(stream);
    }
    delete static_cast<int*>(stream);
    return SAPIPE_OK;
  };
  t.stream_synchronize = [](void* stream) {
    host_saw(stream);
    return SAPIPE_OK;
  };
  t.event_create = [](void** event) {
    if (event == nullptr) return fail(SAPIPE_ERR_INVALID_ARGUMENT, "event_create: null");
    *event = new Event();
    return SAPIPE_OK;
  };
  t.event_destroy = [](void* event) {
    delete static_cast<Event*>(event);
    return SAPIPE_OK;
  };
  t.event_record = [](void* event, void* stream) {
    if (event == nullptr) return fail(SAPIPE_ERR_INVALID_ARGUMENT, "event_record: null event");
    auto* e = static_cast<Event*>(event);
    e->recorded = true;
    Order& o = order();
    std::lock_guard<std::mutex> lock(o.mutex);
    StreamClock& s = clock_of(o, stream);
    merge(s.known, o.host);
    e->clock = s.known;
    e->clock[s.id] = s.seq;
    return SAPIPE_OK;
  };
  t.stream_wait_event = [](void* stream, void* event) {
    if (event == nullptr) return fail(SAPIPE_ERR_INVALID_ARGUMENT, "stream_wait_event: null event");
    Order& o = order();
    std::lock_guard<std::mutex> lock(o.mutex);
    merge(clock_of(o, stream).known, static_cast<Event*>(event)->clock);
    return SAPIPE_OK;
  };
  t.update_async = [](const sapipe_update_config* config, const sapipe_update_buffers* buffers, uint16_t*, int64_t* guard_count,
                       void* stream) {
    std::vector<const void*> pointers;
    touched(pointers, buffers);
    if (sapipe_status s = enqueue("update", stream, pointers); s != SAPIPE_OK) return s;
    sapipe_update_result r{};
    if (sapipe_status s = sapipe_cpu_update(config, buffers, &r); s != SAPIPE_OK) return fail(s, "update: refused");
    if (guard_count != nullptr) *guard_count = r.non_finite_count;
    return SAPIPE_OK;
  };
  t.update = [](const sapipe_update_config* config, const sapipe_update_buffers* buffers, uint16_t*, sapipe_update_result* result,
                 void* stream) {
    std::vector<const void*> pointers;
    touched(pointers, buffers);
    if (sapipe_status s = enqueue("update", stream, pointers); s != SAPIPE_OK) return s;
    if (sapipe_status s = sapipe_cpu_update(config, buffers, result); s != SAPIPE_OK) return fail(s, "update: refused");
    host_saw(stream);  // the real entry waits for the stream to fill the result
    return SAPIPE_OK;
  };
  t.elastic_average = [](float* worker, float* center, size_t count, float alpha, void*) {
    return sapipe_cpu_elastic_average(worker, center, count, alpha);
  };
  t.sum = [](float* out, const float* const* inputs, size_t num_inputs, size_t count, float scale, int64_t* bad, void*) {
    int64_t n = 0;
    sapipe_status s = sapipe_cpu_sum(out, inputs, num_inputs, count, scale, &n);
    if (bad != nullptr) *bad = n;  // the real entry clears the word first
    return s;
  };
  t.scale = [](float* x, size_t count, float scale, void*) { return sapipe_cpu_scale(x, count, scale); };
  t.axpy = [](float* y, const float* x, size_t count, float a, void*) { return sapipe_cpu_axpy(y, x, count, a); };
  t.squared_norm = [](const float* x, size_t count, double* out, void*) { return sapipe_cpu_squared_norm(x, count, out); };
  t.count_non_finite = [](const float* x, size_t count, int64_t* out, void*) {
    int64_t n = 0;
    sapipe_status s = sapipe_cpu_count_non_finite(x, count, &n);
    *out = n;  // the real entry clears the word, then its kernel adds
    return s;
  };
  t.nccl_probe = [](int32_t* version, const char** path) {
    if (version != nullptr) *version = 22809;
    if (path != nullptr) *path = "host-memory emulation (ranks over Unix sockets)";
    return SAPIPE_OK;
  };
  t.bench_update = [](const sapipe_update_config*, size_t, int32_t, int32_t, sapipe_cuda_bench_result*) {
    return fail(SAPIPE_ERR_BACKEND_UNAVAILABLE, "the host-memory emulation has no timings");
  };
  t.stream_query = [](void* stream, int32_t* done) {
    if (done == nullptr) return fail(SAPIPE_ERR_INVALID_ARGUMENT, "stream_query: null");
    *done = 1;
    host_saw(stream);
    return SAPIPE_OK;
  };
  t.nccl_get_unique_id = [](uint8_t id[SAPIPE_NCCL_UNIQUE_ID_BYTES]) {
    if (id == nullptr) return fail(SAPIPE_ERR_INVALID_ARGUMENT, "nccl_get_unique_id: null");
    sapipe::fakes::HostNccl::unique_id(id);
    return SAPIPE_OK;
  };
  t.nccl_comm_init_rank = [](void** comm, int32_t size, const uint8_t* id, int32_t rank) {
    if (comm == nullptr || id == nullptr) return fail(SAPIPE_ERR_INVALID_ARGUMENT, "nccl_comm_init_rank: null");
    *comm = nullptr;
    if (size < 1 || rank < 0 || rank >= size) return fail(SAPIPE_ERR_INVALID_ARGUMENT, "nccl_comm_init_rank: rank must be in [0, size)");
    auto c = std::make_unique<Comm>();
    c->rank = rank, c->size = size;
    if (size > 1) {
      std::string why;
      if (sapipe_status s = sapipe::fakes::HostNccl::join(id, size, rank, &c->ranks, &why); s != SAPIPE_OK) return fail(s, why);
    }
    *comm = c.release();
    return SAPIPE_OK;
  };
  t.nccl_comm_destroy = [](void* comm) {
    delete static_cast<Comm*>(comm);
    return SAPIPE_OK;
  };
  t.nccl_comm_abort = t.nccl_comm_destroy;
  t.nccl_comm_async_error = [](void* comm, int32_t* result) {
    if (result == nullptr) return fail(SAPIPE_ERR_INVALID_ARGUMENT, "nccl_comm_async_error: null");
    const auto* c = static_cast<Comm*>(comm);
    // ncclSystemError once a peer was lost (the entries themselves already failed then).
    *result = c != nullptr && c->ranks != nullptr && c->ranks->broken() ? 2 : 0;
    return SAPIPE_OK;
  };
  // The collectives: with one rank, a copy (a sum or an average of one contribution is that
  // contribution); with more, over the ranks (host_nccl.h).
  t.nccl_all_reduce = [](void* comm, const float* send, float* recv, size_t count, int32_t op, void*) {
    if (sapipe_status s = check_comm(comm); s != SAPIPE_OK) return s;
    if (send == nullptr || recv == nullptr || !valid_op(op)) return fail(SAPIPE_ERR_INVALID_ARGUMENT, "all_reduce: null buffer or unknown op");
    auto* c = static_cast<Comm*>(comm);
    if (c->size == 1) {
      copy_if_apart(recv, send, count);
      return SAPIPE_OK;
    }
    return over_ranks(c, [&](auto& r, std::string* why) { return r.all_reduce(send, recv, count, op == SAPIPE_NCCL_AVG, why); });
  };
  t.nccl_reduce_scatter = [](void* comm, const float* send, float* recv, size_t count, int32_t op, void*) {
    if (sapipe_status s = check_comm(comm); s != SAPIPE_OK) return s;
    if (send == nullptr || recv == nullptr || !valid_op(op))
      return fail(SAPIPE_ERR_INVALID_ARGUMENT, "reduce_scatter: null buffer or unknown op");
    auto* c = static_cast<Comm*>(comm);
    if (c->size == 1) {
      copy_if_apart(recv, send, count);
      return SAPIPE_OK;
    }
    return over_ranks(c, [&](auto& r, std::string* why) { return r.reduce_scatter(send, recv, count, op == SAPIPE_NCCL_AVG, why); });
  };
  t.nccl_all_gather = [](void* comm, const float* send, float* recv, size_t count, void*) {
    if (sapipe_status s = check_comm(comm); s != SAPIPE_OK) return s;
    if (send == nullptr || recv == nullptr) return fail(SAPIPE_ERR_INVALID_ARGUMENT, "all_gather: null buffer");
    auto* c = static_cast<Comm*>(comm);
    if (c->size == 1) {
      copy_if_apart(recv, send, count);
      return SAPIPE_OK;
    }
    return over_ranks(c, [&](auto& r, std::string* why) { return r.all_gather(send, recv, count, why); });
  };
  t.nccl_broadcast = [](void* comm, const float* send, float* recv, size_t count, int32_t root, void*) {
    if (sapipe_status s = check_comm(comm); s != SAPIPE_OK) return s;
    auto* c = static_cast<Comm*>(comm);
    if (root < 0 || root >= c->size) return fail(SAPIPE_ERR_INVALID_ARGUMENT, "broadcast: root " + std::to_string(root) + " is no rank");
    if (c->size == 1) {
      copy_if_apart(recv, send, count);
      return SAPIPE_OK;
    }
    return over_ranks(c, [&](auto& r, std::string* why) { return r.broadcast(send, recv, count, root, why); });
  };
  t.nccl_send = [](void* comm, const float* buffer, size_t count, int32_t peer, void*) {
    if (sapipe_status s = check_comm(comm); s != SAPIPE_OK) return s;
    auto* c = static_cast<Comm*>(comm);
    if (peer < 0 || peer >= c->size || peer == c->rank)
      return fail(SAPIPE_ERR_INVALID_ARGUMENT, "send: peer " + std::to_string(peer) + " is no other rank");
    if (buffer == nullptr) return fail(SAPIPE_ERR_INVALID_ARGUMENT, "send: null buffer");
    return over_ranks(c, [&](auto& r, std::string* why) { return r.send(buffer, count, peer, why); });
  };
  t.nccl_recv = [](void* comm, float* buffer, size_t count, int32_t peer, void*) {
    if (sapipe_status s = check_comm(comm); s != SAPIPE_OK) return s;
    auto* c = static_cast<Comm*>(comm);
    if (peer < 0 || peer >= c->size || peer == c->rank)
      return fail(SAPIPE_ERR_INVALID_ARGUMENT, "recv: peer " + std::to_string(peer) + " is no other rank");
    if (buffer == nullptr) return fail(SAPIPE_ERR_INVALID_ARGUMENT, "recv: null buffer");
    return over_ranks(c, [&](auto& r, std::string* why) { return r.recv(buffer, count, peer, why); });
  };
  // The real fused steps (native/cuda/bucket_update.cu) over the ranks: the guard's two words
  // summed over the ranks, then the buckets summed in place (config.grad_scale folds in 1/size)
  // and updated in order; sharded, the gradient reduce-scattered, the own part updated and the
  // weights (and predicted weights) gathered.
  t.nccl_fused_update = [](void* comm, const sapipe_update_config* config, const sapipe_update_buffers* buffers,
                           const size_t* bucket_counts, size_t num_buckets, int32_t sharded, void* comm_stream, void* compute_stream) {
    if (sapipe_status s = check_step(comm, config, buffers, comm_stream, compute_stream); s != SAPIPE_OK) return s;
    auto* c = static_cast<Comm*>(comm);
    if (!sharded) {
      size_t total = 0;
      for (size_t i = 0; bucket_counts != nullptr && i < num_buckets; ++i) total += bucket_counts[i];
      if (bucket_counts == nullptr || num_buckets == 0 || total != buffers->count)
        return fail(SAPIPE_ERR_SIZE_MISMATCH, "fused step: the bucket counts must be at least one and sum to the element count");
    } else if (buffers->count % static_cast<size_t>(c->size) != 0) {
      return fail(SAPIPE_ERR_SIZE_MISMATCH, "sharded update: the element count must be a multiple of the world size");
    }
    // The gradient is reduced in place, as the real step does (the ABI's const is the update's view of it).
    float* grad = const_cast<float*>(buffers->grad);
    int64_t bad = 0;
    bool risk = false;
    guard(*config, *buffers, c->size, &bad, &risk);
    if (sapipe_status s = agree_on_guard(c, bad, risk); s != SAPIPE_OK) return s;
    if (!c->last.applied) return SAPIPE_OK;
    if (sharded) {
      const size_t part = buffers->count / static_cast<size_t>(c->size);
      const size_t own = buffers->offset + static_cast<size_t>(c->rank) * part;
      if (c->size > 1)
        if (sapipe_status s = over_ranks(c, [&](auto& r, std::string* why) {
              return r.reduce_scatter(grad + buffers->offset, grad + own, part, false, why);
            });
            s != SAPIPE_OK)
          return s;
      if (sapipe_status s = update_range(*config, *buffers, own, part); s != SAPIPE_OK) return s;
      return gather_parts(c, *buffers);
    }
    size_t at = buffers->offset;
    for (size_t i = 0; i < num_buckets; ++i) {
      const size_t count = bucket_counts[i];
      if (c->size > 1)
        if (sapipe_status s = over_ranks(c, [&](auto& r, std::string* why) {
              return r.all_reduce(grad + at, grad + at, count, false, why);
            });
            s != SAPIPE_OK)
          return s;
      if (sapipe_status s = update_range(*config, *buffers, at, count); s != SAPIPE_OK) return s;
      at += count;
    }
    return SAPIPE_OK;
  };
  // nccl_fused_update_after as native/cuda/bucket_update.cu runs it: every bucket's event must
  // have been recorded since the last step that waited on it (else the real step's wait would
  // not order its reduction after the gradient: refused, before anything is reduced); then from
  // the last bucket to the first, this rank's count and norm of the bucket and its sum over the
  // ranks; the guard's two words over the ranks; the update of the whole set unless skipped.
  t.nccl_fused_update_after = [](void* comm, const sapipe_update_config* config, const sapipe_update_buffers* buffers,
                                 const size_t* bucket_counts, void* const* ready, size_t num_buckets, void* comm_stream,
                                 void* compute_stream) {
    if (sapipe_status s = check_step(comm, config, buffers, comm_stream, compute_stream); s != SAPIPE_OK) return s;
    auto* c = static_cast<Comm*>(comm);
    size_t total = 0;
    for (size_t i = 0; bucket_counts != nullptr && i < num_buckets; ++i) total += bucket_counts[i];
    if (bucket_counts == nullptr || ready == nullptr || num_buckets == 0 || total != buffers->count)
      return fail(SAPIPE_ERR_SIZE_MISMATCH, "fused step after events: the bucket counts must be at least one and sum to the element count");
    for (size_t i = 0; i < num_buckets; ++i) {
      if (ready[i] == nullptr) return fail(SAPIPE_ERR_INVALID_ARGUMENT, "fused step after events: bucket " + std::to_string(i) + " has no event");
      if (!static_cast<const Event*>(ready[i])->recorded)
        return fail(SAPIPE_ERR_INVALID_ARGUMENT, "fused step after events: the event of bucket " + std::to_string(i) +
                                                     " was not recorded since the last step waited on it, so its reduction would not wait for its gradient");
    }
    for (size_t i = 0; i < num_buckets; ++i) static_cast<Event*>(ready[i])->recorded = false;
    float* grad = const_cast<float*>(buffers->grad);
    int64_t bad = 0;
    double norm = 0;
    size_t end = buffers->offset + buffers->count;
    for (size_t k = num_buckets; k-- > 0;) {
      const size_t at = end - bucket_counts[k];
      int64_t n = 0;
      sapipe_cpu_count_non_finite(grad + at, bucket_counts[k], &n);
      bad += n;
      if (sapipe::core::update_reads_local_grad(*config)) {
        sapipe_cpu_count_non_finite(buffers->local_grad + at, bucket_counts[k], &n);
        bad += n;
      }
      double part = 0;
      sapipe_cpu_squared_norm(grad + at, bucket_counts[k], &part);
      norm += part;
      if (c->size > 1)
        if (sapipe_status s = over_ranks(c, [&](auto& r, std::string* why) { return r.all_reduce(grad + at, grad + at, bucket_counts[k], false, why); });
            s != SAPIPE_OK)
          return s;
      end = at;
    }
    if (sapipe_status s = agree_on_guard(c, bad, overflow_risk(bad, norm, c->size)); s != SAPIPE_OK) return s;
    if (!c->last.applied) return SAPIPE_OK;
    return update_range(*config, *buffers, buffers->offset, buffers->count);
  };
  t.nccl_fused_update_recheck = [](void* comm, const sapipe_update_config* config, const sapipe_update_buffers* buffers, int32_t sharded,
                                   void* comm_stream, void* compute_stream) {
    if (sapipe_status s = check_step(comm, config, buffers, comm_stream, compute_stream); s != SAPIPE_OK) return s;
    auto* c = static_cast<Comm*>(comm);
    if (sharded && buffers->count % static_cast<size_t>(c->size) != 0)
      return fail(SAPIPE_ERR_SIZE_MISMATCH, "update recheck: the element count must be a multiple of the world size");
    const size_t part = sharded ? buffers->count / static_cast<size_t>(c->size) : buffers->count;
    const size_t own = sharded ? buffers->offset + static_cast<size_t>(c->rank) * part : buffers->offset;
    int64_t bad = 0;
    sapipe_cpu_count_non_finite(buffers->grad + own, part, &bad);
    // Replicated, every rank holds the same reduced gradient and count: no collective needed.
    if (sharded && c->size > 1) {
      float word = static_cast<float>(bad);
      if (sapipe_status s = over_ranks(c, [&](auto& r, std::string* why) { return r.all_reduce(&word, &word, 1, false, why); }); s != SAPIPE_OK)
        return s;
      bad = static_cast<int64_t>(word);
    }
    c->last = {bad == 0 ? 1 : 0, 0, bad};
    if (bad != 0) return SAPIPE_OK;
    if (sapipe_status s = update_range(*config, *buffers, own, part); s != SAPIPE_OK) return s;
    return sharded ? gather_parts(c, *buffers) : SAPIPE_OK;
  };
  t.nccl_fused_update_result = [](void* comm, sapipe_nccl_step_result* out) {
    if (sapipe_status s = check_comm(comm); s != SAPIPE_OK) return s;
    if (out == nullptr) return fail(SAPIPE_ERR_INVALID_ARGUMENT, "nccl_fused_update_result: null");
    *out = static_cast<Comm*>(comm)->last;
    return SAPIPE_OK;
  };
  t.topk_select = [](const float* grad, float* residual, size_t count, size_t k, int32_t rounds, int32_t* indices, float* values,
                     sapipe_topk_stats* stats, void*) {
    return sapipe_cpu_topk_select(grad, residual, count, k, rounds, indices, values, stats);
  };
  t.scatter_add = [](float* out, size_t count, const int32_t* indices, const float* values, size_t n, float scale, int64_t* bad, void*) {
    int64_t skipped = 0;
    for (size_t i = 0; i < n; ++i) {
      if (indices[i] < 0 || static_cast<size_t>(indices[i]) >= count)
        ++skipped;
      else
        out[indices[i]] += scale * values[i];
    }
    if (bad != nullptr) *bad += skipped;
    return SAPIPE_OK;
  };
  t.zero = [](float* x, size_t count, void*) {
    std::memset(x, 0, count * sizeof(float));
    return SAPIPE_OK;
  };
  // The model operations: the CPU's, on the emulated device's (host) memory, each checked for
  // stream order first.
  t.nn_ops = [] { return checked_nn_ops(); };
  t.cublas_probe = [](int32_t* version, const char** path) {
    if (version != nullptr) *version = 0;
    if (path != nullptr) *path = "host-memory emulation (the CPU's SGEMM)";
    return SAPIPE_OK;
  };
  return t;
}

const sapipe_cuda_plugin_v1 kTable = make_table();

}  // namespace

extern "C" __attribute__((visibility("default"))) const sapipe_plugin_header* sapipe_plugin_entry(uint32_t abi) {
  return abi == SAPIPE_CUDA_PLUGIN_ABI_VERSION ? &kTable.header : nullptr;
}
