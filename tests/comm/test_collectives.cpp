// Every collective x dtype x size (0, 1, odd, ~1M) in blocking and async, in-place and
// out-of-place forms (the gathers to the first and the last root), checked exactly against
// values computed here; and the gathers' argument errors. Data are small integers so
// every dtype (bfloat16 and uint8 included) represents every partial sum exactly.
#include <doctest/doctest.h>

#include <cstdint>
#include <numeric>
#include <vector>

#include "mpigrad/core/tensor.h"
#include "mpigrad/launch/comm/mpi_communicator.h"
#include "mpigrad/launch/job/distributed_manager.h"

using namespace mpigrad;
using launch::ReduceOp;

namespace {

const core::DType kDTypes[] = {core::kFloat32, core::kFloat64, core::kBFloat16, core::kFloat16,
                               core::kInt32,   core::kInt64,   core::kUInt8};
const int64_t kSizes[] = {0, 1, 1001, int64_t(1) << 20};

// Rank r's element i.
double value(int rank, int64_t i) {
  return double((rank + 1) * (i % 7 + 1));
}

core::Tensor rank_tensor(core::DType dtype, int64_t n, int rank, int64_t first = 0) {
  std::vector<double> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) values[size_t(i)] = value(rank, first + i);
  return core::Tensor::from_vector<double>(values, {n}, dtype);
}

double reduce_expected(ReduceOp op, int size, int64_t i) {
  double sum = 0, best_max = value(0, i), best_min = value(0, i);
  for (int r = 0; r < size; ++r) {
    sum += value(r, i);
    best_max = std::max(best_max, value(r, i));
    best_min = std::min(best_min, value(r, i));
  }
  switch (op) {
    case ReduceOp::Sum:
      return sum;
    case ReduceOp::Avg:
      return sum / size;
    case ReduceOp::Max:
      return best_max;
    case ReduceOp::Min:
      return best_min;
  }
  return 0;
}

// Compares all elements and reports only the first mismatch (a 1M-element CHECK loop would
// print a million lines on failure).
void check_values(const core::Tensor& tensor, const std::vector<double>& expected,
                  const char* what) {
  std::vector<double> got = tensor.to_vector<double>();
  REQUIRE(got.size() == expected.size());
  size_t bad = got.size();
  for (size_t i = 0; i < got.size() && bad == got.size(); ++i) {
    if (got[i] != expected[i]) bad = i;
  }
  INFO(what << " dtype " << tensor.dtype() << " numel " << tensor.numel());
  if (bad != got.size()) {
    INFO("first mismatch at " << bad << ": got " << got[bad] << ", expected " << expected[bad]);
    CHECK(false);
  }
}

}  // namespace

TEST_CASE("all_reduce: every op, dtype and size, blocking/async, in-place/out-of-place") {
  auto manager = launch::DistributedManager::initialize();
  launch::Communicator& world = manager.world();
  const int rank = world.rank(), size = world.size();
  for (core::DType dtype : kDTypes) {
    for (int64_t n : kSizes) {
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
        if (op == ReduceOp::Avg && !core::is_floating(dtype)) continue;
        // The full dtype x op matrix at 1M elements would dominate the suite's runtime; at that
        // size we run sum for every dtype and the other ops for float32 and bfloat16.
        if (n > 4096 && op != ReduceOp::Sum && dtype != core::kFloat32 &&
            dtype != core::kBFloat16) {
          continue;
        }
        std::vector<double> expected(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) expected[size_t(i)] = reduce_expected(op, size, i);
        CAPTURE(n);
        CAPTURE(launch::reduce_op_name(op));

        core::Tensor input = rank_tensor(dtype, n, rank);
        core::Tensor output = core::empty({n}, dtype);
        world.all_reduce(input, output, op);  // out-of-place, blocking
        check_values(output, expected, "all_reduce out-of-place");
        check_values(input,
                     std::vector<double>(rank_tensor(core::kFloat64, n, rank).to_vector<double>()),
                     "all_reduce leaves its input alone");

        core::Tensor inplace = rank_tensor(dtype, n, rank);
        launch::WorkPtr work = world.all_reduce_async(inplace, op);  // in-place, async
        while (!work->test()) {
        }
        check_values(inplace, expected, "all_reduce in-place async");

        if (op == ReduceOp::Sum) {
          core::Tensor again = rank_tensor(dtype, n, rank);
          world.all_reduce(again, op);  // in-place, blocking
          check_values(again, expected, "all_reduce in-place");
          core::Tensor out2 = core::empty({n}, dtype);
          world.all_reduce_async(rank_tensor(dtype, n, rank), out2, op)
              ->wait();  // out-of-place async
          check_values(out2, expected, "all_reduce out-of-place async");
        }
      }
    }
  }
}

