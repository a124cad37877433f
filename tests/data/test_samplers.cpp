// Samplers: PyTorch's DistributedSampler arithmetic over many (N, R, shuffle, drop_last, seed,
// epoch), exact padding against values PyTorch produces, disjointness, determinism, and the
// fixed Philox permutation.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

#include "mpigrad/core/error.h"
#include "mpigrad/data/sampler.h"

namespace {

using namespace mpigrad::data;  // NOLINT

std::vector<std::vector<int64_t>> all_ranks(int64_t n, int64_t ranks, bool shuffle, uint64_t seed,
                                            bool drop_last, int64_t epoch) {
  std::vector<std::vector<int64_t>> result;
  for (int64_t r = 0; r < ranks; ++r) {
    DistributedSampler sampler(n, ranks, r, shuffle, seed, drop_last);
    sampler.set_epoch(epoch);
    result.push_back(sampler.indices());
    CHECK(int64_t(result.back().size()) == sampler.size());
  }
  return result;
}

}  // namespace

TEST_CASE("random_permutation is a fixed, platform-independent permutation") {
  for (int64_t n : {0, 1, 2, 17, 1000}) {
    std::vector<int64_t> p = random_permutation(n, 7);
    std::vector<int64_t> sorted = p;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int64_t> expected(static_cast<size_t>(n));
    std::iota(expected.begin(), expected.end(), 0);
    CHECK(sorted == expected);
  }
  CHECK(random_permutation(100, 1) == random_permutation(100, 1));
  CHECK(random_permutation(100, 1) != random_permutation(100, 2));
  // Golden values: the permutation must never change between versions or platforms.
  CHECK(random_permutation(10, 42) == std::vector<int64_t>{5, 8, 1, 2, 9, 4, 3, 7, 0, 6});
}

TEST_CASE("DistributedSampler: padding and truncation are exactly PyTorch's") {
  // torch.utils.data.DistributedSampler(range(10), num_replicas=4, rank=r, shuffle=False)
  CHECK(all_ranks(10, 4, false, 0, false, 0) ==
        std::vector<std::vector<int64_t>>{{0, 4, 8}, {1, 5, 9}, {2, 6, 0}, {3, 7, 1}});
  // ... with drop_last=True: num_samples = ceil((10 - 4) / 4) = 2.
  CHECK(all_ranks(10, 4, false, 0, true, 0) ==
        std::vector<std::vector<int64_t>>{{0, 4}, {1, 5}, {2, 6}, {3, 7}});
  // range(5), 4 replicas: [0..4, 0, 1, 2] split by stride.
  CHECK(all_ranks(5, 4, false, 0, false, 0) ==
        std::vector<std::vector<int64_t>>{{0, 4}, {1, 0}, {2, 1}, {3, 2}});
  CHECK(all_ranks(5, 4, false, 0, true, 0) ==
        std::vector<std::vector<int64_t>>{{0}, {1}, {2}, {3}});
  CHECK(all_ranks(7, 3, false, 0, false, 0) ==
        std::vector<std::vector<int64_t>>{{0, 3, 6}, {1, 4, 0}, {2, 5, 1}});
}

