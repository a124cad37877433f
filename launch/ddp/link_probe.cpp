// measure_links: see link_probe.h for what is measured and why this way.
#include "mpigrad/launch/ddp/link_probe.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#include "mpigrad/core/tensor.h"

namespace mpigrad::launch {

namespace {

using Clock = std::chrono::steady_clock;

constexpr int64_t kCopyBytes = int64_t(16) << 20;
constexpr int64_t kFirstProbeBytes = int64_t(256) << 10;
constexpr int64_t kMostProbeBytes = int64_t(64) << 20;
constexpr double kLongEnoughSeconds = 0.010;
constexpr double kAgreement = 1.0;  // the two best times within a factor of 2
constexpr size_t kMostTries = 6;
// A size whose rate is this many times below both the previous size's and the copy rate's is
// suspect (probe_bandwidth).
constexpr double kSuspectFactor = 4;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// One rank's copy bandwidth in bytes/s, its best of 5 (the pages are touched first).
double copy_bandwidth() {
  std::vector<char> from(size_t(kCopyBytes), 1), to(size_t(kCopyBytes), 0);
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i < 5; ++i) {
    from[size_t(i)] = char(i);  // a different copy each time, which the compiler must make
    const auto start = Clock::now();
    std::memcpy(to.data(), from.data(), from.size());
    best = std::min(best, seconds_since(start));
  }
  volatile char sink = to[1];
  (void)sink;
  return double(kCopyBytes) / std::max(best, 1e-9);
}

// The slowest leader's value, so every leader takes the same branch.
double slowest(Communicator& leaders, double seconds) {
  core::Tensor value = core::full({1}, seconds, core::kFloat64);
  leaders.all_reduce(value, ReduceOp::Max);
  return value.item<double>();
}

double timed_all_reduce(Communicator& leaders, const core::Tensor& data) {
  const auto start = Clock::now();
  leaders.all_reduce(data, ReduceOp::Sum);
  return slowest(leaders, seconds_since(start));
}

struct LinkProbe {
  double bandwidth = 0, latency = 0, previous = 0;  // previous: from the second-best time
  bool settled = false;
};

// Run by the node leaders only (see link_probe.h).
LinkProbe probe_link(Communicator& leaders, double copy) {
  LinkProbe probe;
  const double nodes = leaders.size();
  const double steps = 2 * (nodes - 1);
  core::Tensor small = core::zeros({2});
  leaders.all_reduce(small);
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i < 5; ++i) {
    const auto start = Clock::now();
    leaders.all_reduce(small);
    best = std::min(best, seconds_since(start));
  }
  probe.latency = slowest(leaders, best) / steps;
  core::Tensor data;
  const BandwidthProbe found = probe_bandwidth(
      [&](int64_t bytes) {
        if (!data.defined() || data.numel() < bytes / 4) data = core::zeros({bytes / 4});
        return timed_all_reduce(leaders, data.narrow(0, 0, bytes / 4));
      },
      leaders.size(), probe.latency, copy);
  probe.bandwidth = found.bandwidth;
  probe.previous = found.previous;
  probe.settled = found.settled;
  return probe;
}

}  // namespace

BandwidthProbe probe_bandwidth(const std::function<double(int64_t bytes)>& time_all_reduce,
                               int node_count, double latency, double copy) {
  BandwidthProbe probe;
  const double nodes = node_count;
  const double steps = 2 * (nodes - 1);
  auto bandwidth = [&](int64_t bytes, double t) {
    return steps / nodes * double(bytes) / std::max(t - steps * latency, 1e-9);
  };
  double spent = 0, before = 0;  // before: the previous size's rate
  bool suspect = false;
  int64_t bytes = kFirstProbeBytes / 2;
  std::vector<double> times;
  // Doubling, two all-reduces a size, until the better one is long enough to time (or the size
  // the largest): one slow all-reduce (a load spike, a connection being set up) does not end the
  // growth, and the bytes sent on the way drain a rate limiter's burst. At least two sizes, and
  // one more after a suspect size: two stalled tries at one size agree with each other as well
  // as two good ones do (2 of 29 runs on a fast link settled on 0.0109 GB/s at the first size).
  while (true) {
    bytes *= 2;
    ++probe.sizes;
    times = {time_all_reduce(bytes), time_all_reduce(bytes)};
    spent += times[0] + times[1];
    std::sort(times.begin(), times.end());
    const double rate = bandwidth(bytes, times[0]);
    // Far slower than the size before and than memory: a real link is as fast at a larger size
    // (only latency weighs more on the small one), so this size stalled, or a rate limiter's
    // burst has just run out. The next size tells which: a link that slow is as slow there.
    suspect = before > 0 && rate * kSuspectFactor < before && rate * kSuspectFactor < copy;
    before = rate;
    if (bytes >= kMostProbeBytes || spent >= kProbeBudgetSeconds) break;
    if (times[0] >= kLongEnoughSeconds && probe.sizes >= 2 && !suspect) break;
  }
  const bool long_enough = times[0] >= kLongEnoughSeconds || bytes >= kMostProbeBytes;
  // Then that size again until its two best times agree: load on the machine only ever adds
  // time, so the best is the link's.
  auto agree = [&] { return times[1] <= (1 + kAgreement) * times[0]; };
  while (long_enough && !agree() && spent < kProbeBudgetSeconds && times.size() < kMostTries) {
    times.push_back(time_all_reduce(bytes));
    spent += times.back();
    std::sort(times.begin(), times.end());
  }
  // A figure from one size only, or from a suspect size the budget left unconfirmed, is none.
  probe.settled = long_enough && agree() && probe.sizes >= 2 && !suspect;
  probe.bytes = bytes;
  probe.bandwidth = bandwidth(bytes, times[0]);
  probe.previous = times.size() > 1 ? bandwidth(bytes, times[1]) : 0;
  probe.spent = spent;
  return probe;
}

std::optional<LinkFigures> measure_links(Communicator& communicator, Communicator& node, int nodes,
                                         std::string* why_not) {
  node.barrier();  // the node's ranks copy at the same time, as the transport's node steps do
  // The best rank's, on every rank: the link probe weighs its figures against it.
  core::Tensor best_copy = core::full({1}, copy_bandwidth(), core::kFloat64);
  communicator.all_reduce(best_copy, ReduceOp::Max);
  const double copy = best_copy.item<double>();
  const bool leader = node.rank() == 0;
  std::unique_ptr<Communicator> leaders =
      communicator.split(leader ? 0 : 1, communicator.rank(), communicator.name() + " link probe");
  LinkProbe probe;
  if (leader) probe = probe_link(*leaders, copy);
  leaders.reset();
  // The leaders agree on everything they measured and the other ranks contribute zeros; the
  // copy bandwidth is the best rank's.
  core::Tensor shared = core::Tensor::from_vector<double>(
      {probe.bandwidth, probe.latency, probe.previous, probe.settled ? 1.0 : 0.0, copy}, {5});
  communicator.all_reduce(shared, ReduceOp::Max);
  const std::vector<double> values = shared.to_vector<double>();
  LinkFigures figures{values[0], values[1], values[4]};
  if (values[3] == 0) {
    if (why_not != nullptr) {
      char text[160];
      std::snprintf(text, sizeof text,
                    "the link's bandwidth between the %d nodes did not settle: its two best "
                    "all-reduces within %zu tries and %.0f ms gave %.3g and %.3g GB/s",
                    nodes, kMostTries, kProbeBudgetSeconds * 1e3, values[0] / 1e9, values[2] / 1e9);
      *why_not = text;
    }
    return std::nullopt;
  }
  return figures;
}

}  // namespace mpigrad::launch
