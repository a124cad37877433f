// The ring of liveness connections that names a lost rank: see peer_liveness.h.
#include "mpigrad/launch/comm/peer_liveness.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "mpigrad/core/tensor.h"
#include "mpigrad/launch/comm/communicator.h"
#include "mpigrad/launch/comm/rank_label.h"

namespace mpigrad::launch {

namespace {

using Clock = std::chrono::steady_clock;

// Where a rank listens: a port and up to four IPv4 addresses of its host, those other hosts can
// reach first (loopback last), all-gathered as bytes.
constexpr int kMostAddresses = 4;
struct Endpoint {
  uint32_t addresses[kMostAddresses] = {};  // network byte order
  uint16_t port = 0;                        // network byte order; 0: this rank has no listener
  uint16_t count = 0;
};

// The ring's messages: a connecting rank's hello with its world rank, a leaving rank's goodbye,
// and "this rank is lost", each one byte and, but for the goodbye, a 4-byte world rank.
constexpr char kHello = 'H', kGoodbye = 'B', kLost = 'L';

// How long setting up may take: past it the ring is incomplete, and only its working half (or
// nothing) reports.
constexpr auto kConnectTimeout = std::chrono::seconds(3);
constexpr auto kAcceptTimeout = std::chrono::seconds(10);
// How long a signal waits for word of a lost rank still travelling round the ring.
constexpr auto kNoticeGrace = std::chrono::milliseconds(300);

// The handler's world (process-wide by necessity: a handler receives only the signal number).
std::atomic<int> g_signal{0};
std::atomic<bool> g_end_process{false};
std::atomic<int> g_wake_fd{-1};
std::atomic<PeerLiveness::Impl*> g_ring{nullptr};
static_assert(std::atomic<int>::is_always_lock_free && std::atomic<bool>::is_always_lock_free);

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

bool send_all(int fd, const void* data, size_t size) {
  const char* bytes = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t sent = ::send(fd, bytes, size, MSG_NOSIGNAL);
    if (sent < 0 && errno == EINTR) continue;
    if (sent <= 0) return false;
    bytes += sent;
    size -= size_t(sent);
  }
  return true;
}

// This host's IPv4 addresses, loopback last.
Endpoint local_endpoint(uint16_t port) {
  Endpoint endpoint;
  endpoint.port = htons(port);
  std::vector<uint32_t> found, loopback;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) == 0) {
    for (ifaddrs* entry = list; entry != nullptr; entry = entry->ifa_next) {
      if (entry->ifa_addr == nullptr || entry->ifa_addr->sa_family != AF_INET) continue;
      const uint32_t address = reinterpret_cast<sockaddr_in*>(entry->ifa_addr)->sin_addr.s_addr;
      ((ntohl(address) >> 24) == 127 ? loopback : found).push_back(address);
    }
    ::freeifaddrs(list);
  }
  found.insert(found.end(), loopback.begin(), loopback.end());
  for (uint32_t address : found) {
    if (endpoint.count == kMostAddresses) break;
    endpoint.addresses[endpoint.count++] = address;
  }
  return endpoint;
}

}  // namespace

struct PeerLiveness::Impl {
  int rank = 0, size = 1;
  std::shared_ptr<const WorldRanks> world;
  std::vector<Endpoint> endpoints;
  int listener = -1, next = -1, previous = -1;  // next: to rank + 1; previous: from rank - 1
  int wake[2] = {-1, -1};
  bool next_left = false, previous_left = false;  // said goodbye
  std::string next_bytes, previous_bytes;         // what has arrived, not yet read as messages
  std::mutex send_mutex;
  mutable std::mutex lost_mutex;
  std::vector<int> lost;
  std::atomic<bool> stop{false};
  std::thread thread;

  int next_rank() const { return (rank + 1) % size; }
  int previous_rank() const { return (rank + size - 1) % size; }

  std::string named(int world_rank) const {
    const std::string host = world ? world->host(world_rank) : "";
    return "rank " + std::to_string(world_rank) + (host.empty() ? "" : " on " + host);
  }