TEST_CASE("DistributedSampler properties over many (N, R, shuffle, drop_last, seed, epoch)") {
  int combinations = 0;
  for (int64_t n : {1, 2, 3, 5, 8, 10, 17, 64, 101}) {
    for (int64_t ranks : {1, 2, 3, 4, 7, 8}) {
      if (n < ranks) continue;
      for (bool shuffle : {false, true}) {
        for (bool drop_last : {false, true}) {
          for (uint64_t seed : {0ull, 1234ull}) {
            for (int64_t epoch : {0, 1, 5}) {
              CAPTURE(n);
              CAPTURE(ranks);
              CAPTURE(shuffle);
              CAPTURE(drop_last);
              CAPTURE(seed);
              CAPTURE(epoch);
              ++combinations;
              auto per_rank = all_ranks(n, ranks, shuffle, seed, drop_last, epoch);
              const int64_t expected_length = drop_last && n % ranks != 0
                                                  ? (n - ranks + ranks - 1) / ranks
                                                  : (n + ranks - 1) / ranks;
              // The global order every rank derives, then indices[r::R].
              std::vector<int64_t> global = shuffle ? random_permutation(n, seed + uint64_t(epoch))
                                                    : random_permutation(0, 0);
              if (!shuffle) {
                global.resize(size_t(n));
                std::iota(global.begin(), global.end(), 0);
              }
              const int64_t total = expected_length * ranks;
              std::multiset<int64_t> seen;
              for (int64_t r = 0; r < ranks; ++r) {
                REQUIRE(int64_t(per_rank[size_t(r)].size()) == expected_length);
                for (int64_t i = 0; i < expected_length; ++i) {
                  const int64_t position = r + i * ranks;  // in the padded/truncated list
                  CHECK(per_rank[size_t(r)][size_t(i)] == global[size_t(position % n)]);
                  seen.insert(per_rank[size_t(r)][size_t(i)]);
                }
              }
              CHECK(int64_t(seen.size()) == total);
              std::set<int64_t> distinct(seen.begin(), seen.end());
              if (!drop_last) {
                CHECK(int64_t(distinct.size()) == n);  // the union covers the dataset
              } else {
                CHECK(int64_t(distinct.size()) == total);  // truncation never repeats
              }
              if (n % ranks == 0) CHECK(int64_t(distinct.size()) == total);  // disjoint ranks
              // Same seed and epoch: the same order again; another epoch: another order.
              CHECK(all_ranks(n, ranks, shuffle, seed, drop_last, epoch) == per_rank);
              if (shuffle && n >= 8)
                CHECK(all_ranks(n, ranks, shuffle, seed, drop_last, epoch + 1) != per_rank);
            }
          }
        }
      }
    }
  }
  CHECK(combinations > 500);
}

TEST_CASE("DistributedSampler refuses fewer samples than ranks and bad ranks") {
  CHECK_THROWS_WITH_AS(DistributedSampler(3, 4, 0), doctest::Contains("fewer than the 4 ranks"),
                       mpigrad::core::Error);
  CHECK_THROWS_AS(DistributedSampler(10, 4, 4), mpigrad::core::Error);
  CHECK_THROWS_AS(DistributedSampler(10, 0, 0), mpigrad::core::Error);
  static_assert(DistributedSamplerLike<DistributedSampler>);
  static_assert(!DistributedSamplerLike<RandomSampler>);
}

TEST_CASE("SequentialSampler, RandomSampler and BatchSampler") {
  CHECK(SequentialSampler(4).indices() == std::vector<int64_t>{0, 1, 2, 3});
  RandomSampler random(20, 5);
  auto epoch0 = random.indices();
  CHECK(random.indices() == epoch0);
  random.set_epoch(1);
  CHECK(random.indices() != epoch0);
  CHECK(random.indices() == random_permutation(20, 6));
  RandomSampler with_replacement(5, 1, true, 100);
  auto draws = with_replacement.indices();
  CHECK(draws.size() == 100);
  CHECK(std::set<int64_t>(draws.begin(), draws.end()).size() ==
        5);  // all 5 values appear in 100 draws
  CHECK_THROWS_AS(RandomSampler(5, 0, false, 6), mpigrad::core::Error);

  auto sequential = std::make_shared<SequentialSampler>(10);
  BatchSampler keep(sequential, 4, false), drop(sequential, 4, true);
  CHECK(keep.size() == 3);
  CHECK(keep.batches() == std::vector<std::vector<int64_t>>{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9}});
  CHECK(drop.size() == 2);
  CHECK(drop.batches().size() == 2);
  CHECK_THROWS_AS(BatchSampler(sequential, 0, false), mpigrad::core::Error);
}
