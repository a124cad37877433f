// SharedMemoryAllReduce: the segments (create, exchange names, map, check), the flags, and the
// shard averaging. See the header for the protocol.
#include "mpigrad/launch/shared_memory_all_reduce.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <sstream>
#include <thread>

#include "mpigrad/core/error.h"
#include "mpigrad/kernels/dtype.h"

namespace mpigrad::launch {

namespace {

// The flags are plain memory shared between processes; that works only if atomics on them
// never take a lock inside one process.
static_assert(std::atomic_ref<uint64_t>::is_always_lock_free);

constexpr size_t kLine = 64;  // cache line: flags and buffers start on their own line
constexpr uint64_t kMagic = 0x6d70677261647368;  // "mpgradsh"

size_t round_up(size_t value, size_t to) { return (value + to - 1) / to * to; }

uint64_t load_acquire(const uint64_t& word) {
  return std::atomic_ref<uint64_t>(const_cast<uint64_t&>(word)).load(std::memory_order_acquire);
}

uint64_t load_relaxed(const uint64_t& word) {
  return std::atomic_ref<uint64_t>(const_cast<uint64_t&>(word)).load(std::memory_order_relaxed);
}

void store_release(uint64_t& word, uint64_t value) {
  std::atomic_ref<uint64_t>(word).store(value, std::memory_order_release);
}

// A rank's progress on one buffer, on its own cache line, so a rank polling another's flag never
// shares a line with data. `round` is published last (release); `sequence` (written before it)
// says how many buffers this rank had started in all, which must agree across ranks.
struct alignas(kLine) Flag {
  uint64_t round;
  uint64_t sequence;
};

// The start of every segment; the token proves a mapping is the segment its owner announced.
// `aborted` becomes 1 when the owner gave up waiting, so the others fail at once instead of
// waiting out a timeout of their own.
struct alignas(kLine) Header {
  uint64_t magic;
  uint64_t token;
  uint64_t bytes;
  uint64_t aborted;
};

// What each rank tells the others about its segment; `layout` hashes the buffer list.
struct Record {
  char name[40];
  uint64_t token;
  uint64_t bytes;
  uint64_t layout;
};
static_assert(sizeof(Record) == 64);

uint64_t layout_hash(std::span<const SharedBufferSpec> buffers) {
  uint64_t hash = 1469598103934665603ull;  // FNV-1a over (count, dtype, numel, ...)
  auto mix = [&](uint64_t value) {
    for (int byte = 0; byte < 8; ++byte) {
      hash ^= (value >> (8 * byte)) & 0xff;
      hash *= 1099511628211ull;
    }
  };
  mix(buffers.size());
  for (const SharedBufferSpec& spec : buffers) {
    mix(uint64_t(spec.dtype));
    mix(uint64_t(spec.numel));
  }
  return hash;
}

std::string format_bytes(uint64_t bytes) {
  std::ostringstream out;
  if (bytes >= (uint64_t(1) << 20)) {
    out << (bytes >> 20) << " MiB";
  } else if (bytes >= 1024) {
    out << (bytes >> 10) << " KiB";
  } else {
    out << bytes << " bytes";
  }
  return out.str();
}

// Why a rank could not take part; travels as kind * 1000 + errno.
enum Problem : int32_t { kOk = 0, kCreate = 1, kOpenPeer = 2, kPeerMismatch = 3 };

std::string describe_problem(int rank, int32_t code, uint64_t bytes, int ranks) {
  std::ostringstream out;
  const int error = code % 1000;
  out << "rank " << rank;
  switch (code / 1000) {
    case kCreate:
      out << " could not create a shared-memory segment of " << format_bytes(bytes)
          << " in /dev/shm";
      if (error == ENOSPC) out << " (the node needs " << ranks << " of them, one per rank)";
      break;
    case kOpenPeer:
      out << " cannot open another rank's shared-memory segment";
      if (error == ENOENT) out << " (are the ranks on different nodes?)";
      break;
    default: out << " mapped a segment that is not the one announced (ranks on different nodes?)";
  }
  if (error != 0) out << ": " << std::strerror(error);
  return out.str();
}

// One mapped segment; unmapped when the last owner (this object, or a tensor's Storage) lets go.
struct Mapping {
  void* base = MAP_FAILED;
  size_t bytes = 0;
  Mapping(void* b, size_t n) : base(b), bytes(n) {}
  ~Mapping() {
    if (base != MAP_FAILED) munmap(base, bytes);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  char* data() const { return static_cast<char*>(base); }
};

// Maps an open shared-memory file descriptor (read-write) and closes it. `populate` fills the
// page tables now: right for this rank's own segment, which it uses whole; of another rank's it
// touches only its own shards (1/size), so those pages are mapped on first use.
std::shared_ptr<Mapping> map_fd(int fd, size_t bytes, bool populate) {
  int flags = MAP_SHARED;
#if defined(MAP_POPULATE)
  if (populate) flags |= MAP_POPULATE;
#else
  (void)populate;
#endif
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, flags, fd, 0);
  int error = errno;
  close(fd);
  if (base == MAP_FAILED) {
    errno = error;
    return nullptr;
  }
  return std::make_shared<Mapping>(base, bytes);
}

// Unlinks a segment's name when it goes out of scope, whatever path create() leaves by: the
// name is needed only until every rank has opened the segment.
struct UnlinkGuard {
  std::string name;
  ~UnlinkGuard() {
    if (!name.empty()) shm_unlink(name.c_str());
  }
};

uint64_t random_token() {
  std::random_device device;
  uint64_t token = (uint64_t(device()) << 32) ^ device();
  token ^= uint64_t(getpid()) << 16;
  token ^= uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
  return token | 1;  // never 0, which marks "no segment"
}

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// copies[q] = rank q's buffer; sums [begin, end) over ranks in rank order, scales by 1/ranks and
// writes the result into every copy. Blocks of kBlock elements keep the sums in L1 and let the
// compiler vectorize each pass.
template <typename T>
void average_range(const std::vector<T*>& copies, int64_t begin, int64_t end) {
  using C = kernels::compute_t<T>;
  const C scale = C(1) / C(copies.size());
  if (copies.size() == 2) {
    // The common case in one fused pass: 1.8 ms instead of 3.1 ms for 18 MiB of float32 a side.
    T* __restrict a = copies[0];
    T* __restrict b = copies[1];
    for (int64_t i = begin; i < end; ++i) {
      T average = T((C(a[i]) + C(b[i])) * scale);
      a[i] = average;
      b[i] = average;
    }
    return;
  }
  constexpr int64_t kBlock = 1024;
  C sum[kBlock];
  for (int64_t start = begin; start < end; start += kBlock) {
    const int64_t length = std::min(kBlock, end - start);
    const T* first = copies[0] + start;
    for (int64_t i = 0; i < length; ++i) sum[i] = C(first[i]);
    for (size_t q = 1; q < copies.size(); ++q) {
      const T* source = copies[q] + start;
      for (int64_t i = 0; i < length; ++i) sum[i] += C(source[i]);
    }
    for (int64_t i = 0; i < length; ++i) sum[i] *= scale;
    for (T* copy : copies) {
      T* target = copy + start;
      for (int64_t i = 0; i < length; ++i) target[i] = T(sum[i]);
    }
  }
}

}  // namespace

struct SharedMemoryAllReduce::Impl {
  std::string communicator_name;
  int rank = 0;
  int size = 1;
  double timeout_seconds = 0;
  std::vector<SharedBufferSpec> specs;
  std::vector<size_t> offsets;  // byte offset of each buffer in a segment
  size_t flags_offset = 0;      // started[b] at flags + 2b, reduced[b] at flags + 2b + 1
  std::vector<std::shared_ptr<Mapping>> segments;  // one per rank, own included
  std::vector<core::Tensor> buffers;               // this rank's, as tensors
  std::vector<uint64_t> round;                     // how often each buffer was started
  std::vector<uint64_t> sequence;  // this rank's start count when it last started each buffer
  uint64_t starts = 0;             // buffers started in all
  std::vector<bool> in_flight;
  std::vector<bool> reduced_here;  // this rank's share of the current round is done
  std::string failure;             // set by the first failure; every later call repeats it

