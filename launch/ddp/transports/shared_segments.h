// The memory and the signalling that the shared-memory averaging of the ranks of one node is built
// on (SharedMemoryAllReduce for one node, HierarchicalAllReduce's two node steps). Each rank of
// the group owns one POSIX shared-memory segment holding its copy of every buffer, and maps every
// other rank's: rank r can read and write rank q's copy of buffer b at copy(q, b).
//
// Layout of a segment, the same on every rank: a header (a token proving a mapping is the segment
// its owner announced, and a "gave up" word), two flags per buffer, then the buffers, each on its
// own cache line. A flag holds a round and a sequence number on a line of its own, so a rank
// polling another's flag never shares a line with data:
// - "started" (flag 0): this rank's copy of buffer b holds its contribution for round `round`,
//   and it was this rank's start number `sequence`, which must agree across ranks (a rank whose
//   backward failed halfway and went on would otherwise have its buffers averaged with the wrong
//   ones);
// - "finished" (flag 1): this rank has written its shard of round `round` into every copy.
//
// Buffers are cut into shards on cache lines, shard q belonging to rank q, so no two ranks ever
// write one line.
//
// Thread-safety: the round bookkeeping of a buffer belongs to one thread at a time; a caller
// that hands a buffer between threads (HierarchicalAllReduce) orders the hand-over itself. The
// flags themselves are atomics and may be read from any thread.
//
// The segments are unlinked as soon as every rank has mapped them (or create() gives up), so
// nothing is left in /dev/shm even if a rank dies later; a mapping lives as long as a tensor
// views it. Linux only (create() says so elsewhere).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "mpigrad/core/tensor.h"
#include "mpigrad/launch/comm/communicator.h"

namespace mpigrad::launch {

struct SharedBufferSpec {
  core::DType dtype = core::kFloat32;  // a floating dtype
  int64_t numel = 0;
};

class SharedSegments {
 public:
  static constexpr size_t kLine = 64;  // flags, buffers and shards start on their own line

  // Collective over `communicator`. Returns null on every rank, with the reason in `*why_not`,
  // when the ranks cannot share memory: not all on one node, no POSIX shared memory, or too
  // little room in /dev/shm. Different buffer lists on different ranks are a core::Error on
  // every rank.
  static std::unique_ptr<SharedSegments> create(Communicator& communicator,
                                                std::span<const SharedBufferSpec> buffers,
                                                std::string* why_not = nullptr);
  ~SharedSegments();
  SharedSegments(const SharedSegments&) = delete;
  SharedSegments& operator=(const SharedSegments&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // How messages name rank q of this group: by its rank in mpigrad's world (the communicator's
  // Communicator::world_rank_of), never by q.
  int label(int rank) const { return labels_.empty() ? rank : labels_[size_t(rank)]; }
  // "[rank r/w]" of this rank in mpigrad's world (Communicator::world_label).
  const std::string& world_label() const { return world_label_; }
  const std::string& communicator_name() const { return communicator_name_; }
  size_t buffer_count() const { return specs_.size(); }
  const SharedBufferSpec& spec(size_t index) const { return specs_[index]; }
  // This rank's copy of buffer `index`, zero at creation; it stays valid after this object is
  // gone (the tensor keeps the mapping).
  const core::Tensor& buffer(size_t index) const { return buffers_.at(index); }
  // Where `owner`'s copy of buffer `index` starts.
  char* copy(int owner, size_t index) const;
  // `owner`'s shard of buffer `index`, as an element range [first, second).
  std::pair<int64_t, int64_t> shard(size_t index, int owner) const;

  // ---- Rounds: how often this rank started each buffer, checked against the others ----------
  uint64_t round(size_t index) const { return round_[index]; }
  // This rank's copy of buffer `index` holds its contribution to the next round.
  void publish_started(size_t index);
  // Whether every rank has started buffer `index` in this rank's current round. A rank that is
  // out of step (another round, or this buffer as a different one of its starts) makes it
  // return false with the reason in `*out_of_step`.
  bool all_started(size_t index, std::string* out_of_step) const;
  // This rank has written its shard of the current round into every copy.
  void publish_finished(size_t index);
  bool all_finished(size_t index) const;
  // The ranks whose flag (started, or finished) is behind this rank's round: "1, 3".
  std::string behind(size_t index, bool finished) const;

  // ---- Giving up: a rank that fails says so, and the others fail at once ---------------------
  void mark_gave_up();
  int first_peer_gave_up() const;  // a rank other than this one that gave up, or -1

  // Polls `ready` until it holds (true) or `timeout_seconds` pass (false; <= 0: no bound):
  // spins briefly, then yields, then naps 20 us, calling `between` every 64 polls, so a node
  // with more ranks than cores still moves on; the timeout is checked after every yield or nap.
  // `between` may throw to stop waiting.
  template <typename Ready, typename Between>
  static bool poll_until(Ready&& ready, double timeout_seconds, Between&& between);

 private:
  struct Mapping;
  struct Flag;
  SharedSegments() = default;
  Flag& flag(int owner, size_t index, bool finished) const;

  std::string communicator_name_;
  std::string world_label_;
  int rank_ = 0;
  int size_ = 1;
  std::vector<int> labels_;
  std::vector<SharedBufferSpec> specs_;
  std::vector<size_t> offsets_;  // byte offset of each buffer in a segment
  size_t flags_offset_ = 0;
  std::vector<std::shared_ptr<Mapping>> segments_;  // one per rank, own included
  std::vector<core::Tensor> buffers_;               // this rank's, as tensors
  std::vector<uint64_t> round_;                     // how often each buffer was started
  std::vector<uint64_t> sequence_;  // this rank's start count when it last started each buffer
  uint64_t starts_ = 0;             // buffers started in all
};

// ---- Implementation of the template ------------------------------------------------------------

namespace detail {
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}
}  // namespace detail

template <typename Ready, typename Between>
bool SharedSegments::poll_until(Ready&& ready, double timeout_seconds, Between&& between) {
  using Clock = std::chrono::steady_clock;
  Clock::time_point since{};
  for (uint64_t spins = 0; !ready(); ++spins) {
    if (spins < 256) {
      detail::cpu_relax();
      continue;
    }
    if (spins % 64 == 0) between();
    if (spins < 4096) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    // The clock is read after every yield or nap, not every 64th: on a starved core (this runs on
    // the communication thread, beside the computation) one yield can last tens of ms, and 64 of
    // them stretched the DDP timeout past the collective timeout (ddp_hierarchical_hang_np4 with
    // six busy loops beside it: rank 0 never timed out before rank 2's watchdog aborted, 5 of 5).
    if (timeout_seconds <= 0) continue;
    if (since == Clock::time_point{}) since = Clock::now();
    if (std::chrono::duration<double>(Clock::now() - since).count() > timeout_seconds) {
      return ready();
    }
  }
  return true;
}

}  // namespace mpigrad::launch
