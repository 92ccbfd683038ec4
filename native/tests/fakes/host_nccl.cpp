#include "host_nccl.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>

namespace sapipe::fakes {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint8_t kMarker[4] = {'S', 'H', 'N', 'C'};
constexpr size_t kTokenBytes = 16;
constexpr int64_t kDefaultTimeoutMs = 30000;

// The operations, as their headers name them.
enum Op : uint32_t { kHello = 1, kAllReduce, kReduceScatter, kAllGather, kBroadcast, kSend, kSendTaken };

struct Header {
  uint32_t op;
  uint32_t from;
  uint64_t bytes;
};
static_assert(sizeof(Header) == 16, "a fixed header");

const char* op_name(uint32_t op) {
  switch (op) {
    case kHello: return "join";
    case kAllReduce: return "all_reduce";
    case kReduceScatter: return "reduce_scatter";
    case kAllGather: return "all_gather";
    case kBroadcast: return "broadcast";
    case kSend: return "send";
    case kSendTaken: return "recv's acknowledgement";
    default: return "an unknown operation";
  }
}

int64_t timeout_from_env() {
  const char* v = std::getenv("SAPIPE_HOST_NCCL_TIMEOUT_MS");
  if (v == nullptr || *v == '\0') return kDefaultTimeoutMs;
  char* end = nullptr;
  const long long ms = std::strtoll(v, &end, 10);
  return end != nullptr && *end == '\0' && ms > 0 ? ms : kDefaultTimeoutMs;
}

// The abstract socket address of a rank of the clique with this token.
sockaddr_un address_of(const uint8_t* token, int32_t rank, socklen_t* length) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::string name = "sapipe-host-nccl-";
  static const char* hex = "0123456789abcdef";
  for (size_t i = 0; i < kTokenBytes; ++i) {
    name += hex[token[i] >> 4];
    name += hex[token[i] & 15];
  }
  name += "-" + std::to_string(rank);
  // sun_path[0] = 0: the abstract namespace.
  std::memcpy(a.sun_path + 1, name.data(), name.size());
  *length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return a;
}

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left, 1000));
}

bool set_nonblocking(int fd) {
  const int flags = fcntl(fd, F_GETFL, 0);
  return flags >= 0 && fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0;
}

