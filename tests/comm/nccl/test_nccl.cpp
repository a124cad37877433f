// NcclCommunicator through the generic Communicator interface: every collective x dtype x size
// (0, 1, odd, about 1M) against exact expected values, all_gather_v with uneven and zero
// lengths, async work and stream ordering (a user stream, overlap with compute, buffers dropped
// before wait), barrier, subgroups, the node-local group, and argument errors. Runs only where
// every rank has its own GPU (see nccl_test_main.cpp).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "mpigrad/core/cuda.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/stream.h"
#include "mpigrad/core/tensor.h"
#include "mpigrad/launch/job/distributed_manager.h"
#include "nccl_test.h"

using namespace mpigrad;
using core::Tensor;
using launch::ReduceOp;

namespace {

constexpr core::DType kDtypes[] = {core::kFloat32, core::kFloat64, core::kBFloat16, core::kFloat16,
                                   core::kInt32,   core::kInt64,   core::kUInt8};
constexpr ReduceOp kOps[] = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min};

// Integer values small enough that every dtype (uint8 and bfloat16 included) holds them and
// their sums exactly, for the few ranks a test job has.
double element(int rank, int64_t i) {
  return double((rank + 1) * (i % 5 + 1));
}

core::Device gpu_of(const launch::DistributedManager& manager) {
  return core::cuda(manager.local_rank() % core::cuda_device_count());
}

Tensor filled(int rank, int64_t n, core::DType dtype, core::Device device, int64_t offset = 0) {
  std::vector<double> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) values[size_t(i)] = element(rank, offset + i);
  return Tensor::from_vector(values, {n}, dtype).to(device);
}

std::vector<double> host(const Tensor& tensor) {
  return tensor.to(core::kCPU).to_vector<double>();
}

double reduced(ReduceOp op, int size, int64_t i) {
  double sum = 0, hi = element(0, i), lo = element(0, i);
  for (int r = 0; r < size; ++r) {
    sum += element(r, i);
    hi = std::max(hi, element(r, i));
    lo = std::min(lo, element(r, i));
  }
  switch (op) {
    case ReduceOp::Sum:
      return sum;
    case ReduceOp::Avg:
      return sum / size;
    case ReduceOp::Max:
      return hi;
    case ReduceOp::Min:
      return lo;
  }
  return 0;
}

// Index of the first wrong element, or -1. Avg of 16-bit floats is compared with a tolerance.
int64_t first_wrong(const std::vector<double>& got, ReduceOp op, int size, core::DType dtype,
                    int64_t offset = 0) {
  const bool loose = op == ReduceOp::Avg && (dtype == core::kBFloat16 || dtype == core::kFloat16);
  for (size_t i = 0; i < got.size(); ++i) {
    const double want = reduced(op, size, offset + int64_t(i));
    const double tolerance = loose ? 0.01 * want : (op == ReduceOp::Avg ? 1e-6 * want : 0.0);
    if (!(std::abs(got[i] - want) <= tolerance)) return int64_t(i);
  }
  return -1;
}

std::unique_ptr<launch::Communicator> nccl(launch::DistributedManager& manager,
                                           std::string name = "nccl-test") {
  return launch::create_communicator(manager, launch::Backend::Nccl, gpu_of(manager),
                                     std::move(name));
}

}  // namespace

MPIGRAD_NCCL_TEST_CASE("the nccl backend: create_communicator, Auto for CUDA tensors, ranks") {
  auto manager = launch::DistributedManager::initialize();
  CHECK(manager.device().is_cuda());
  auto comm = nccl(manager);
  CHECK(comm->backend() == launch::Backend::Nccl);
  CHECK(comm->rank() == manager.rank());
  CHECK(comm->size() == manager.world_size());
  CHECK(comm->name() == "nccl-test");
  auto automatic = launch::create_communicator(manager, launch::Backend::Auto, gpu_of(manager));
  CHECK(automatic->backend() == launch::Backend::Nccl);
  auto host_side = launch::create_communicator(manager, launch::Backend::Auto, core::kCPU);
  CHECK(host_side->backend() == launch::Backend::Mpi);
}

