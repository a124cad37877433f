// SharedMemoryAllReduce: the one-pass protocol (start, average this rank's shard, finish) on
// top of SharedSegments. See the header for the protocol.
#include "mpigrad/launch/ddp/transports/shared_memory_all_reduce.h"

#include <sstream>

#include "mpigrad/core/error.h"
#include "mpigrad/launch/ddp/transports/shard_arithmetic.h"

namespace mpigrad::launch {

struct SharedMemoryAllReduce::Impl {
  std::unique_ptr<SharedSegments> segments;
  double timeout_seconds = 0;
  std::vector<bool> in_flight;
  std::vector<bool> reduced_here;            // this rank's share of the current round is done
  std::vector<BucketCollective> collective;  // what the current round of each buffer does
  std::string failure;  // set by the first failure; every later call repeats it

  std::string where() const {
    std::ostringstream out;
    out << "shared-memory all-reduce on communicator '" << segments->communicator_name() << "' "
        << segments->world_label();
    return out.str();
  }

  // Records the failure, tells the other ranks (so they fail at once rather than time out), and
  // throws. The object is unusable afterwards.
  template <typename... Parts>
  [[noreturn]] void fail(const Parts&... parts) {
    failure = where() + ": " + core::detail::concat(parts...);
    segments->mark_gave_up();
    throw core::Error(failure);
  }

  void check_usable() const {
    if (!failure.empty()) {
      throw core::Error(where() + " is unusable after an earlier failure: " + failure);
    }
  }

  bool all_started(size_t index) {
    std::string out_of_step;
    if (segments->all_started(index, &out_of_step)) return true;
    if (!out_of_step.empty()) fail(out_of_step);
    return false;
  }

  void check_peers_alive() {
    if (int q = segments->first_peer_gave_up(); q >= 0) {
      fail("rank ", segments->label(q),
           " gave up (see its error) while this rank worked on the averaging");
    }
  }

  void reduce_share(size_t index) {
    check_peers_alive();  // a rank that gave up may be using its buffers again
    const SharedSegments& s = *segments;
    // Not a structured binding: clang before 16 cannot capture one in the lambda below.
    const std::pair<int64_t, int64_t> shard = s.shard(index, s.rank());
    const int64_t begin = shard.first, end = shard.second;
    const BucketCollective what = collective[index];
    kernels::visit_floating(s.spec(index).dtype, [&](auto zero) {
      using T = decltype(zero);
      std::vector<T*> copies;
      for (int q = 0; q < s.size(); ++q) copies.push_back(reinterpret_cast<T*>(s.copy(q, index)));
      const double scale = 1.0 / double(s.size());
      if (what == BucketCollective::Average) {
        average_shard(copies, begin, end, scale);
      } else if (what == BucketCollective::ReduceScatter) {
        average_shard_into(copies, size_t(s.rank()), begin, end, scale);
      } else {
        copy_shard(copies, size_t(s.rank()), begin, end);
      }
    });
    reduced_here[index] = true;
    segments->publish_finished(index);
  }

  // Does this rank's share of every buffer all ranks have started.
  void progress() {
    for (size_t b = 0; b < in_flight.size(); ++b) {
      if (in_flight[b] && !reduced_here[b] && all_started(b)) reduce_share(b);
    }
  }

  // Waits until `ready`, doing this rank's share of other buffers meanwhile; past the timeout,
  // fails naming the ranks whose flag is behind.
  template <typename Ready>
  void await(Ready ready, size_t index, bool finished) {
    bool arrived = SharedSegments::poll_until(ready, timeout_seconds, [&] {
      // A peer that gave up may have seen what this rank is waiting for go wrong (say, ranks
      // out of step): look once more so the report names the cause, not just the peer.
      if (segments->first_peer_gave_up() >= 0) ready();
      check_peers_alive();
      progress();
    });
    if (arrived) return;
    fail("waited more than ", timeout_seconds, " s for buffer ", index, " (round ",
         segments->round(index), "): rank(s) ", segments->behind(index, finished),
         finished ? " have not finished their share" : " have not started it");
  }
};

SharedMemoryAllReduce::SharedMemoryAllReduce(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

SharedMemoryAllReduce::~SharedMemoryAllReduce() {
  // Other ranks may still be averaging into this rank's buffers: finish what is in flight.
  if (!impl_->failure.empty()) return;
  for (size_t b = 0; b < impl_->in_flight.size(); ++b) {
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
  std::unique_ptr<SharedSegments> segments = SharedSegments::create(communicator, buffers, why_not);
  if (!segments) return nullptr;
  auto impl = std::make_unique<Impl>();
  impl->segments = std::move(segments);
  impl->timeout_seconds = timeout_seconds;
  impl->in_flight.assign(buffers.size(), false);
  impl->reduced_here.assign(buffers.size(), false);
  impl->collective.assign(buffers.size(), BucketCollective::Average);
  return std::unique_ptr<SharedMemoryAllReduce>(new SharedMemoryAllReduce(std::move(impl)));
}

int SharedMemoryAllReduce::rank() const {
  return impl_->segments->rank();
}
int SharedMemoryAllReduce::size() const {
  return impl_->segments->size();
}
size_t SharedMemoryAllReduce::buffer_count() const {
  return impl_->segments->buffer_count();
}
const core::Tensor& SharedMemoryAllReduce::buffer(size_t index) const {
  return impl_->segments->buffer(index);
}
bool SharedMemoryAllReduce::in_flight(size_t index) const {
  return impl_->in_flight.at(index);
}

std::pair<int64_t, int64_t> SharedMemoryAllReduce::shard(size_t index, int rank) const {
  return impl_->segments->shard(index, rank);
}

void SharedMemoryAllReduce::start(size_t index, BucketCollective collective) {
  Impl& s = *impl_;
  s.check_usable();
  MPIGRAD_CHECK(index < s.in_flight.size() && !s.in_flight[index], s.segments->world_label(),
                " SharedMemoryAllReduce::start: buffer ", index,
                index < s.in_flight.size() ? " is already in flight" : " does not exist");
  s.in_flight[index] = true;
  s.reduced_here[index] = false;
  s.collective[index] = collective;
  s.segments->publish_started(index);
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
  s.await([&] { return s.segments->all_finished(index); }, index, true);
  s.in_flight[index] = false;
}

}  // namespace mpigrad::launch
