// SharedSegments: creating, exchanging, mapping and checking the segments, and the flags. See the
// header for the layout.
#include "mpigrad/launch/ddp/transports/shared_segments.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>
#include <sstream>

#include "mpigrad/core/error.h"

namespace mpigrad::launch {

namespace {

// The flags are plain memory shared between processes; that works only if atomics on them
// never take a lock inside one process.
static_assert(std::atomic_ref<uint64_t>::is_always_lock_free);

constexpr uint64_t kMagic = 0x6d70677261647368;  // "mpgradsh"

size_t round_up(size_t value, size_t to) {
  return (value + to - 1) / to * to;
}

uint64_t load_acquire(const uint64_t& word) {
  return std::atomic_ref<uint64_t>(const_cast<uint64_t&>(word)).load(std::memory_order_acquire);
}

uint64_t load_relaxed(const uint64_t& word) {
  return std::atomic_ref<uint64_t>(const_cast<uint64_t&>(word)).load(std::memory_order_relaxed);
}

void store_release(uint64_t& word, uint64_t value) {
  std::atomic_ref<uint64_t>(word).store(value, std::memory_order_release);
}

// The start of every segment; the token proves a mapping is the segment its owner announced.
// `gave_up` becomes 1 when the owner failed, so the others fail at once instead of waiting out
// a timeout of their own.
struct alignas(SharedSegments::kLine) Header {
  uint64_t magic;
  uint64_t token;
  uint64_t bytes;
  uint64_t gave_up;
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
    default:
      out << " mapped a segment that is not the one announced (ranks on different nodes?)";
  }
  if (error != 0) out << ": " << std::strerror(error);
  return out.str();
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

}  // namespace

// One mapped segment; unmapped when the last owner (this object, or a tensor's Storage) lets go.
struct SharedSegments::Mapping {
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

struct alignas(SharedSegments::kLine) SharedSegments::Flag {
  uint64_t round;     // published last (release)
  uint64_t sequence;  // written before it
};

namespace {

// Maps an open shared-memory file descriptor (read-write) and closes it. `populate` fills the
// page tables now: right for this rank's own segment, which it uses whole; of another rank's it
// touches only its own shards (1/size), so those pages are mapped on first use.
template <typename Mapping>
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

}  // namespace

SharedSegments::~SharedSegments() = default;

std::unique_ptr<SharedSegments> SharedSegments::create(Communicator& communicator,
                                                       std::span<const SharedBufferSpec> buffers,
                                                       std::string* why_not) {
  for (const SharedBufferSpec& spec : buffers) {
    MPIGRAD_CHECK(core::is_floating(spec.dtype) && spec.numel >= 0, communicator.world_label(),
                  " SharedMemoryAllReduce: buffers must have a "
                  "floating dtype and numel >= 0, got ",
                  spec.dtype, " x ", spec.numel);
  }
#if !defined(__linux__)
  // Not collective here: every rank of a job runs the same operating system.
  if (why_not) *why_not = "shared-memory buckets are implemented for Linux only";
  return nullptr;
#else
  std::unique_ptr<SharedSegments> self(new SharedSegments());
  SharedSegments& s = *self;
  s.communicator_name_ = communicator.name();
  s.world_label_ = communicator.world_label();
  s.rank_ = communicator.rank();
  s.size_ = communicator.size();
  for (int q = 0; q < s.size_; ++q) s.labels_.push_back(communicator.world_rank_of(q));
  s.specs_.assign(buffers.begin(), buffers.end());
  const int rank = s.rank_;
  const int size = s.size_;

  // Layout, the same on every rank: header, two flags per buffer, then the buffers.
  s.flags_offset_ = sizeof(Header);
  size_t bytes = s.flags_offset_ + 2 * buffers.size() * sizeof(Flag);
  for (const SharedBufferSpec& spec : buffers) {
    s.offsets_.push_back(bytes);
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
    } else if (!(own = map_fd<Mapping>(fd, bytes, /*populate=*/true))) {
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
    MPIGRAD_CHECK(records[size_t(q)].layout == records[0].layout, s.world_label_,
                  " SharedMemoryAllReduce on communicator '", communicator.name(), "': rank ",
                  s.label(q),
                  " asked for a different list of buffers (dtypes and "
                  "sizes) than rank ",
                  s.label(0), "; every rank must pass the same buffers");
  }
  s.segments_.resize(size_t(size));
  s.segments_[size_t(rank)] = own;
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
    auto mapping = map_fd<Mapping>(peer_fd, bytes, /*populate=*/false);
    if (!mapping) {
      problem = kOpenPeer * 1000 + errno;
      break;
    }
    auto* header = reinterpret_cast<const Header*>(mapping->data());
    if (header->magic != kMagic || header->token != theirs.token) {
      problem = kPeerMismatch * 1000;
      break;
    }
    s.segments_[size_t(q)] = std::move(mapping);
  }