  std::string where() const {
    std::ostringstream out;
    out << "shared-memory all-reduce on communicator '" << communicator_name << "' [rank " << rank
        << "/" << size << "]";
    return out.str();
  }

  // Records the failure, tells the other ranks (so they fail at once rather than time out), and
  // throws. The object is unusable afterwards.
  template <typename... Parts>
  [[noreturn]] void fail(const Parts&... parts) {
    failure = where() + ": " + core::detail::concat(parts...);
    store_release(header(rank).aborted, 1);
    throw core::Error(failure);
  }

  void check_usable() const {
    if (!failure.empty()) {
      throw core::Error(where() + " is unusable after an earlier failure: " + failure);
    }
  }

  Header& header(int owner) const {
    return *reinterpret_cast<Header*>(segments[size_t(owner)]->data());
  }

  Flag& flag(int owner, size_t index, bool reduced) const {
    auto* flags = reinterpret_cast<Flag*>(segments[size_t(owner)]->data() + flags_offset);
    return flags[2 * index + (reduced ? 1 : 0)];
  }

  // Whether every rank has started buffer `index` in this round; fails if a rank is out of step
  // (a different round, or this buffer started as a different one of its starts).
  bool all_started(size_t index) {
    for (int q = 0; q < size; ++q) {
      const Flag& theirs = flag(q, index, /*reduced=*/false);
      const uint64_t their_round = load_acquire(theirs.round);
      if (their_round < round[index]) return false;
      const uint64_t their_sequence = load_relaxed(theirs.sequence);
      if (their_round != round[index] || their_sequence != sequence[index]) {
        fail("ranks out of step: rank ", q, " started buffer ", index, " (round ", their_round,
             ") as its start #", their_sequence, ", this rank (round ", round[index],
             ") as its start #", sequence[index],
             "; every rank must start the buffers in the same order (did a backward fail on "
             "only some ranks?)");
      }
    }
    return true;
  }