TEST_CASE("broadcast, all_gather and reduce_scatter: every dtype and size") {
  auto manager = launch::DistributedManager::initialize();
  launch::Communicator& world = manager.world();
  const int rank = world.rank(), size = world.size();
  for (core::DType dtype : kDTypes) {
    for (int64_t n : kSizes) {
      CAPTURE(n);
      // broadcast from the last rank (blocking) and from rank 0 (async).
      for (int root : {size - 1, 0}) {
        core::Tensor tensor = rank_tensor(dtype, n, rank);
        if (root == 0) {
          world.broadcast_async(tensor, root)->wait();
        } else {
          world.broadcast(tensor, root);
        }
        check_values(tensor, rank_tensor(core::kFloat64, n, root).to_vector<double>(), "broadcast");
      }

      // all_gather: concatenation of every rank's block, out-of-place and in-place.
      int64_t block = n > 4096 ? n / size : n;
      std::vector<double> gathered;
      for (int r = 0; r < size; ++r) {
        for (int64_t i = 0; i < block; ++i) gathered.push_back(value(r, i));
      }
      core::Tensor output = core::empty({block * size}, dtype);
      world.all_gather(rank_tensor(dtype, block, rank), output);
      check_values(output, gathered, "all_gather");
      core::Tensor inplace = core::zeros({block * size}, dtype);
      if (block > 0) inplace.narrow(0, rank * block, block).copy_(rank_tensor(dtype, block, rank));
      world.all_gather_async(inplace.narrow(0, rank * block, block), inplace)->wait();
      check_values(inplace, gathered, "all_gather in-place async");

      // reduce_scatter: rank r gets block r of the elementwise reduction.
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max}) {
        core::Tensor input = rank_tensor(dtype, block * size, rank);
        core::Tensor mine = core::empty({block}, dtype);
        std::vector<double> expected(static_cast<size_t>(block));
        for (int64_t i = 0; i < block; ++i) {
          expected[size_t(i)] = reduce_expected(op, size, rank * block + i);
        }
        if (op == ReduceOp::Sum) {
          world.reduce_scatter(input, mine, op);
        } else {
          world.reduce_scatter_async(input, mine, op)->wait();
        }
        check_values(mine, expected, "reduce_scatter");
      }
    }
  }
  if (core::is_floating(core::kFloat32)) {
    core::Tensor input = rank_tensor(core::kFloat32, 4 * size, rank);
    core::Tensor mine = core::empty({4}, core::kFloat32);
    world.reduce_scatter(input, mine, ReduceOp::Avg);
    std::vector<double> expected(4);
    for (int64_t i = 0; i < 4; ++i)
      expected[size_t(i)] = reduce_expected(ReduceOp::Avg, size, rank * 4 + i);
    check_values(mine, expected, "reduce_scatter avg");
  }
}

TEST_CASE("all_gather_v: uneven and zero lengths, blocking and async, in-place") {
  auto manager = launch::DistributedManager::initialize();
  launch::Communicator& world = manager.world();
  const int rank = world.rank(), size = world.size();
  for (core::DType dtype : kDTypes) {
    // Rank 1 contributes nothing; the others contribute different odd lengths; then all zero.
    for (bool all_zero : {false, true}) {
      std::vector<int64_t> counts(static_cast<size_t>(size));
      for (int r = 0; r < size; ++r) counts[size_t(r)] = all_zero || r == 1 ? 0 : 2 * r + 3;
      int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t(0));
      std::vector<double> expected;
      int64_t offset = 0;
      for (int r = 0; r < size; ++r) {
        for (int64_t i = 0; i < counts[size_t(r)]; ++i) expected.push_back(value(r, offset + i));
        offset += counts[size_t(r)];
      }
      int64_t my_offset = std::accumulate(counts.begin(), counts.begin() + rank, int64_t(0));
      core::Tensor input = rank_tensor(dtype, counts[size_t(rank)], rank, my_offset);
      core::Tensor output = core::empty({total}, dtype);
      world.all_gather_v(input, output, counts);
      check_values(output, expected, "all_gather_v");

      core::Tensor inplace = core::zeros({total}, dtype);
      core::Tensor mine = inplace.narrow(0, my_offset, counts[size_t(rank)]);
      mine.copy_(input);
      world.all_gather_v_async(mine, inplace, counts)->wait();
      check_values(inplace, expected, "all_gather_v in-place async");
    }
  }
}

TEST_CASE("gather: every dtype and size to the first and last root, blocking, async, in place") {
  auto manager = launch::DistributedManager::initialize();
  launch::Communicator& world = manager.world();
  const int rank = world.rank(), size = world.size();
  for (core::DType dtype : kDTypes) {
    for (int64_t n : kSizes) {
      const int64_t block = n > 4096 ? n / size : n;
      CAPTURE(block);
      std::vector<double> gathered;
      for (int r = 0; r < size; ++r) {
        for (int64_t i = 0; i < block; ++i) gathered.push_back(value(r, i));
      }
      for (int root : {0, size - 1}) {
        CAPTURE(root);
        // Every rank passes an output (99 everywhere); only the root's may change.
        core::Tensor output = core::full({block * size}, 99.0, dtype);
        if (root == 0) {
          world.gather(rank_tensor(dtype, block, rank), output, root);
        } else {
          world.gather_async(rank_tensor(dtype, block, rank), output, root)->wait();
        }
        check_values(output, rank == root ? gathered : std::vector<double>(gathered.size(), 99.0),
                     rank == root ? "gather on the root" : "gather leaves others' output alone");

        // In place on the root; the other ranks pass no output at all.
        core::Tensor inplace = core::zeros({block * size}, dtype);
        core::Tensor mine = inplace.narrow(0, rank * block, block);
        mine.copy_(rank_tensor(dtype, block, rank));
        world.gather(mine, rank == root ? inplace : core::Tensor(), root);
        if (rank == root) check_values(inplace, gathered, "gather in place");
      }
    }
  }
}