  // 3. Everyone learns everyone's outcome; once all have mapped, the names can go (the guard).
  core::Tensor outcome = core::Tensor::from_vector<int32_t>({problem}, {1});
  core::Tensor outcomes = core::zeros({size}, core::kInt32);
  communicator.all_gather(outcome, outcomes);
  std::vector<int32_t> codes = outcomes.to_vector<int32_t>();
  for (int q = 0; q < size; ++q) {
    if (codes[size_t(q)] != kOk) {
      if (why_not) *why_not = describe_problem(s.label(q), codes[size_t(q)], bytes, size);
      return nullptr;
    }
  }

  // Own buffers become tensors that keep the mapping alive.
  for (size_t b = 0; b < buffers.size(); ++b) {
    const SharedBufferSpec& spec = buffers[b];
    auto storage = std::make_shared<core::Storage>(
        own->data() + s.offsets_[b], size_t(spec.numel * core::element_size(spec.dtype)),
        core::kCPU, std::shared_ptr<const void>(own));
    s.buffers_.emplace_back(std::make_shared<core::TensorImpl>(
        std::move(storage), core::Shape{spec.numel}, core::Shape{1}, 0, spec.dtype));
  }
  s.round_.assign(buffers.size(), 0);
  s.sequence_.assign(buffers.size(), 0);
  return self;
#endif
}

char* SharedSegments::copy(int owner, size_t index) const {
  return segments_[size_t(owner)]->data() + offsets_[index];
}

SharedSegments::Flag& SharedSegments::flag(int owner, size_t index, bool finished) const {
  auto* flags = reinterpret_cast<Flag*>(segments_[size_t(owner)]->data() + flags_offset_);
  return flags[2 * index + (finished ? 1 : 0)];
}

std::pair<int64_t, int64_t> SharedSegments::shard(size_t index, int owner) const {
  const SharedBufferSpec& spec = specs_[index];
  const int64_t per_line = int64_t(kLine) / core::element_size(spec.dtype);
  const int64_t lines = (spec.numel + per_line - 1) / per_line;
  const int64_t per_rank = (lines + size_ - 1) / size_ * per_line;
  const int64_t begin = std::min(spec.numel, per_rank * owner);
  return {begin, std::min(spec.numel, begin + per_rank)};
}

void SharedSegments::publish_started(size_t index) {
  sequence_[index] = ++starts_;
  Flag& mine = flag(rank_, index, /*finished=*/false);
  // Published by the release store of the round that follows.
  std::atomic_ref<uint64_t>(mine.sequence).store(sequence_[index], std::memory_order_relaxed);
  store_release(mine.round, ++round_[index]);
}

bool SharedSegments::all_started(size_t index, std::string* out_of_step) const {
  for (int q = 0; q < size_; ++q) {
    const Flag& theirs = flag(q, index, /*finished=*/false);
    const uint64_t their_round = load_acquire(theirs.round);
    if (their_round < round_[index]) return false;
    const uint64_t their_sequence = load_relaxed(theirs.sequence);
    if (their_round != round_[index] || their_sequence != sequence_[index]) {
      std::ostringstream why;
      why << "ranks out of step: rank " << label(q) << " started buffer " << index << " (round "
          << their_round << ") as its start #" << their_sequence << ", this rank (round "
          << round_[index] << ") as its start #" << sequence_[index]
          << "; every rank must start the buffers in the same order (did a backward fail on "
             "only some ranks?)";
      *out_of_step = why.str();
      return false;
    }
  }
  return true;
}

void SharedSegments::publish_finished(size_t index) {
  store_release(flag(rank_, index, /*finished=*/true).round, round_[index]);
}

bool SharedSegments::all_finished(size_t index) const {
  for (int q = 0; q < size_; ++q) {
    if (load_acquire(flag(q, index, /*finished=*/true).round) < round_[index]) return false;
  }
  return true;
}

std::string SharedSegments::behind(size_t index, bool finished) const {
  std::ostringstream out;
  for (int q = 0, listed = 0; q < size_; ++q) {
    if (load_acquire(flag(q, index, finished).round) < round_[index]) {
      out << (listed++ ? ", " : "") << label(q);
    }
  }
  return out.str();
}

void SharedSegments::mark_gave_up() {
  store_release(reinterpret_cast<Header*>(segments_[size_t(rank_)]->data())->gave_up, 1);
}

int SharedSegments::first_peer_gave_up() const {
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    const auto* header = reinterpret_cast<const Header*>(segments_[size_t(q)]->data());
    if (load_acquire(header->gave_up) != 0) return q;
  }
  return -1;
}

}  // namespace mpigrad::launch