// Reads or writes exactly `bytes` on a blocking-with-deadline basis (used while joining only).
bool move_all(int fd, void* data, size_t bytes, bool write, Clock::time_point deadline) {
  auto* p = static_cast<char*>(data);
  size_t done = 0;
  while (done < bytes) {
    pollfd pfd{fd, static_cast<short>(write ? POLLOUT : POLLIN), 0};
    const int ready = poll(&pfd, 1, remaining_ms(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) return false;
    const ssize_t n = write ? ::send(fd, p + done, bytes - done, MSG_NOSIGNAL) : ::recv(fd, p + done, bytes - done, 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

void HostNccl::unique_id(uint8_t id[SAPIPE_NCCL_UNIQUE_ID_BYTES]) {
  std::memset(id, 0, SAPIPE_NCCL_UNIQUE_ID_BYTES);
  std::memcpy(id, kMarker, sizeof kMarker);
  std::random_device random;
  for (size_t i = 0; i < kTokenBytes; ++i) id[sizeof kMarker + i] = static_cast<uint8_t>(random());
}

sapipe_status HostNccl::join(const uint8_t id[SAPIPE_NCCL_UNIQUE_ID_BYTES], int32_t size, int32_t rank, HostNccl** out, std::string* why) {
  *out = nullptr;
  if (std::memcmp(id, kMarker, sizeof kMarker) != 0) {
    *why = "nccl_comm_init_rank: the id is not one nccl_get_unique_id of this plugin made";
    return SAPIPE_ERR_INVALID_ARGUMENT;
  }
  const uint8_t* token = id + sizeof kMarker;
  auto* c = new HostNccl(rank, size, timeout_from_env());
  const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(c->timeout_ms_);
  auto give_up = [&](sapipe_status s, const std::string& message) {
    *why = "nccl_comm_init_rank (rank " + std::to_string(rank) + " of " + std::to_string(size) + "): " + message;
    delete c;
    return s;
  };
  // Rank r listens for the ranks above it and connects to those below it.
  int listener = -1;
  if (rank < size - 1) {
    listener = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    socklen_t length = 0;
    sockaddr_un a = address_of(token, rank, &length);
    if (listener < 0 || bind(listener, reinterpret_cast<sockaddr*>(&a), length) != 0 || listen(listener, size) != 0) {
      const std::string reason = std::strerror(errno);
      if (listener >= 0) close(listener);
      return give_up(SAPIPE_ERR_INTERNAL, "cannot listen (" + reason + "; is this rank already joined?)");
    }
  }
  auto stop = [&](sapipe_status s, const std::string& message) {
    if (listener >= 0) close(listener);
    return give_up(s, message);
  };
  for (int32_t peer = 0; peer < rank; ++peer) {
    socklen_t length = 0;
    const sockaddr_un a = address_of(token, peer, &length);
    for (;;) {
      const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd < 0) return stop(SAPIPE_ERR_INTERNAL, std::string("socket: ") + std::strerror(errno));
      if (connect(fd, reinterpret_cast<const sockaddr*>(&a), length) == 0) {
        c->fds_[static_cast<size_t>(peer)] = fd;
        break;
      }
      close(fd);
      // Rank `peer` has not started listening yet.
      if (Clock::now() >= deadline)
        return stop(SAPIPE_ERR_TIMEOUT, "rank " + std::to_string(peer) + " did not join within " + std::to_string(c->timeout_ms_) + " ms");
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    Header hello{kHello, static_cast<uint32_t>(rank), static_cast<uint64_t>(size)};
    if (!move_all(c->fds_[static_cast<size_t>(peer)], &hello, sizeof hello, true, deadline))
      return stop(SAPIPE_ERR_PEER_LOST, "rank " + std::to_string(peer) + " closed its connection while joining");
  }
  for (int32_t joined = rank + 1; joined < size; ++joined) {
    pollfd pfd{listener, POLLIN, 0};
    int ready = 0;
    while ((ready = poll(&pfd, 1, remaining_ms(deadline))) == 0 && Clock::now() < deadline) {
    }
    if (ready < 0 && errno == EINTR) {
      --joined;
      continue;
    }
    if (ready <= 0)
      return stop(SAPIPE_ERR_TIMEOUT, std::to_string(size - joined) + " rank(s) above " + std::to_string(rank) + " did not join within " +
                                          std::to_string(c->timeout_ms_) + " ms");
    const int fd = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) return stop(SAPIPE_ERR_INTERNAL, std::string("accept: ") + std::strerror(errno));
    Header hello{};
    if (!move_all(fd, &hello, sizeof hello, false, deadline) || hello.op != kHello) {
      close(fd);
      return stop(SAPIPE_ERR_PEER_LOST, "a rank connected but did not introduce itself");
    }
    const auto from = static_cast<int32_t>(hello.from);
    if (hello.bytes != static_cast<uint64_t>(size) || from <= rank || from >= size || c->fds_[static_cast<size_t>(from)] >= 0) {
      close(fd);
      return stop(SAPIPE_ERR_INVALID_ARGUMENT, "rank " + std::to_string(from) + " joined as one of " + std::to_string(hello.bytes) +
                                                   " ranks; this rank was told " + std::to_string(size));
    }
    c->fds_[static_cast<size_t>(from)] = fd;
  }
  if (listener >= 0) close(listener);
  for (int fd : c->fds_)
    if (fd >= 0 && !set_nonblocking(fd)) return give_up(SAPIPE_ERR_INTERNAL, std::string("fcntl: ") + std::strerror(errno));
  *out = c;
  return SAPIPE_OK;
}

HostNccl::~HostNccl() { close_all(); }

void HostNccl::close_all() {
  for (int& fd : fds_)
    if (fd >= 0) {
      close(fd);
      fd = -1;
    }
}

sapipe_status HostNccl::fail(sapipe_status status, const std::string& message, std::string* why) {
  if (broken_.empty()) broken_ = message;
  // As ncclCommAbort: the peers see this rank go and fail instead of waiting for it.
  close_all();
  *why = message;
  return status;
}

sapipe_status HostNccl::check_usable(const char* what, std::string* why) {
  if (broken_.empty()) return SAPIPE_OK;
  *why = std::string(what) + ": the communicator failed earlier (" + broken_ + ")";
  return SAPIPE_ERR_PEER_LOST;
}

sapipe_status HostNccl::exchange(uint32_t op, std::vector<Leg>& legs, const char* what, std::string* why) {
  if (sapipe_status s = check_usable(what, why); s != SAPIPE_OK) return s;
  struct Progress {
    Header out_header{};
    Header in_header{};
    size_t out_done = 0;  // bytes of header + payload written
    size_t in_done = 0;   // bytes of header + payload read
  };
  std::vector<Progress> progress(legs.size());
  for (size_t i = 0; i < legs.size(); ++i)
    progress[i].out_header = {op, static_cast<uint32_t>(rank_), static_cast<uint64_t>(legs[i].out_bytes)};
  const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(timeout_ms_);
  const std::string prefix = std::string(what) + " (rank " + std::to_string(rank_) + " of " + std::to_string(size_) + "): ";
  for (;;) {
    std::vector<pollfd> pfds;
    std::vector<size_t> leg_of;
    for (size_t i = 0; i < legs.size(); ++i) {
      const Leg& l = legs[i];
      const Progress& p = progress[i];
      short events = 0;
      if (l.sends && p.out_done < sizeof(Header) + l.out_bytes) events |= POLLOUT;
      if (l.receives && p.in_done < sizeof(Header) + l.in_bytes) events |= POLLIN;
      if (events != 0) {
        pfds.push_back({fds_[static_cast<size_t>(l.peer)], events, 0});
        leg_of.push_back(i);
      }
    }
    if (pfds.empty()) return SAPIPE_OK;
    const int ready = poll(pfds.data(), pfds.size(), remaining_ms(deadline));
    if (ready < 0 && errno != EINTR) return fail(SAPIPE_ERR_INTERNAL, prefix + "poll: " + std::strerror(errno), why);
    if (ready == 0 && Clock::now() >= deadline)
      return fail(SAPIPE_ERR_TIMEOUT,
                  prefix + "not finished within " + std::to_string(timeout_ms_) + " ms (a peer may have died or not called it)", why);
    for (size_t k = 0; ready > 0 && k < pfds.size(); ++k) {
      if (pfds[k].revents == 0) continue;
      Leg& l = legs[leg_of[k]];
      Progress& p = progress[leg_of[k]];
      const int fd = pfds[k].fd;
      const std::string peer = "rank " + std::to_string(l.peer);
      if ((pfds[k].revents & POLLIN) != 0 || (pfds[k].revents & (POLLHUP | POLLERR)) != 0) {
        if (l.receives && p.in_done < sizeof(Header) + l.in_bytes) {
          char* dst = p.in_done < sizeof(Header) ? reinterpret_cast<char*>(&p.in_header) + p.in_done
                                                 : static_cast<char*>(l.in) + (p.in_done - sizeof(Header));
          const size_t want = p.in_done < sizeof(Header) ? sizeof(Header) - p.in_done : sizeof(Header) + l.in_bytes - p.in_done;
          const ssize_t n = ::recv(fd, dst, want, 0);
          if (n == 0) return fail(SAPIPE_ERR_PEER_LOST, prefix + peer + " closed its connection (it exited, died or aborted)", why);
          if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            return fail(SAPIPE_ERR_PEER_LOST, prefix + peer + ": " + std::strerror(errno), why);
          if (n > 0) {
            const bool had_header = p.in_done >= sizeof(Header);
            p.in_done += static_cast<size_t>(n);
            if (!had_header && p.in_done >= sizeof(Header) &&
                (p.in_header.op != op || p.in_header.bytes != l.in_bytes || p.in_header.from != static_cast<uint32_t>(l.peer)))
              return fail(p.in_header.op == op ? SAPIPE_ERR_SIZE_MISMATCH : SAPIPE_ERR_INTERNAL,
                          prefix + peer + " called " + op_name(p.in_header.op) + " of " + std::to_string(p.in_header.bytes) +
                              " bytes where this rank called " + op_name(op) + " of " + std::to_string(l.in_bytes),
                          why);
          }
        } else if ((pfds[k].revents & (POLLHUP | POLLERR)) != 0) {
          return fail(SAPIPE_ERR_PEER_LOST, prefix + peer + " closed its connection (it exited, died or aborted)", why);
        }
      }
      if ((pfds[k].revents & POLLOUT) != 0 && l.sends && p.out_done < sizeof(Header) + l.out_bytes) {
        const char* src = p.out_done < sizeof(Header) ? reinterpret_cast<const char*>(&p.out_header) + p.out_done
                                                      : static_cast<const char*>(l.out) + (p.out_done - sizeof(Header));
        const size_t want = p.out_done < sizeof(Header) ? sizeof(Header) - p.out_done : sizeof(Header) + l.out_bytes - p.out_done;
        const ssize_t n = ::send(fd, src, want, MSG_NOSIGNAL);
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
          return fail(SAPIPE_ERR_PEER_LOST, prefix + peer + ": " + std::strerror(errno), why);
        if (n > 0) p.out_done += static_cast<size_t>(n);
      }
    }
  }
}

namespace {

// Sums `size` contributions in rank order into out (which may alias none of them but mine).
void sum_in_rank_order(float* out, const std::vector<const float*>& parts, size_t count, bool average, int32_t size) {
  for (size_t i = 0; i < count; ++i) {
    float s = 0.0f;
    for (const float* p : parts) s += p[i];
    out[i] = average ? s / static_cast<float>(size) : s;
  }
}

}  // namespace

sapipe_status HostNccl::all_reduce(const float* send, float* recv, size_t count, bool average, std::string* why) {
  const std::vector<float> mine(send, send + count);
  std::vector<std::vector<float>> theirs(static_cast<size_t>(size_));
  std::vector<Leg> legs;
  for (int32_t r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    theirs[static_cast<size_t>(r)].resize(count);
    legs.push_back({r, mine.data(), count * sizeof(float), true, theirs[static_cast<size_t>(r)].data(), count * sizeof(float), true});
  }
  if (sapipe_status s = exchange(kAllReduce, legs, "all_reduce", why); s != SAPIPE_OK) return s;
  std::vector<const float*> parts;
  for (int32_t r = 0; r < size_; ++r) parts.push_back(r == rank_ ? mine.data() : theirs[static_cast<size_t>(r)].data());
  sum_in_rank_order(recv, parts, count, average, size_);
  return SAPIPE_OK;
}

sapipe_status HostNccl::reduce_scatter(const float* send, float* recv, size_t recv_count, bool average, std::string* why) {
  // recv may be send's own part: keep that part before anything is written.
  const std::vector<float> mine(send + static_cast<size_t>(rank_) * recv_count, send + static_cast<size_t>(rank_ + 1) * recv_count);
  std::vector<std::vector<float>> theirs(static_cast<size_t>(size_));
  std::vector<Leg> legs;
  for (int32_t r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    theirs[static_cast<size_t>(r)].resize(recv_count);
    legs.push_back({r, send + static_cast<size_t>(r) * recv_count, recv_count * sizeof(float), true, theirs[static_cast<size_t>(r)].data(),
                    recv_count * sizeof(float), true});
  }
  if (sapipe_status s = exchange(kReduceScatter, legs, "reduce_scatter", why); s != SAPIPE_OK) return s;
  std::vector<const float*> parts;
  for (int32_t r = 0; r < size_; ++r) parts.push_back(r == rank_ ? mine.data() : theirs[static_cast<size_t>(r)].data());
  sum_in_rank_order(recv, parts, recv_count, average, size_);
  return SAPIPE_OK;
}

sapipe_status HostNccl::all_gather(const float* send, float* recv, size_t send_count, std::string* why) {
  float* own = recv + static_cast<size_t>(rank_) * send_count;
  if (own != send && send_count > 0) std::memmove(own, send, send_count * sizeof(float));
  std::vector<Leg> legs;
  for (int32_t r = 0; r < size_; ++r)
    if (r != rank_)
      legs.push_back({r, own, send_count * sizeof(float), true, recv + static_cast<size_t>(r) * send_count, send_count * sizeof(float), true});
  return exchange(kAllGather, legs, "all_gather", why);
}

sapipe_status HostNccl::broadcast(const float* send, float* recv, size_t count, int32_t root, std::string* why) {
  std::vector<Leg> legs;
  if (rank_ == root) {
    if (recv != send && count > 0) std::memmove(recv, send, count * sizeof(float));
    for (int32_t r = 0; r < size_; ++r)
      if (r != rank_) legs.push_back({r, recv, count * sizeof(float), true, nullptr, 0, false});
  } else {
    legs.push_back({root, nullptr, 0, false, recv, count * sizeof(float), true});
  }
  return exchange(kBroadcast, legs, "broadcast", why);
}

sapipe_status HostNccl::send(const float* buffer, size_t count, int32_t peer, std::string* why) {
  std::vector<Leg> data{{peer, buffer, count * sizeof(float), true, nullptr, 0, false}};
  if (sapipe_status s = exchange(kSend, data, "send", why); s != SAPIPE_OK) return s;
  // Returns only once the peer's recv took it, as a send on a GPU completes.
  std::vector<Leg> taken{{peer, nullptr, 0, false, nullptr, 0, true}};
  return exchange(kSendTaken, taken, "send", why);
}

sapipe_status HostNccl::recv(float* buffer, size_t count, int32_t peer, std::string* why) {
  std::vector<Leg> data{{peer, nullptr, 0, false, buffer, count * sizeof(float), true}};
  if (sapipe_status s = exchange(kSend, data, "recv", why); s != SAPIPE_OK) return s;
  std::vector<Leg> taken{{peer, nullptr, 0, true, nullptr, 0, false}};
  return exchange(kSendTaken, taken, "recv", why);
}

}  // namespace sapipe::fakes