  bool all_reduced(size_t index) const {
    for (int q = 0; q < size; ++q) {
      if (load_acquire(flag(q, index, /*reduced=*/true).round) < round[index]) return false;
    }
    return true;
  }

  // This rank's slice of buffer `index`, cut on cache lines so no two ranks write one line.
  std::pair<int64_t, int64_t> shard(size_t index) const {
    const SharedBufferSpec& spec = specs[index];
    const int64_t per_line = int64_t(kLine) / core::element_size(spec.dtype);
    int64_t lines = (spec.numel + per_line - 1) / per_line;
    int64_t per_rank = (lines + size - 1) / size * per_line;
    int64_t begin = std::min(spec.numel, per_rank * rank);
    return {begin, std::min(spec.numel, begin + per_rank)};
  }

  int first_peer_gave_up() const {
    for (int q = 0; q < size; ++q) {
      if (q != rank && load_acquire(header(q).aborted) != 0) return q;
    }
    return -1;
  }
  bool any_peer_gave_up() const { return first_peer_gave_up() >= 0; }

  void check_peers_alive() {
    if (int q = first_peer_gave_up(); q >= 0) {
      fail("rank ", q, " gave up (see its error) while this rank worked on the averaging");
    }
  }

  void reduce_share(size_t index) {
    check_peers_alive();  // a rank that gave up may be using its buffers again
    auto [begin, end] = shard(index);
    kernels::visit_dtype(specs[index].dtype, [&](auto zero) {
      using T = decltype(zero);
      if constexpr (std::is_floating_point_v<T> || std::is_same_v<T, core::BFloat16> ||
                    std::is_same_v<T, core::Half>) {
        std::vector<T*> copies;
        for (int q = 0; q < size; ++q) {
          copies.push_back(reinterpret_cast<T*>(segments[size_t(q)]->data() + offsets[index]));
        }
        average_range(copies, begin, end);
      }
    });
    reduced_here[index] = true;
    store_release(flag(rank, index, /*reduced=*/true).round, round[index]);
  }

  // Does this rank's share of every buffer all ranks have started.
  void progress() {
    for (size_t b = 0; b < specs.size(); ++b) {
      if (in_flight[b] && !reduced_here[b] && all_started(b)) reduce_share(b);
    }
  }