MPIGRAD_NCCL_TEST_CASE("all_reduce: every op x dtype x size, in place and out of place") {
  auto manager = launch::DistributedManager::initialize();
  auto comm = nccl(manager);
  const core::Device gpu = gpu_of(manager);
  const int rank = comm->rank(), size = comm->size();
  for (core::DType dtype : kDtypes) {
    for (ReduceOp op : kOps) {
      if (op == ReduceOp::Avg && !core::is_floating(dtype)) continue;
      for (int64_t n : {int64_t(0), int64_t(1), int64_t(7), int64_t(1) << 20}) {
        if (n == (int64_t(1) << 20) && dtype != core::kFloat32 && dtype != core::kBFloat16)
          continue;
        CAPTURE(core::dtype_name(dtype));
        CAPTURE(launch::reduce_op_name(op));
        CAPTURE(n);
        Tensor input = filled(rank, n, dtype, gpu);
        Tensor output = core::zeros({n}, core::TensorOptions(dtype).device(gpu));
        comm->all_reduce(input, output, op);
        CHECK(first_wrong(host(output), op, size, dtype) == -1);
        CHECK(host(input) == host(filled(rank, n, dtype, core::kCPU)));  // input untouched
        Tensor inplace = filled(rank, n, dtype, gpu);
        comm->all_reduce(inplace, op);
        CHECK(first_wrong(host(inplace), op, size, dtype) == -1);
        Tensor async = filled(rank, n, dtype, gpu);
        launch::WorkPtr work = comm->all_reduce_async(async, op);
        work->wait();
        CHECK(first_wrong(host(async), op, size, dtype) == -1);
        CHECK(work->test());  // the host copy above synchronized the stream that waited on it
      }
    }
  }
}

MPIGRAD_NCCL_TEST_CASE("broadcast, all_gather and reduce_scatter over dtypes and sizes") {
  auto manager = launch::DistributedManager::initialize();
  auto comm = nccl(manager);
  const core::Device gpu = gpu_of(manager);
  const int rank = comm->rank(), size = comm->size();
  for (core::DType dtype : kDtypes) {
    for (int64_t n : {int64_t(0), int64_t(1), int64_t(7), int64_t(1) << 18}) {
      CAPTURE(core::dtype_name(dtype));
      CAPTURE(n);
      for (int root = 0; root < size; ++root) {
        Tensor tensor = filled(rank, n, dtype, gpu);
        comm->broadcast(tensor, root);
        std::vector<double> got = host(tensor);
        bool ok = true;
        for (int64_t i = 0; i < n; ++i) ok = ok && got[size_t(i)] == element(root, i);
        CHECK(ok);
      }
      Tensor input = filled(rank, n, dtype, gpu);
      Tensor gathered = core::zeros({n * size}, core::TensorOptions(dtype).device(gpu));
      comm->all_gather_async(input, gathered)->wait();
      std::vector<double> all = host(gathered);
      bool ok = true;
      for (int r = 0; r < size; ++r) {
        for (int64_t i = 0; i < n; ++i) ok = ok && all[size_t(r * n + i)] == element(r, i);
      }
      CHECK(ok);

      Tensor big = filled(rank, n * size, dtype, gpu);
      Tensor block = core::zeros({n}, core::TensorOptions(dtype).device(gpu));
      comm->reduce_scatter(big, block, ReduceOp::Sum);
      CHECK(first_wrong(host(block), ReduceOp::Sum, size, dtype, int64_t(rank) * n) == -1);
      if (core::is_floating(dtype)) {
        comm->reduce_scatter_async(big, block, ReduceOp::Max)->wait();
        CHECK(first_wrong(host(block), ReduceOp::Max, size, dtype, int64_t(rank) * n) == -1);
      }
    }
  }
}

MPIGRAD_NCCL_TEST_CASE("all_gather_v with uneven and zero lengths") {
  auto manager = launch::DistributedManager::initialize();
  auto comm = nccl(manager);
  const core::Device gpu = gpu_of(manager);
  const int rank = comm->rank(), size = comm->size();
  // Even ranks contribute nothing, odd ranks r + 2 elements; then everyone 0; then 3 each.
  std::vector<std::vector<int64_t>> patterns(3, std::vector<int64_t>(size_t(size)));
  for (int r = 0; r < size; ++r) {
    patterns[0][size_t(r)] = r % 2 == 0 ? 0 : r + 2;
    patterns[1][size_t(r)] = 0;
    patterns[2][size_t(r)] = 3;
  }
  if (size == 1) patterns[0][0] = 5;
  for (core::DType dtype : {core::kFloat32, core::kInt64, core::kBFloat16, core::kUInt8}) {
    for (const std::vector<int64_t>& counts : patterns) {
      int64_t total = 0;
      for (int64_t c : counts) total += c;
      Tensor input = filled(rank, counts[size_t(rank)], dtype, gpu);
      Tensor output =
          core::zeros({total}, core::TensorOptions(dtype).device(gpu));  // never an element
      comm->all_gather_v(input, output, counts);
      std::vector<double> got = host(output);
      bool ok = true;
      int64_t at = 0;
      for (int r = 0; r < size; ++r) {
        for (int64_t i = 0; i < counts[size_t(r)]; ++i)
          ok = ok && got[size_t(at++)] == element(r, i);
      }
      CHECK(ok);
      Tensor again = core::zeros({total}, core::TensorOptions(dtype).device(gpu));
      comm->all_gather_v_async(input, again, counts)->wait();
      CHECK(host(again) == got);
    }
  }
}