TEST_CASE("gather_v: uneven and zero lengths to every root, blocking, async, in place") {
  auto manager = launch::DistributedManager::initialize();
  launch::Communicator& world = manager.world();
  const int rank = world.rank(), size = world.size();
  for (core::DType dtype : kDTypes) {
    // Rank 1 contributes nothing; the others contribute different odd lengths; then all zero.
    for (bool all_zero : {false, true}) {
      std::vector<int64_t> counts(static_cast<size_t>(size));
      for (int r = 0; r < size; ++r) counts[size_t(r)] = all_zero || r == 1 ? 0 : 2 * r + 3;
      const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t(0));
      const int64_t my_offset = std::accumulate(counts.begin(), counts.begin() + rank, int64_t(0));
      std::vector<double> expected;
      for (int r = 0, offset = 0; r < size; offset += int(counts[size_t(r)]), ++r) {
        for (int64_t i = 0; i < counts[size_t(r)]; ++i) expected.push_back(value(r, offset + i));
      }
      core::Tensor input = rank_tensor(dtype, counts[size_t(rank)], rank, my_offset);
      for (int root = 0; root < size; ++root) {
        CAPTURE(root);
        core::Tensor output = core::full({total}, 99.0, dtype);
        if (root % 2 == 0) {
          world.gather_v(input, output, counts, root);
        } else {
          world.gather_v_async(input, output, counts, root)->wait();
        }
        check_values(output, rank == root ? expected : std::vector<double>(size_t(total), 99.0),
                     rank == root ? "gather_v on the root" : "gather_v leaves others' output");

        core::Tensor inplace = core::zeros({total}, dtype);
        core::Tensor mine = inplace.narrow(0, my_offset, counts[size_t(rank)]);
        mine.copy_(input);
        world.gather_v_async(mine, rank == root ? inplace : core::Tensor(), counts, root)->wait();
        if (rank == root) check_values(inplace, expected, "gather_v in place");
      }
    }
  }
}

TEST_CASE("gather and gather_v: argument errors on the calling rank, before any communication") {
  auto manager = launch::DistributedManager::initialize();
  auto& world = static_cast<launch::MpiCommunicator&>(manager.world());
  const int rank = world.rank(), size = world.size();
  const uint64_t started = world.collectives_started();
  core::Tensor four = core::ones({4}, core::kInt32);
  CHECK_THROWS_WITH_AS(world.gather(four, four, size), doctest::Contains("root"), core::Error);
  CHECK_THROWS_WITH_AS(world.gather(four, four, -1), doctest::Contains("not a rank"), core::Error);
  // Only the root's output is checked: the root names its size, the others need none.
  if (rank == 0) {
    CHECK_THROWS_WITH_AS(world.gather(four, core::ones({4 * size + 1}, core::kInt32), 0),
                         doctest::Contains("the root's output has"), core::Error);
    CHECK_THROWS_WITH_AS(world.gather(four, core::Tensor(), 0),
                         doctest::Contains("output is undefined"), core::Error);
    CHECK_THROWS_WITH_AS(world.gather(four, core::ones({4 * size}, core::kInt64), 0),
                         doctest::Contains("input is int32 but output is int64"), core::Error);
  }
  std::vector<int64_t> counts(size_t(size), 4);
  counts[size_t(rank)] = 3;
  core::Tensor all = core::ones({4 * size}, core::kInt32);
  CHECK_THROWS_WITH_AS(world.gather_v(four, all, counts, size - 1),
                       doctest::Contains("passes 4 elements but counts["), core::Error);
  counts.push_back(4);
  CHECK_THROWS_WITH_AS(world.gather_v(four, all, counts, 0), doctest::Contains("one per rank"),
                       core::Error);
  CHECK(world.collectives_started() == started);
  world.barrier();  // still in step on every rank
}

TEST_CASE("barrier, Work lifetime and sequence numbers") {
  auto manager = launch::DistributedManager::initialize();
  launch::Communicator& world = manager.world();
  world.barrier();
  launch::WorkPtr work = world.barrier_async();
  work->wait();
  CHECK(work->test());
  work->wait();  // waiting twice is harmless
  {
    // A Work dropped without wait() still completes before its buffers can go away.
    core::Tensor tensor = core::ones({1000}, core::kFloat32);
    world.all_reduce_async(tensor);
    CHECK(tensor.to_vector<float>()[999] == float(world.size()));
  }
}