  // Waits until `ready`, doing this rank's share of other buffers meanwhile. Spins briefly, then
  // yields, then sleeps in short naps, so a node with more ranks than cores still moves on.
  template <typename Ready>
  void await(Ready ready, size_t index, bool reduced) {
    using Clock = std::chrono::steady_clock;
    Clock::time_point since{};
    for (uint64_t spins = 0; !ready(); ++spins) {
      if (spins < 256) {
        cpu_relax();
        continue;
      }
      if (spins % 64 == 0) {
        // A peer that gave up may have seen what this rank is waiting for go wrong (say, ranks
        // out of step): look once more so the report names the cause, not just the peer.
        if (any_peer_gave_up()) ready();
        check_peers_alive();
        progress();
      }
      if (spins < 4096) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
      if (timeout_seconds <= 0 || spins % 64 != 0) continue;
      if (since == Clock::time_point{}) since = Clock::now();
      if (std::chrono::duration<double>(Clock::now() - since).count() > timeout_seconds) {
        std::ostringstream missing;
        for (int q = 0, listed = 0; q < size; ++q) {
          if (load_acquire(flag(q, index, reduced).round) < round[index]) {
            missing << (listed++ ? ", " : "") << q;
          }
        }
        fail("waited more than ", timeout_seconds, " s for buffer ", index, " (round ",
             round[index], "): rank(s) ", missing.str(),
             reduced ? " have not finished their share" : " have not started it");
      }
    }
  }
};

SharedMemoryAllReduce::SharedMemoryAllReduce(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

SharedMemoryAllReduce::~SharedMemoryAllReduce() {
  // Other ranks may still be averaging into this rank's buffers: finish what is in flight.
  if (!impl_->failure.empty()) return;
  for (size_t b = 0; b < impl_->specs.size(); ++b) {
    try {
      wait(b);
    } catch (const core::Error&) {
      return;  // failed (and told the others): nothing more can be done from a destructor
    }
  }
}

std::unique_ptr<SharedMemoryAllReduce> SharedMemoryAllReduce::create(
    Communicator& communicator, std::span<const SharedBufferSpec> buffers, double timeout_seconds,
    std::string* why_not) {
  for (const SharedBufferSpec& spec : buffers) {
    MPIGRAD_CHECK(core::is_floating(spec.dtype) && spec.numel >= 0,
                  "SharedMemoryAllReduce: buffers must have a floating dtype and numel >= 0, got ",
                  spec.dtype, " x ", spec.numel);
  }
#if !defined(__linux__)
  // Not collective here: every rank of a job runs the same operating system.
  if (why_not) *why_not = "shared-memory buckets are implemented for Linux only";
  return nullptr;
#else
  auto impl = std::make_unique<Impl>();
  impl->communicator_name = communicator.name();
  impl->rank = communicator.rank();
  impl->size = communicator.size();
  impl->timeout_seconds = timeout_seconds;
  impl->specs.assign(buffers.begin(), buffers.end());
  const int rank = impl->rank;
  const int size = impl->size;

  // Layout, the same on every rank: header, two flags per buffer, then the buffers.
  impl->flags_offset = sizeof(Header);
  size_t bytes = impl->flags_offset + 2 * buffers.size() * sizeof(Flag);
  for (const SharedBufferSpec& spec : buffers) {
    impl->offsets.push_back(bytes);
    bytes = round_up(bytes + size_t(spec.numel * core::element_size(spec.dtype)), kLine);
  }

  // 1. Every rank creates its own segment under a fresh name, unlinked when create() returns.
  int32_t problem = kOk;
  Record mine{};
  mine.layout = layout_hash(buffers);
  std::shared_ptr<Mapping> own;
  const uint64_t token = random_token();
  std::ostringstream name;
  name << "/mpigrad-" << getpid() << '-' << std::hex << token;
  const std::string own_name = name.str();
  UnlinkGuard unlink_own;
  int fd = shm_open(own_name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    problem = kCreate * 1000 + errno;
  } else {
    unlink_own.name = own_name;
    // Reserve the pages now: a full /dev/shm must fail here, not with SIGBUS mid-training.
    int error = EINTR;
    while (error == EINTR) error = posix_fallocate(fd, 0, off_t(bytes));
    if (error != 0) {
      close(fd);
      problem = kCreate * 1000 + error;
    } else if (!(own = map_fd(fd, bytes, /*populate=*/true))) {
      problem = kCreate * 1000 + errno;
    } else {
      auto* header = reinterpret_cast<Header*>(own->data());
      header->magic = kMagic;
      header->token = token;
      header->bytes = bytes;
      std::snprintf(mine.name, sizeof(mine.name), "%s", own_name.c_str());
      mine.token = token;
      mine.bytes = bytes;
    }
  }

  // 2. Names are exchanged, the layouts compared, and every rank maps every other's segment.
  core::Tensor mine_bytes = core::Tensor::from_vector<uint8_t>(
      std::vector<uint8_t>(reinterpret_cast<uint8_t*>(&mine),
                           reinterpret_cast<uint8_t*>(&mine) + sizeof(Record)),
      {int64_t(sizeof(Record))});
  core::Tensor all_bytes = core::zeros({int64_t(sizeof(Record)) * size}, core::kUInt8);
  communicator.all_gather(mine_bytes, all_bytes);
  std::vector<Record> records(static_cast<size_t>(size));
  std::memcpy(records.data(), all_bytes.data_ptr(), sizeof(Record) * size_t(size));
  for (int q = 1; q < size; ++q) {
    // Every rank sees the same records, so every rank raises this error (or none does).
    MPIGRAD_CHECK(records[size_t(q)].layout == records[0].layout,
                  "SharedMemoryAllReduce on communicator '", communicator.name(), "': rank ", q,
                  " asked for a different list of buffers (dtypes and sizes) than rank 0; every "
                  "rank must pass the same buffers");
  }
  impl->segments.resize(size_t(size));
  impl->segments[size_t(rank)] = own;
  for (int q = 0; q < size && problem == kOk; ++q) {
    if (q == rank) continue;
    const Record& theirs = records[size_t(q)];
    if (theirs.token == 0) continue;  // that rank failed and says so below
    int peer_fd = shm_open(theirs.name, O_RDWR, 0);
    if (peer_fd < 0) {
      problem = kOpenPeer * 1000 + errno;
      break;
    }
    struct stat info {};
    if (fstat(peer_fd, &info) != 0 || size_t(info.st_size) != bytes || theirs.bytes != bytes) {
      close(peer_fd);
      problem = kPeerMismatch * 1000;
      break;
    }
    auto mapping = map_fd(peer_fd, bytes, /*populate=*/false);
    if (!mapping) {
      problem = kOpenPeer * 1000 + errno;
      break;
    }
    auto* header = reinterpret_cast<const Header*>(mapping->data());
    if (header->magic != kMagic || header->token != theirs.token) {
      problem = kPeerMismatch * 1000;
      break;
    }
    impl->segments[size_t(q)] = std::move(mapping);
  }

  // 3. Everyone learns everyone's outcome; once all have mapped, the names can go (the guard).
  core::Tensor outcome = core::Tensor::from_vector<int32_t>({problem}, {1});
  core::Tensor outcomes = core::zeros({size}, core::kInt32);
  communicator.all_gather(outcome, outcomes);
  std::vector<int32_t> codes = outcomes.to_vector<int32_t>();
  for (int q = 0; q < size; ++q) {
    if (codes[size_t(q)] != kOk) {
      if (why_not) *why_not = describe_problem(q, codes[size_t(q)], bytes, size);
      return nullptr;
    }
  }

  // Own buffers become tensors that keep the mapping alive.
  for (size_t b = 0; b < buffers.size(); ++b) {
    const SharedBufferSpec& spec = buffers[b];
    auto storage = std::make_shared<core::Storage>(
        own->data() + impl->offsets[b], size_t(spec.numel * core::element_size(spec.dtype)),
        core::kCPU, std::shared_ptr<const void>(own));
    impl->buffers.emplace_back(std::make_shared<core::TensorImpl>(
        std::move(storage), core::Shape{spec.numel}, core::Shape{1}, 0, spec.dtype));
  }
  impl->round.assign(buffers.size(), 0);
  impl->sequence.assign(buffers.size(), 0);
  impl->in_flight.assign(buffers.size(), false);
  impl->reduced_here.assign(buffers.size(), false);
  return std::unique_ptr<SharedMemoryAllReduce>(new SharedMemoryAllReduce(std::move(impl)));
#endif
}

int SharedMemoryAllReduce::rank() const { return impl_->rank; }
int SharedMemoryAllReduce::size() const { return impl_->size; }
size_t SharedMemoryAllReduce::buffer_count() const { return impl_->specs.size(); }
const core::Tensor& SharedMemoryAllReduce::buffer(size_t index) const {
  return impl_->buffers.at(index);
}
bool SharedMemoryAllReduce::in_flight(size_t index) const { return impl_->in_flight.at(index); }

void SharedMemoryAllReduce::start(size_t index) {
  Impl& s = *impl_;
  s.check_usable();
  MPIGRAD_CHECK(index < s.specs.size() && !s.in_flight[index],
                "SharedMemoryAllReduce::start: buffer ", index,
                index < s.specs.size() ? " is already in flight" : " does not exist");
  s.in_flight[index] = true;
  s.reduced_here[index] = false;
  s.sequence[index] = ++s.starts;
  Flag& mine = s.flag(s.rank, index, /*reduced=*/false);
  // Published by the release store of the round that follows.
  std::atomic_ref<uint64_t>(mine.sequence).store(s.sequence[index], std::memory_order_relaxed);
  store_release(mine.round, ++s.round[index]);
}

void SharedMemoryAllReduce::progress() {
  impl_->check_usable();
  impl_->progress();
}

void SharedMemoryAllReduce::wait(size_t index) {
  Impl& s = *impl_;
  s.check_usable();
  if (!s.in_flight.at(index)) return;
  // The progress() inside await may do this rank's share itself; once it has, the other ranks
  // may already be in the next round, so the started flags must not be looked at again (and
  // the share must not be done twice: it would write into buffers their owners are refilling).
  s.await([&] { return s.reduced_here[index] || s.all_started(index); }, index, false);
  if (!s.reduced_here[index]) s.reduce_share(index);
  s.await([&] { return s.all_reduced(index); }, index, true);
  s.in_flight[index] = false;
}

}  // namespace mpigrad::launch