MPIGRAD_NCCL_TEST_CASE("gather and gather_v to every root, uneven and zero lengths, in place") {
  auto manager = launch::DistributedManager::initialize();
  auto comm = nccl(manager);
  const core::Device gpu = gpu_of(manager);
  const int rank = comm->rank(), size = comm->size();
  for (core::DType dtype : {core::kFloat32, core::kInt64, core::kBFloat16, core::kUInt8}) {
    for (int root = 0; root < size; ++root) {
      CAPTURE(core::dtype_name(dtype));
      CAPTURE(root);
      // gather: 7 elements from every rank; only the root's output is written.
      Tensor input = filled(rank, 7, dtype, gpu);
      Tensor output = core::zeros({7 * size}, core::TensorOptions(dtype).device(gpu));
      comm->gather(input, output, root);
      std::vector<double> got = host(output);
      bool ok = true;
      for (int r = 0; r < size; ++r) {
        for (int64_t i = 0; i < 7; ++i) {
          const double want = rank == root ? element(r, i) : 0.0;
          ok = ok && got[size_t(r * 7 + i)] == want;
        }
      }
      CHECK(ok);
      // In place on the root: its block already holds its input.
      Tensor inplace = core::zeros({7 * size}, core::TensorOptions(dtype).device(gpu));
      Tensor mine = inplace.narrow(0, rank * 7, 7);
      mine.copy_(input);
      comm->gather_async(mine, rank == root ? inplace : Tensor(), root)->wait();
      if (rank == root) CHECK(host(inplace) == got);

      // gather_v: odd ranks r + 2 elements, even ranks none (one rank alone sends 5).
      std::vector<int64_t> counts(static_cast<size_t>(size));
      int64_t total = 0;
      for (int r = 0; r < size; ++r) {
        counts[size_t(r)] = size == 1 ? 5 : r % 2 == 1 ? r + 2 : 0;
        total += counts[size_t(r)];
      }
      Tensor part = filled(rank, counts[size_t(rank)], dtype, gpu);
      Tensor joined = core::zeros({total}, core::TensorOptions(dtype).device(gpu));
      comm->gather_v(part, joined, counts, root);
      if (rank == root) {
        std::vector<double> all = host(joined);
        int64_t at = 0;
        for (int r = 0; r < size; ++r) {
          for (int64_t i = 0; i < counts[size_t(r)]; ++i)
            ok = ok && all[size_t(at++)] == element(r, i);
        }
        CHECK(ok);
      }
    }
  }
}

MPIGRAD_NCCL_TEST_CASE(
    "stream ordering: a user stream, overlap with compute, buffers dropped early") {
  auto manager = launch::DistributedManager::initialize();
  auto comm = nccl(manager);
  const core::Device gpu = gpu_of(manager);
  const int rank = comm->rank(), size = comm->size();
  core::Stream compute(gpu);
  core::StreamGuard guard(compute);
  const int64_t n = int64_t(1) << 22;
  // Written by a kernel on the user's stream just before the collective: the NCCL stream must
  // wait for it (an event), or the reduction would read stale zeros.
  Tensor grads = core::zeros({n}, core::TensorOptions(core::kFloat32).device(gpu));
  grads.fill_(double(rank + 1));
  launch::WorkPtr work = comm->all_reduce_async(grads);
  // Compute while the all-reduce runs; nothing here touches grads.
  Tensor a = core::ones({n}, core::TensorOptions(core::kFloat32).device(gpu));
  for (int i = 0; i < 20; ++i) a = a * 1.0001 + 0.5;
  work->wait();  // stream-ordered: later kernels on `compute` see the sum
  Tensor doubled = grads * 2.0;
  const double expected = double(size) * double(size + 1) / 2.0;
  std::vector<double> got = host(doubled);
  CHECK(got.front() == 2 * expected);
  CHECK(got.back() == 2 * expected);
  for (int i = 0; i < 1000 && !work->test(); ++i) compute.synchronize();
  CHECK(work->test());

  // The caller drops its only reference before wait(): the Work and record_stream keep the
  // memory away from other tensors until NCCL is done with it.
  Tensor out = core::zeros({n}, core::TensorOptions(core::kFloat32).device(gpu));
  launch::WorkPtr dropped;
  {
    Tensor input = filled(rank, n, core::kFloat32, gpu);
    dropped = comm->all_reduce_async(input, out, ReduceOp::Sum);
  }
  Tensor scratch = core::full({n}, 99.0, core::TensorOptions(core::kFloat32).device(gpu));
  dropped->wait();
  CHECK(first_wrong(host(out), ReduceOp::Sum, size, core::kFloat32) == -1);
  CHECK(host(scratch).front() == 99.0);
}

