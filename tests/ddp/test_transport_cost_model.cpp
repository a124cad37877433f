// decide_auto_transport (launch/ddp/transport_cost_model.h): the cost model's predictions, the
// choice in several bandwidth regimes, ties, degenerate layouts and unusable figures. Pure, so it
// runs the same on every rank of the MPI test binary.
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "doctest/doctest.h"
#include "mpigrad/launch/ddp/transport_cost_model.h"

using namespace mpigrad;
using launch::LinkFigures;
using launch::TransportKind;

namespace {

const std::vector<int64_t> kBuckets{9'400'000};  // the 9.4 MB of gradients, one bucket

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("transport cost model: the predictions follow the stated formulas") {
  const LinkFigures slow{0.025e9, 50e-6, 5e9};
  // communicator on 2 x 2: 2 log2(4) alpha + 2 x 2 x 1/2 n / beta + 2 x 1/4 n / sigma.
  CHECK(launch::predict_communicator_seconds(2, 2, slow, kBuckets) ==
        doctest::Approx(4 * 50e-6 + 2 * 9.4e6 / 0.025e9 + 0.5 * 9.4e6 / 5e9));
  // hierarchical on 2 x 2: 1.5 n / sigma + 5 pieces (4.7 MB shards) x 2 alpha + n / beta.
  CHECK(launch::predict_hierarchical_seconds(2, 2, slow, kBuckets) ==
        doctest::Approx(1.5 * 9.4e6 / 5e9 + 5 * 2 * 50e-6 + 9.4e6 / 0.025e9));
  // One rank a node: no shared memory either way, the same bytes over the link (4 nodes: 3/2 n),
  // and the hierarchical ring's 6 steps for each of 9 pieces against 2 log2(4).
  CHECK(launch::predict_hierarchical_seconds(4, 1, slow, kBuckets) ==
        doctest::Approx(9 * 6 * 50e-6 + 1.5 * 9.4e6 / 0.025e9));
  CHECK(launch::predict_communicator_seconds(4, 1, slow, kBuckets) ==
        doctest::Approx(4 * 50e-6 + 1.5 * 9.4e6 / 0.025e9));
  // 3 ranks a node: ceil(log2 6) = 3 steps, each link carries 2 x 3 x 1/2 n.
  CHECK(launch::predict_communicator_seconds(2, 3, slow, kBuckets) ==
        doctest::Approx(6 * 50e-6 + 3 * 9.4e6 / 0.025e9 + 2 * 2.0 / 6 * 9.4e6 / 5e9));
  // Per step is the sum over the buckets: two halves cost one bucket's bytes, twice the latency.
  const std::vector<int64_t> halves{4'700'000, 4'700'000};
  CHECK(launch::predict_communicator_seconds(2, 2, slow, halves) ==
        doctest::Approx(launch::predict_communicator_seconds(2, 2, slow, kBuckets) + 4 * 50e-6));
}

TEST_CASE(
    "transport cost model: compression halves the communicator's bytes, hierarchical's link") {
  const LinkFigures slow{0.025e9, 50e-6, 5e9};
  // The communicator casts the whole bucket: every byte term of its formula at n / 2.
  CHECK(launch::predict_communicator_seconds(2, 2, slow, kBuckets, 0.5) ==
        doctest::Approx(4 * 50e-6 + 2 * 4.7e6 / 0.025e9 + 0.5 * 4.7e6 / 5e9));
  // The hierarchical transport rounds only the inter-node step: shared memory at n, link at n / 2,
  // as many 1 MiB pieces as without compression.
  CHECK(launch::predict_hierarchical_seconds(2, 2, slow, kBuckets, 0.5) ==
        doctest::Approx(1.5 * 9.4e6 / 5e9 + 5 * 2 * 50e-6 + 4.7e6 / 0.025e9));
  // A slow link still picks hierarchical under compression, and the line says the wire's ratio.
  const auto decision = launch::decide_auto_transport(2, 2, slow, "", kBuckets, 0.5);
  CHECK(decision.kind == TransportKind::Hierarchical);
  INFO(decision.reason);
  CHECK(decision.reason.ends_with(" per step for 9.4 MB of buckets, sent at 0.5x (compression))"));
  // A fast link: the communicator's shared-memory-free flat all-reduce wins as without it.
  const LinkFigures fast{25e9, 2e-6, 5e9};
  CHECK(launch::decide_auto_transport(2, 2, fast, "", kBuckets, 0.5).kind ==
        TransportKind::Communicator);
}

TEST_CASE("transport cost model: a slow link picks hierarchical, and the line says why") {
  const LinkFigures slow{0.25e9, 45e-6, 9.8e9};
  const auto decision = launch::decide_auto_transport(2, 2, slow, "", kBuckets);
  CHECK(decision.kind == TransportKind::Hierarchical);
  CHECK(decision.by_measurement);
  CHECK(decision.hierarchical_seconds < decision.communicator_seconds);
  CHECK(decision.link_bytes_per_second == 0.25e9);  // what decides how the thread waits
  INFO(decision.reason);
  CHECK(decision.reason.starts_with(
      "transport auto: hierarchical (link 0.25 GB/s, 45 us; shm 9.8 GB/s; predicted "));
  CHECK(contains(decision.reason, " ms vs communicator "));
  CHECK(decision.reason.ends_with(" ms per step for 9.4 MB of buckets)"));
  CHECK_FALSE(contains(decision.reason, "tie"));
  // More ranks a node only widen the gap: each of them crosses the link in the flat all-reduce.
  CHECK(launch::decide_auto_transport(8, 4, slow, "", kBuckets).kind ==
        TransportKind::Hierarchical);
}

TEST_CASE("transport cost model: a link faster than a rank's copy picks the communicator") {
  // A 200 Gbit/s InfiniBand-class link against 5 GB/s of copying a rank: the shared-memory
  // passes cost more than the twice as many bytes the flat all-reduce sends over the link.
  const LinkFigures fast{25e9, 2e-6, 5e9};
  const auto decision = launch::decide_auto_transport(2, 2, fast, "", kBuckets);
  CHECK(decision.kind == TransportKind::Communicator);
  CHECK(decision.by_measurement);
  CHECK(decision.communicator_seconds < 0.9 * decision.hierarchical_seconds);
  INFO(decision.reason);
  CHECK(
      decision.reason.starts_with("transport auto: communicator (link 25 GB/s, 2 us; shm 5 GB/s;"));
  CHECK(contains(decision.reason, " vs hierarchical "));
}

TEST_CASE("transport cost model: ties within 10% go to the hierarchical transport") {
  SUBCASE("one rank a node: the same bytes either way, in 1 MiB pieces for hierarchical") {
    const auto decision =
        launch::decide_auto_transport(2, 1, LinkFigures{0.1e9, 10e-6, 6e9}, "", kBuckets);
    CHECK(decision.kind == TransportKind::Hierarchical);
    CHECK(decision.communicator_seconds < decision.hierarchical_seconds);
    CHECK(decision.communicator_seconds > 0.99 * decision.hierarchical_seconds);
    INFO(decision.reason);
    CHECK(contains(decision.reason, "a tie within 10%, which goes to hierarchical"));
  }
  // No latency, on 2 x 2: communicator / hierarchical = (2 / beta + 0.5 / sigma) / (1 / beta +
  // 1.5 / sigma), 0.95 at beta = 1.135 sigma and 0.85 at 1.484 sigma.
  SUBCASE("the communicator 5% faster is a tie") {
    const auto decision =
        launch::decide_auto_transport(2, 2, LinkFigures{11.35e9, 0, 10e9}, "", kBuckets);
    CHECK(decision.communicator_seconds < decision.hierarchical_seconds);
    CHECK(decision.communicator_seconds > 0.9 * decision.hierarchical_seconds);
    CHECK(decision.kind == TransportKind::Hierarchical);
    CHECK(contains(decision.reason, "a tie within 10%"));
  }
  SUBCASE("the communicator 15% faster is not") {
    const auto decision =
        launch::decide_auto_transport(2, 2, LinkFigures{14.84e9, 0, 10e9}, "", kBuckets);
    CHECK(decision.communicator_seconds < 0.9 * decision.hierarchical_seconds);
    CHECK(decision.kind == TransportKind::Communicator);
  }
}

TEST_CASE("transport cost model: degenerate layouts and unusable figures keep the layout rule") {
  const LinkFigures good{1e9, 10e-6, 5e9};
  SUBCASE("one node") {
    const auto decision = launch::decide_auto_transport(1, 4, good, "", kBuckets);
    CHECK(decision.kind == TransportKind::SharedMemory);
    CHECK_FALSE(decision.by_measurement);
  }
  SUBCASE("nodes holding different numbers of ranks") {
    const auto decision = launch::decide_auto_transport(3, 0, good, "", kBuckets);
    CHECK(decision.kind == TransportKind::Communicator);
    CHECK_FALSE(decision.by_measurement);
    CHECK(contains(decision.reason, "different numbers of ranks"));
  }
  SUBCASE("not measured: the reason is passed on") {
    const auto decision =
        launch::decide_auto_transport(2, 2, std::nullopt, "the nodes are simulated", kBuckets);
    CHECK(decision.kind == TransportKind::Hierarchical);
    CHECK_FALSE(decision.by_measurement);
    CHECK(decision.link_bytes_per_second == 0);  // no measured link: the thread blocks
    CHECK(decision.reason ==
          "transport auto: hierarchical by the layout rule (the nodes are simulated)");
  }
  SUBCASE("a zero, negative or non-finite figure") {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    const double inf = std::numeric_limits<double>::infinity();
    for (const LinkFigures& bad :
         {LinkFigures{0, 10e-6, 5e9}, LinkFigures{1e9, -1, 5e9}, LinkFigures{1e9, 10e-6, 0},
          LinkFigures{nan, 10e-6, 5e9}, LinkFigures{1e9, 10e-6, inf}}) {
      const auto decision = launch::decide_auto_transport(2, 2, bad, "", kBuckets);
      CHECK(decision.kind == TransportKind::Hierarchical);
      CHECK_FALSE(decision.by_measurement);
      CHECK(contains(decision.reason, "by the layout rule (the measurement is unusable: link "));
    }
  }
  SUBCASE("no bucket bytes") {
    const auto decision = launch::decide_auto_transport(2, 2, good, "", std::vector<int64_t>{});
    CHECK(decision.kind == TransportKind::Hierarchical);
    CHECK_FALSE(decision.by_measurement);
    CHECK(contains(decision.reason, "no gradient bytes to predict for"));
  }
}