  // Waits for `fd` to become ready for `events`, a signal (the wake pipe) or `deadline`.
  bool wait_for(int fd, short events, Clock::time_point deadline) {
    while (!stop.load() && g_signal.load() == 0) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return false;
      pollfd fds[2] = {{fd, events, 0}, {wake[0], POLLIN, 0}};
      const int ready = ::poll(fds, 2, int(std::min<int64_t>(left.count(), 200)));
      if (ready > 0 && (fds[0].revents & (events | POLLERR | POLLHUP))) return true;
    }
    return false;
  }

  // To the next rank: its addresses in turn, each given kConnectTimeout; then the hello.
  void connect_next() {
    const Endpoint& to = endpoints[size_t(next_rank())];
    for (int i = 0; i < to.count && next < 0 && to.port != 0; ++i) {
      int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
      if (fd < 0) return;
      sockaddr_in address{};
      address.sin_family = AF_INET;
      address.sin_port = to.port;
      address.sin_addr.s_addr = to.addresses[i];
      int error = 0;
      socklen_t length = sizeof error;
      if ((::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 ||
           (errno == EINPROGRESS && wait_for(fd, POLLOUT, Clock::now() + kConnectTimeout))) &&
          ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) == 0 && error == 0) {
        ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
        char hello[5] = {kHello};
        const int32_t me = rank;
        std::memcpy(hello + 1, &me, sizeof me);
        if (send_all(fd, hello, sizeof hello)) {
          next = fd;
          continue;
        }
      }
      ::close(fd);
    }
  }

  // From the previous rank: connections whose hello names it (anything else is closed).
  void accept_previous() {
    const auto deadline = Clock::now() + kAcceptTimeout;
    while (previous < 0 && listener >= 0 && wait_for(listener, POLLIN, deadline)) {
      int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      char hello[5] = {};
      size_t got = 0;
      while (got < sizeof hello && wait_for(fd, POLLIN, deadline)) {
        const ssize_t read = ::recv(fd, hello + got, sizeof hello - got, 0);
        if (read <= 0) break;
        got += size_t(read);
      }
      int32_t from = -1;
      std::memcpy(&from, hello + 1, sizeof from);
      if (got == sizeof hello && hello[0] == kHello && from == previous_rank()) {
        previous = fd;
      } else {
        ::close(fd);
      }
    }
    close_fd(listener);
  }

  void send_to(int fd, const char* message, size_t length) {
    std::lock_guard<std::mutex> lock(send_mutex);
    if (fd >= 0) send_all(fd, message, length);
  }

  void goodbye() {
    const char bye = kGoodbye;
    send_to(next, &bye, 1);
    send_to(previous, &bye, 1);
  }

  // `world_rank` is lost: learnt once, and passed on to the side it did not come from.
  void learn(int world_rank, bool from_next) {
    {
      std::lock_guard<std::mutex> lock(lost_mutex);
      if (std::find(lost.begin(), lost.end(), world_rank) != lost.end()) return;
      lost.push_back(world_rank);
    }
    char notice[5] = {kLost};
    const int32_t value = world_rank;
    std::memcpy(notice + 1, &value, sizeof value);
    send_to(from_next ? previous : next, notice, sizeof notice);
  }

  // Reads what `fd` has; its end without a goodbye means its rank is lost.
  void read_side(bool is_next) {
    int& fd = is_next ? next : previous;
    std::string& bytes = is_next ? next_bytes : previous_bytes;
    bool& left = is_next ? next_left : previous_left;
    char buffer[256];
    const ssize_t read = ::recv(fd, buffer, sizeof buffer, MSG_DONTWAIT);
    if (read < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (read > 0) {
      bytes.append(buffer, size_t(read));
      size_t at = 0;
      while (at < bytes.size()) {
        if (bytes[at] == kGoodbye) {
          left = true;
          ++at;
        } else if (bytes[at] == kLost && bytes.size() - at >= 5) {
          int32_t world_rank = -1;
          std::memcpy(&world_rank, bytes.data() + at + 1, sizeof world_rank);
          learn(world_rank, is_next);
          at += 5;
        } else {
          break;
        }
      }
      bytes.erase(0, at);
      return;
    }
    const int neighbour = is_next ? next_rank() : previous_rank();
    {
      std::lock_guard<std::mutex> lock(send_mutex);
      close_fd(fd);
    }
    if (!left) learn(neighbour, is_next);
  }

  // Reads both sides and the wake pipe until `deadline`.
  void watch(Clock::time_point deadline) {
    while (!stop.load()) {
      pollfd fds[3] = {{next, POLLIN, 0}, {previous, POLLIN, 0}, {wake[0], POLLIN, 0}};
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return;
      if (::poll(fds, 3, int(std::min<int64_t>(left.count(), 200))) <= 0) continue;
      if (fds[0].revents != 0 && next >= 0) read_side(true);
      if (fds[1].revents != 0 && previous >= 0) read_side(false);
      if (fds[2].revents != 0) {
        char drained[16];
        while (::read(wake[0], drained, sizeof drained) > 0) {
        }
        if (const int signal = g_signal.exchange(0); signal != 0) on_signal(signal);
      }
    }
  }

  // A launcher's SIGCONT or SIGTERM (notice_termination_signal).
  void on_signal(int signal) {
    const auto deadline = Clock::now() + kNoticeGrace;
    std::vector<int> known;
    while (true) {
      {
        std::lock_guard<std::mutex> lock(lost_mutex);
        known = lost;
      }
      if (!known.empty() || Clock::now() >= deadline || stop.load()) break;
      // Word of a lost rank may still be on its way round the ring.
      pollfd fds[2] = {{next, POLLIN, 0}, {previous, POLLIN, 0}};
      if (::poll(fds, 2, 20) > 0) {
        if (fds[0].revents != 0 && next >= 0) read_side(true);
        if (fds[1].revents != 0 && previous >= 0) read_side(false);
      }
    }
    if (known.empty() && !g_end_process.load()) return;  // a stop, or job control: go on
    if (!known.empty()) {
      std::string names;
      for (size_t i = 0; i < known.size(); ++i) names += (i == 0 ? "" : " and ") + named(known[i]);
      std::fprintf(stderr,
                   "%s mpigrad: %s %s gone (the connection ended without a goodbye: the process "
                   "died); the launcher is ending the job (SIG%s), and this rank ends now\n",
                   rank_label_on_host(rank, size).c_str(), names.c_str(),
                   known.size() == 1 ? "is" : "are", signal == SIGCONT ? "CONT" : "TERM");
      std::fflush(stderr);
    }
    // This rank leaves on purpose: its neighbours must not take it for lost.
    goodbye();
    ::signal(SIGTERM, SIG_DFL);
    ::kill(::getpid(), SIGTERM);
  }

  void run() {
    connect_next();
    accept_previous();
    watch(Clock::time_point::max());
  }
};