MPIGRAD_NCCL_TEST_CASE("barrier, and destroying an unwaited Work still orders its result") {
  auto manager = launch::DistributedManager::initialize();
  auto comm = nccl(manager);
  const core::Device gpu = gpu_of(manager);
  comm->barrier();
  comm->barrier_async()->wait();
  comm->barrier();
  Tensor x = core::ones({1000}, core::TensorOptions(core::kFloat64).device(gpu));
  comm->all_reduce_async(x);  // dropped at once: its destructor makes the current stream wait
  CHECK(host(x)[999] == double(comm->size()));
}

MPIGRAD_NCCL_TEST_CASE("subgroups by color, single-rank groups, and the node-local group") {
  auto manager = launch::DistributedManager::initialize();
  auto comm = nccl(manager);
  const core::Device gpu = gpu_of(manager);
  const int rank = comm->rank(), size = comm->size();
  auto half = comm->split(rank % 2, rank, "parity");
  REQUIRE(half != nullptr);
  CHECK(half->backend() == launch::Backend::Nccl);
  CHECK(half->size() == (size - rank % 2 + 1) / 2);
  CHECK(half->rank() == rank / 2);
  Tensor x = core::full({5}, double(rank), core::TensorOptions(core::kInt32).device(gpu));
  half->all_reduce(x);
  int expected = 0;
  for (int r = rank % 2; r < size; r += 2) expected += r;
  CHECK(host(x)[4] == double(expected));

  auto alone = comm->split(rank, 0, "self");
  REQUIRE(alone != nullptr);
  CHECK(alone->size() == 1);
  auto none = comm->split(rank == 0 ? -1 : 0, 0, "not rank 0");
  CHECK((none == nullptr) == (rank == 0));

  auto node = comm->split_node_local("node");
  CHECK(node->size() == manager.local_size());
  CHECK(node->rank() == manager.local_rank());
  Tensor y = core::ones({3}, core::TensorOptions(core::kFloat32).device(gpu));
  node->all_reduce(y, ReduceOp::Avg);
  CHECK(host(y)[0] == 1.0);
}

MPIGRAD_NCCL_TEST_CASE("argument errors are clear and raised before any communication") {
  auto manager = launch::DistributedManager::initialize();
  auto comm = nccl(manager);
  const core::Device gpu = gpu_of(manager);
  Tensor on_host = core::ones({4});
  CHECK_THROWS_WITH_AS(comm->all_reduce(on_host), doctest::Contains("use the mpi backend"),
                       core::Error);
  Tensor ints = core::ones({4}, core::TensorOptions(core::kInt32).device(gpu));
  CHECK_THROWS_WITH_AS(comm->all_reduce(ints, ReduceOp::Avg), doctest::Contains("floating dtype"),
                       core::Error);
  Tensor flags = core::ones({4}, core::TensorOptions(core::kBool).device(gpu));
  CHECK_THROWS_WITH_AS(comm->all_reduce(flags), doctest::Contains("does not move bool"),
                       core::Error);
  Tensor five = core::ones({5}, core::TensorOptions(core::kInt32).device(gpu));
  CHECK_THROWS_WITH_AS(comm->all_reduce(ints, five), doctest::Contains("output has 5"),
                       core::Error);
  CHECK_THROWS_WITH_AS(comm->broadcast(ints, comm->size()), doctest::Contains("not a rank"),
                       core::Error);
  std::vector<int64_t> counts(size_t(comm->size()), 1);
  counts[0] = -1;
  CHECK_THROWS_WITH_AS(comm->all_gather_v(ints, ints, counts), doctest::Contains("negative"),
                       core::Error);
  // Errors name the rank and the communicator.
  CHECK_THROWS_WITH_AS(comm->all_reduce(on_host), doctest::Contains("[rank "), core::Error);
  CHECK_THROWS_WITH_AS(comm->all_reduce(on_host), doctest::Contains("'nccl-test'"), core::Error);
  // The communicator still works afterwards.
  comm->all_reduce(ints);
  CHECK(host(ints)[0] == double(comm->size()));
}
