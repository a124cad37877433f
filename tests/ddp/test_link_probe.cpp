// The link probe's bandwidth search (launch/ddp/link_probe.h, probe_bandwidth) on made-up links:
// it must not settle on one slow size when the link is fast (2 of 29 runs on a fast link reported
// 0.0109 GB/s, both tries at the first size having taken about 24 ms), and must still find a link
// that is really slow, or slow after a rate limiter's first burst.
#include <doctest/doctest.h>

#include <cstdint>
#include <map>

#include "mpigrad/launch/ddp/link_probe.h"

using mpigrad::launch::BandwidthProbe;
using mpigrad::launch::probe_bandwidth;

namespace {

constexpr double kLatency = 20e-6;  // one ring step
constexpr double kCopy = 10e9;      // the node's copy rate, bytes/s
constexpr int kNodes = 2;

// An all-reduce of `bytes` among 2 nodes over a link of `rate` bytes/s: 2 (N - 1) steps, each
// sending bytes / N (the ring the probe's figures assume).
double ring_seconds(int64_t bytes, double rate) {
  const double steps = 2.0 * (kNodes - 1);
  return steps * kLatency + steps / kNodes * double(bytes) / rate;
}

// A link of `rate` whose all-reduces of the sizes in `stalls` take that long instead, every time.
struct Link {
  double rate;
  std::map<int64_t, double> stalls;
  int calls = 0;
  double operator()(int64_t bytes) {
    ++calls;
    auto stall = stalls.find(bytes);
    return stall != stalls.end() ? stall->second : ring_seconds(bytes, rate);
  }
};

BandwidthProbe probe(Link& link) {
  return probe_bandwidth([&](int64_t bytes) { return link(bytes); }, kNodes, kLatency, kCopy);
}

}  // namespace

TEST_CASE("link probe: a fast link whose first size stalled twice is still found fast") {
  Link link{1e9, {{int64_t(256) << 10, 0.024}}};
  const BandwidthProbe found = probe(link);
  INFO("bandwidth " << found.bandwidth / 1e9 << " GB/s at " << found.bytes << " bytes after "
                    << found.sizes << " sizes");
  CHECK(found.settled);
  CHECK(found.sizes >= 2);
  CHECK(found.bandwidth == doctest::Approx(1e9).epsilon(0.2));
}

TEST_CASE("link probe: a size far slower than the one before and than memory is tried past") {
  // The second size stalls where the first was fast: suspect, so the probe goes on.
  Link link{1e9, {{int64_t(512) << 10, 0.024}}};
  const BandwidthProbe found = probe(link);
  INFO("bandwidth " << found.bandwidth / 1e9 << " GB/s at " << found.bytes << " bytes");
  CHECK(found.settled);
  CHECK(found.bandwidth == doctest::Approx(1e9).epsilon(0.2));
}

TEST_CASE("link probe: a link that is really slow is found slow, at two sizes at least") {
  Link link{0.02e9, {}};
  const BandwidthProbe found = probe(link);
  CHECK(found.settled);
  CHECK(found.sizes >= 2);
  CHECK(found.bandwidth == doctest::Approx(0.02e9).epsilon(0.2));
  CHECK(found.spent <= mpigrad::launch::kProbeBudgetSeconds + 0.2);
}

TEST_CASE("link probe: a rate limiter's first burst does not hide its rate") {
  // Each all-reduce's first 200 kB go at 2 GB/s, the rest at 25 MB/s (200 Mbit/s).
  struct Bucket {
    int64_t burst = 200000;
    double fast = 2e9, slow = 25e6;
  } bucket;
  auto bucket_seconds = [&](int64_t bytes) {
    const double per_node = double(bytes) / kNodes * 2.0 * (kNodes - 1);
    const double quick = std::min(per_node, double(bucket.burst));
    return 2.0 * (kNodes - 1) * kLatency + quick / bucket.fast + (per_node - quick) / bucket.slow;
  };
  const BandwidthProbe found = probe_bandwidth(bucket_seconds, kNodes, kLatency, kCopy);
  CHECK(found.settled);
  CHECK(found.bandwidth < 2 * bucket.slow);
  CHECK(found.bandwidth > 0.5 * bucket.slow);
}