PeerLiveness::PeerLiveness(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

std::unique_ptr<PeerLiveness> PeerLiveness::start(Communicator& world) {
  if (world.size() < 2) return nullptr;
  auto impl = std::make_unique<Impl>();
  impl->rank = world.world_rank();
  impl->size = world.size();
  impl->world = world.world_ranks();
  // Listen first, on every address, so that the previous rank's connection waits in the backlog
  // whenever it comes.
  uint16_t port = 0;
  impl->listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t length = sizeof address;
  if (impl->listener >= 0 &&
      ::bind(impl->listener, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
      ::listen(impl->listener, 8) == 0 &&
      ::getsockname(impl->listener, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
    port = ntohs(address.sin_port);
  } else {
    close_fd(impl->listener);
  }
  const Endpoint mine = local_endpoint(port);
  core::Tensor bytes = core::zeros({int64_t(sizeof(Endpoint))}, core::kUInt8);
  std::memcpy(bytes.data_ptr(), &mine, sizeof mine);
  core::Tensor all = core::zeros({int64_t(sizeof(Endpoint)) * world.size()}, core::kUInt8);
  world.all_gather(bytes, all);
  impl->endpoints.resize(size_t(world.size()));
  std::memcpy(impl->endpoints.data(), all.data_ptr(), sizeof(Endpoint) * size_t(world.size()));
  Impl* expected = nullptr;
  if (::pipe2(impl->wake, O_CLOEXEC | O_NONBLOCK) != 0 ||
      !g_ring.compare_exchange_strong(expected, impl.get())) {
    close_fd(impl->listener);
    close_fd(impl->wake[0]);
    close_fd(impl->wake[1]);
    return nullptr;
  }
  g_wake_fd.store(impl->wake[1]);
  impl->thread = std::thread([raw = impl.get()] { raw->run(); });
  return std::unique_ptr<PeerLiveness>(new PeerLiveness(std::move(impl)));
}

PeerLiveness::~PeerLiveness() {
  Impl& impl = *impl_;
  g_wake_fd.store(-1);
  g_ring.store(nullptr);
  impl.goodbye();
  impl.stop.store(true);
  const char wake = 0;
  if (::write(impl.wake[1], &wake, 1) < 0) {
    // The thread sees `stop` within its poll's 200 ms anyway.
  }
  impl.thread.join();
  close_fd(impl.next);
  close_fd(impl.previous);
  close_fd(impl.listener);
  close_fd(impl.wake[0]);
  close_fd(impl.wake[1]);
}

std::vector<int> PeerLiveness::lost() const {
  std::lock_guard<std::mutex> lock(impl_->lost_mutex);
  return impl_->lost;
}

bool notice_termination_signal(int signal, bool end_process) {
  const int fd = g_wake_fd.load();
  if (fd < 0) return false;
  g_end_process.store(end_process);
  g_signal.store(signal);
  const char wake = 1;
  return ::write(fd, &wake, 1) == 1 || errno == EAGAIN;
}

void say_goodbye_to_peers() {
  if (PeerLiveness::Impl* ring = g_ring.load()) ring->goodbye();
}

}  // namespace mpigrad::launch
