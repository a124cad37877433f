// mpigrad-bench-allreduce: all-reduce bandwidth in the nccl-tests format, with mpigrad's time
// over the raw library's time on the same buffers in the same run.
//
//   mpirun -np 2 mpigrad-bench-allreduce -b 8 -e 64M -f 2 [-n 20] [-w 5] [-c 1] [-d float]
//                                        [-o sum] [--backend mpi|nccl] [--json FILE]
//
// Columns as nccl-tests prints them (size, count, type, redop, root, time, algbw, busbw, #wrong,
// for out-of-place and in-place), plus "ratio": mpigrad / raw MPI_Allreduce (with --backend nccl:
// mpigrad's NcclCommunicator / raw ncclAllReduce on the same communicator, stream and device
// buffers; each round ends by synchronizing the device). algbw = size / time,
// busbw = algbw * 2(n-1)/n. Timing: rounds of n iterations alternate between mpigrad and raw MPI,
// and each keeps its best round, so neither carries the other's scheduling noise (the machine is
// shared and oversubscribed); above 1 MiB the rounds are shorter and more numerous. Below 64 KiB,
// where a call takes about a microsecond and a scheduler tick in one round decides its time,
// the two forms alternate inside each round instead, in timed blocks of 8 calls, so both see
// the same moments. A round's time is the slowest rank's. The check (-c 1) runs each form once
// on fresh integer-valued data and counts elements that differ from the exact result.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/bench_util.h"
#include "mpigrad/core/cuda.h"
#include "mpigrad/core/error.h"
#include "mpigrad/core/tensor.h"
#include "mpigrad/launch/comm/mpi_communicator.h"
#include "mpigrad/launch/comm/mpi_handle.h"
#include "mpigrad/launch/comm/rank_label.h"
#include "mpigrad/launch/ddp/transports/hierarchical_all_reduce.h"
#include "mpigrad/launch/ddp/transports/shared_memory_all_reduce.h"
#include "mpigrad/launch/job/distributed_manager.h"
#include "mpigrad/launch/mpi_interop.h"
#if MPIGRAD_BENCH_NCCL
#include <nccl.h>

#include "mpigrad/launch/comm/nccl_communicator.h"
#endif

using namespace mpigrad;

namespace {

struct Options {
  int64_t min_bytes = 8, max_bytes = 64 << 20;
  double factor = 2;
  int iterations = 20, warmup = 5, rounds = 5;
  bool check = true;
  std::string dtype = "float", op = "sum", backend = "mpi", json;
  int64_t hierarchical_bytes = 0;  // --hierarchical: that comparison instead of the sweep
};

int64_t parse_bytes(const std::string& text) {
  char* end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  MPIGRAD_CHECK(end != text.c_str() && value >= 0, "bad size '", text, "'");
  std::string suffix(end);
  double scale = suffix.empty() || suffix == "B"  ? 1
                 : suffix == "K" || suffix == "k" ? 1024.0
                 : suffix == "M" || suffix == "m" ? 1024.0 * 1024
                 : suffix == "G" || suffix == "g" ? 1024.0 * 1024 * 1024
                                                  : -1;
  MPIGRAD_CHECK(scale > 0, "bad size suffix in '", text, "' (use K, M or G)");
  return int64_t(value * scale);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") {
      std::printf(
          "usage: %s [-b minbytes] [-e maxbytes] [-f factor] [-n iters] [-w warmup] "
          "[-c 0|1] [-d float|double|half|bfloat16|int32|int64|uint8] [-o sum|avg|max|min] "
          "[--rounds R] [--backend mpi|nccl] [--json FILE] [--hierarchical BYTES]\n"
          "  --hierarchical BYTES: instead of the sweep, average BYTES of float32 the way "
          "DDP does across nodes\n  (HierarchicalAllReduce; nodes from "
          "MPIGRAD_SIMULATE_NODES or the real topology) against\n  one flat "
          "MPI_Allreduce of the same buffer on the same ranks\n",
          argv[0]);
      std::exit(0);
    }
    MPIGRAD_CHECK(i + 1 < argc, "flag ", flag, " needs a value");
    std::string value = argv[++i];
    if (flag == "-b")
      o.min_bytes = parse_bytes(value);
    else if (flag == "-e")
      o.max_bytes = parse_bytes(value);
    else if (flag == "-f")
      o.factor = std::stod(value);
    else if (flag == "-n")
      o.iterations = std::stoi(value);
    else if (flag == "-w")
      o.warmup = std::stoi(value);
    else if (flag == "-c")
      o.check = std::stoi(value) != 0;
    else if (flag == "-d")
      o.dtype = value;
    else if (flag == "-o")
      o.op = value;
    else if (flag == "--rounds")
      o.rounds = std::stoi(value);
    else if (flag == "--backend")
      o.backend = value;
    else if (flag == "--json")
      o.json = value;
    else if (flag == "--hierarchical")
      o.hierarchical_bytes = parse_bytes(value);
    else
      core::fail("unknown flag ", flag, " (see --help)");
  }
  MPIGRAD_CHECK(o.factor > 1, "-f must be greater than 1");
  MPIGRAD_CHECK(o.iterations > 0 && o.rounds > 0 && o.warmup >= 0, "-n, --rounds must be positive");
  MPIGRAD_CHECK(o.min_bytes <= o.max_bytes, "-b must not exceed -e");
  return o;
}

core::DType parse_dtype(const std::string& name) {
  if (name == "float") return core::kFloat32;
  if (name == "double") return core::kFloat64;
  if (name == "half") return core::kFloat16;
  if (name == "bfloat16") return core::kBFloat16;
  if (name == "int32") return core::kInt32;
  if (name == "int64") return core::kInt64;
  if (name == "uint8") return core::kUInt8;
  core::fail("unknown -d type '", name, "'");
}

launch::ReduceOp parse_op(const std::string& name) {
  if (name == "sum") return launch::ReduceOp::Sum;
  if (name == "avg") return launch::ReduceOp::Avg;
  if (name == "max") return launch::ReduceOp::Max;
  if (name == "min") return launch::ReduceOp::Min;
  core::fail("unknown -o op '", name, "'");
}

// Integer-valued data every dtype holds exactly, and whose reductions stay exact.
double element(int rank, int64_t i) {
  return double((rank + 1) * (i % 5 + 1));
}

double expected(launch::ReduceOp op, int size, int64_t i) {
  double sum = 0, hi = -1e300, lo = 1e300;
  for (int r = 0; r < size; ++r) {
    sum += element(r, i);
    hi = std::max(hi, element(r, i));
    lo = std::min(lo, element(r, i));
  }
  return op == launch::ReduceOp::Sum   ? sum
         : op == launch::ReduceOp::Avg ? sum / size
         : op == launch::ReduceOp::Max ? hi
                                       : lo;
}

void fill(core::Tensor tensor, int rank) {
  std::vector<double> values(size_t(tensor.numel()));
  for (size_t i = 0; i < values.size(); ++i) values[i] = element(rank, int64_t(i));
  tensor.copy_(core::Tensor::from_vector<double>(values, {tensor.numel()}));
}

int64_t count_wrong(const core::Tensor& tensor, launch::ReduceOp op, int size) {
  std::vector<double> got = tensor.to(core::kCPU).to_vector<double>();
  int64_t wrong = 0;
  for (size_t i = 0; i < got.size(); ++i) wrong += got[i] != expected(op, size, int64_t(i));
  return wrong;
}

struct Timing {
  double mpigrad_s = 1e30, raw_s = 1e30;
};

// Best round of `iterations` calls for each of the two forms, alternating rounds.
// `settle` runs at the end of each round inside the timed region: it waits for the device when
// the collectives are queued on CUDA streams, and does nothing for MPI.
template <typename Mpigrad, typename Raw, typename Settle>
Timing time_pair(MPI_Comm comm, const Options& o, int64_t bytes, Mpigrad&& mpigrad_call,
                 Raw&& raw_call, Settle&& settle) {
  // Above 1 MiB, shorter rounds and more of them: the best of many short alternating rounds is
  // what survives other jobs on a shared machine, at the same total number of calls.
  int per_round = o.iterations, rounds = o.rounds;
  if (bytes > (int64_t(1) << 20)) {
    per_round = std::max<int>(2, int(int64_t(o.iterations) * (int64_t(1) << 20) / bytes));
    rounds = std::min(20, std::max(o.rounds, o.rounds * o.iterations / per_round));
  }
  for (int i = 0; i < o.warmup; ++i) {
    mpigrad_call();
    raw_call();
  }
  settle();
  Timing timing;
  if (bytes < 64 * 1024) {
    constexpr int kBlock = 8;
    const int blocks = std::max(1, per_round / kBlock);
    for (int round = 0; round < rounds; ++round) {
      MPI_Barrier(comm);
      double local[2] = {0, 0}, slowest[2] = {0, 0};
      for (int block = 0; block < blocks; ++block) {
        for (int form = 0; form < 2; ++form) {
          double start = MPI_Wtime();
          for (int i = 0; i < kBlock; ++i) form == 0 ? mpigrad_call() : raw_call();
          settle();
          local[form] += MPI_Wtime() - start;
        }
      }
      for (double& seconds : local) seconds /= blocks * kBlock;
      launch::check_mpi(MPI_Allreduce(local, slowest, 2, MPI_DOUBLE, MPI_MAX, comm),
                        "MPI_Allreduce", "timing");
      timing.mpigrad_s = std::min(timing.mpigrad_s, slowest[0]);
      timing.raw_s = std::min(timing.raw_s, slowest[1]);
    }
    return timing;
  }
  for (int round = 0; round < rounds; ++round) {
    for (int form = 0; form < 2; ++form) {
      MPI_Barrier(comm);
      double start = MPI_Wtime();
      for (int i = 0; i < per_round; ++i) form == 0 ? mpigrad_call() : raw_call();
      settle();
      double local = (MPI_Wtime() - start) / per_round, slowest = 0;
      launch::check_mpi(MPI_Allreduce(&local, &slowest, 1, MPI_DOUBLE, MPI_MAX, comm),
                        "MPI_Allreduce", "timing");
      double& best = form == 0 ? timing.mpigrad_s : timing.raw_s;
      best = std::min(best, slowest);
    }
  }
  return timing;
}

// --hierarchical: DDP's averaging across nodes (launch/ddp/transports/hierarchical_all_reduce.h)
// against one flat MPI_Allreduce (sum, in place) of the same float32 buffer on the same ranks, in
// alternating rounds; with a flat SharedMemoryAllReduce beside them when the ranks can share
// memory. Target on np 4 as 2 simulated nodes x 2 ranks: ratio <= 0.5.
int run_hierarchical(launch::DistributedManager& manager, const Options& o) {
  launch::Communicator& world = manager.world();
  MPI_Comm raw = launch::native_communicator(world);
  const int64_t count = std::max<int64_t>(1, o.hierarchical_bytes / 4);
  const int64_t bytes = count * 4;
  const launch::SharedBufferSpec spec{core::kFloat32, count};
  std::string why_not;
  auto hierarchical = launch::HierarchicalAllReduce::create(
      world, world.split_node_local("bench node"), {&spec, 1}, 120, &why_not);
  MPIGRAD_CHECK(hierarchical != nullptr,
                "the hierarchical averaging is not possible here: ", why_not);
  core::Tensor flat = core::zeros({count});
  const core::Tensor& buffer = hierarchical->buffer(0);
  auto average = [&] {
    hierarchical->start(0);
    hierarchical->wait(0);
  };
  auto mpi_allreduce = [&] {
    launch::check_mpi(
        MPI_Allreduce(MPI_IN_PLACE, flat.data_ptr(), int(count), MPI_FLOAT, MPI_SUM, raw),
        "MPI_Allreduce", "the flat baseline");
  };
  Timing timing = time_pair(raw, o, bytes, average, mpi_allreduce, [] {});
  // The flat shared-memory averaging over every rank, when they share memory (one real node).
  double shared_s = 0;
  if (auto shared = launch::SharedMemoryAllReduce::create(world, {&spec, 1}, 120)) {
    Timing pair = time_pair(
        raw, o, bytes,
        [&] {
          shared->start(0);
          shared->wait(0);
        },
        mpi_allreduce, [] {});
    shared_s = pair.mpigrad_s;
  }
  // Correctness: integer data, whose average over the ranks is exact.
  fill(buffer.narrow(0, 0, count), world.rank());
  average();
  const int64_t wrong_local =
      count_wrong(buffer.narrow(0, 0, count), launch::ReduceOp::Avg, world.size());
  int64_t wrong = 0;
  launch::check_mpi(MPI_Allreduce(&wrong_local, &wrong, 1, MPI_INT64_T, MPI_SUM, raw),
                    "MPI_Allreduce", "check");

  const double ratio = timing.mpigrad_s / timing.raw_s;
  if (world.rank() == 0) {
    std::printf("# mpigrad-bench-allreduce --hierarchical: %s\n", manager.describe().c_str());
    std::printf("# %lld bytes of float32 on %d nodes x %d ranks, best of rounds (slowest rank)\n",
                static_cast<long long>(bytes), hierarchical->nodes(),
                hierarchical->ranks_per_node());
    std::printf("%-44s %10.3f ms\n", "hierarchical averaging (start + wait)",
                timing.mpigrad_s * 1e3);
    std::printf("%-44s %10.3f ms\n", "flat MPI_Allreduce (sum, in place)", timing.raw_s * 1e3);
    if (shared_s > 0) {
      std::printf("%-44s %10.3f ms\n", "flat SharedMemoryAllReduce (all ranks)", shared_s * 1e3);
    }
    std::printf("%-44s %10.3f    (target <= 0.5)\n", "ratio hierarchical / flat MPI_Allreduce",
                ratio);
    std::printf("%-44s %10lld\n", "#wrong", static_cast<long long>(wrong));
    bench::Results results;
    results.add_text("benchmark", "allreduce --hierarchical");
    results.add("bytes", double(bytes), "B");
    results.add("nodes", hierarchical->nodes(), "nodes");
    results.add("ranks_per_node", hierarchical->ranks_per_node(), "ranks");
    results.add("hierarchical_ms", timing.mpigrad_s * 1e3, "ms");
    results.add("flat_mpi_allreduce_ms", timing.raw_s * 1e3, "ms");
    results.add("flat_shared_memory_ms", shared_s * 1e3, "ms", "0: the ranks cannot share");
    results.add("ratio_hierarchical_vs_flat_mpi", ratio, "x", "target <= 0.5");
    results.add("wrong", double(wrong), "elements");
    if (!o.json.empty() && !results.write_json(o.json)) {
      std::fprintf(stderr, "mpigrad-bench-allreduce: cannot write %s\n", o.json.c_str());
      return 1;
    }
  }
  return wrong == 0 ? 0 : 1;
}

int run(launch::DistributedManager& manager, int argc, char** argv) {
  Options o = parse(argc, argv);
  if (o.hierarchical_bytes > 0) return run_hierarchical(manager, o);
  const launch::Backend backend = launch::parse_backend(o.backend);
  const core::DType dtype = parse_dtype(o.dtype);
  const launch::ReduceOp op = parse_op(o.op);
  // NCCL: the manager's GPU (local_rank % device_count); without a visible GPU,
  // create_communicator throws "no CUDA device is visible" and the program exits non-zero.
  auto comm = launch::create_communicator(manager, backend, core::kCPU, "allreduce-bench");
  const bool use_nccl = comm->backend() == launch::Backend::Nccl;
  // Timing barriers and result checks go over the world's MPI communicator; the raw MPI
  // baseline uses the benchmarked communicator's own.
  MPI_Comm raw = launch::native_communicator(manager.world());
  MPI_Comm raw_mpi = use_nccl ? MPI_COMM_NULL : launch::native_communicator(*comm);
  auto& runtime = *static_cast<launch::MpiCommunicator&>(manager.world()).runtime();
  MPI_Datatype raw_type = launch::mpi_datatype(dtype);
  MPI_Op raw_op = use_nccl ? MPI_OP_NULL : runtime.reduction_ops().find(dtype, op);
  core::Device device = core::kCPU;
#if MPIGRAD_BENCH_NCCL
  ncclComm_t nccl_comm = nullptr;
  cudaStream_t nccl_stream = nullptr;
  ncclDataType_t nccl_type = ncclFloat32;
  ncclRedOp_t nccl_op = ncclSum;
  if (use_nccl) {
    auto& nccl = dynamic_cast<launch::NcclCommunicator&>(*comm);
    device = nccl.device();
    nccl_comm = static_cast<ncclComm_t>(nccl.native_handle());
    nccl_stream = static_cast<cudaStream_t>(nccl.stream().handle());
    const core::DType types[] = {core::kFloat32, core::kFloat64, core::kBFloat16, core::kFloat16,
                                 core::kInt32,   core::kInt64,   core::kUInt8};
    const ncclDataType_t nccl_types[] = {ncclFloat32, ncclFloat64, ncclBfloat16, ncclFloat16,
                                         ncclInt32,   ncclInt64,   ncclUint8};
    for (size_t i = 0; i < 7; ++i) {
      if (types[i] == dtype) nccl_type = nccl_types[i];
    }
    nccl_op = op == launch::ReduceOp::Sum   ? ncclSum
              : op == launch::ReduceOp::Avg ? ncclAvg
              : op == launch::ReduceOp::Max ? ncclMax
                                            : ncclMin;
  }
#endif
  // The raw library call on the same buffers (in place: send == recv).
  auto raw_allreduce = [&](const core::Tensor& send, const core::Tensor& recv, int64_t count) {
#if MPIGRAD_BENCH_NCCL
    if (use_nccl) {
      ncclResult_t result = ncclAllReduce(send.data_ptr(), recv.data_ptr(), size_t(count),
                                          nccl_type, nccl_op, nccl_comm, nccl_stream);
      // The communicator is non-blocking (nccl_communicator.h): the call may answer
      // ncclInProgress, and none may follow on it until ncclCommGetAsyncError says it finished.
      while (result == ncclInProgress) {
        ncclResult_t state = ncclSuccess;
        const ncclResult_t query = ncclCommGetAsyncError(nccl_comm, &state);
        result = query != ncclSuccess ? query : state;
      }
      MPIGRAD_CHECK(result == ncclSuccess,
                    "raw ncclAllReduce failed: ", ncclGetErrorString(result));
      return;
    }
#endif
    const void* in = send.data_ptr() == recv.data_ptr() ? MPI_IN_PLACE : send.data_ptr();
    MPI_Allreduce(in, recv.data_ptr(), int(count), raw_type, raw_op, raw_mpi);
  };
  auto settle = [&] {
    if (use_nccl) core::cuda_synchronize(device);
  };
  const char* raw_name = use_nccl ? "ncclAllReduce" : "MPI_Allreduce";
  const int size = comm->size();
  const bool main = comm->rank() == 0;
  const double bus_factor = size > 1 ? 2.0 * (size - 1) / size : 0.0;

  bench::Results results;
  results.add_text("benchmark", "allreduce");
  results.add_text("backend", std::string(launch::backend_name(comm->backend())));
  results.add_text("dtype", o.dtype);
  results.add_text("redop", o.op);
  results.add("nranks", size, "ranks");
  if (main) {
    std::printf("# mpigrad-bench-allreduce: %d ranks, backend %s, %s\n", size,
                std::string(launch::backend_name(comm->backend())).c_str(),
                manager.describe().c_str());
    std::printf(
        "# best of %d rounds x %d iterations (warmup %d); ratio = mpigrad time / raw %s time\n",
        o.rounds, o.iterations, o.warmup, raw_name);
    std::printf("#%80s%56s\n", "out-of-place", "in-place");
    std::printf("#%11s %12s %8s %6s %6s %9s %7s %7s %6s %6s %9s %7s %7s %6s %6s\n", "size", "count",
                "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "ratio", "time",
                "algbw", "busbw", "#wrong", "ratio");
    std::printf("#%11s %12s %8s %6s %6s %9s %7s %7s %6s %6s %9s %7s %7s %6s %6s\n", "(B)",
                "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "", "(us)", "(GB/s)",
                "(GB/s)", "", "");
  }

  const int64_t element_bytes = core::element_size(dtype);
  double busbw_total = 0, worst_small = 0, worst_large = 0;
  int rows = 0;
  int64_t total_wrong = 0;
  for (double bytes_d = double(o.min_bytes); bytes_d <= double(o.max_bytes) * 1.0000001;
       bytes_d *= o.factor) {
    const int64_t count = std::max<int64_t>(1, int64_t(bytes_d) / element_bytes);
    const int64_t bytes = count * element_bytes;
    MPIGRAD_CHECK(use_nccl || count <= INT32_MAX, "-e ", o.max_bytes,
                  " is too large for one MPI call");
    const core::TensorOptions options = core::TensorOptions(dtype).device(device);
    core::Tensor send = core::empty({count}, options);
    core::Tensor recv = core::empty({count}, options);
    core::Tensor inplace = core::zeros({count}, options);  // zeros: repeated sums stay finite
    fill(send, comm->rank());
    Timing oop = time_pair(
        raw, o, bytes, [&] { comm->all_reduce(send, recv, op); },
        [&] { raw_allreduce(send, recv, count); }, settle);
    Timing inp = time_pair(
        raw, o, bytes, [&] { comm->all_reduce(inplace, op); },
        [&] { raw_allreduce(inplace, inplace, count); }, settle);

    int64_t wrong[2] = {0, 0};
    if (o.check) {
      fill(send, comm->rank());
      comm->all_reduce(send, recv, op);
      wrong[0] = count_wrong(recv, op, size);
      fill(inplace, comm->rank());
      comm->all_reduce(inplace, op);
      wrong[1] = count_wrong(inplace, op, size);
      int64_t local = wrong[0] + wrong[1], all = 0;
      launch::check_mpi(MPI_Allreduce(&local, &all, 1, MPI_INT64_T, MPI_SUM, raw), "MPI_Allreduce",
                        "check");
      total_wrong += all;
      int64_t both[2] = {0, 0};
      launch::check_mpi(MPI_Allreduce(wrong, both, 2, MPI_INT64_T, MPI_SUM, raw), "MPI_Allreduce",
                        "check");
      wrong[0] = both[0];
      wrong[1] = both[1];
    }
    double algbw[2] = {double(bytes) / oop.mpigrad_s * 1e-9, double(bytes) / inp.mpigrad_s * 1e-9};
    double ratio[2] = {oop.mpigrad_s / oop.raw_s, inp.mpigrad_s / inp.raw_s};
    busbw_total += algbw[1] * bus_factor;
    ++rows;
    double& worst = bytes >= 64 * 1024 ? worst_large : worst_small;
    worst = std::max({worst, ratio[0], ratio[1]});
    if (main) {
      std::printf(
          " %11lld %12lld %8s %6s %6d %9.2f %7.3f %7.3f %6lld %6.3f %9.2f %7.3f %7.3f %6lld "
          "%6.3f\n",
          static_cast<long long>(bytes), static_cast<long long>(count), o.dtype.c_str(),
          o.op.c_str(), -1, oop.mpigrad_s * 1e6, algbw[0], algbw[0] * bus_factor,
          static_cast<long long>(wrong[0]), ratio[0], inp.mpigrad_s * 1e6, algbw[1],
          algbw[1] * bus_factor, static_cast<long long>(wrong[1]), ratio[1]);
      std::fflush(stdout);
    }
    std::string key = "size_" + std::to_string(bytes);
    results.add(key + "_oop_time_us", oop.mpigrad_s * 1e6, "us");
    results.add(key + "_oop_raw_time_us", oop.raw_s * 1e6, "us");
    results.add(key + "_oop_algbw", algbw[0], "GB/s");
    results.add(key + "_oop_busbw", algbw[0] * bus_factor, "GB/s");
    results.add(key + "_oop_wrong", double(wrong[0]), "elements");
    results.add(key + "_oop_ratio", ratio[0], "x");
    results.add(key + "_ip_time_us", inp.mpigrad_s * 1e6, "us");
    results.add(key + "_ip_raw_time_us", inp.raw_s * 1e6, "us");
    results.add(key + "_ip_algbw", algbw[1], "GB/s");
    results.add(key + "_ip_busbw", algbw[1] * bus_factor, "GB/s");
    results.add(key + "_ip_wrong", double(wrong[1]), "elements");
    results.add(key + "_ip_ratio", ratio[1], "x");
  }
  double avg_busbw = rows ? busbw_total / rows : 0;
  results.add("avg_bus_bandwidth", avg_busbw, "GB/s");
  results.add("max_ratio_below_64KiB", worst_small, "x", "target <= 1.10");
  results.add("max_ratio_from_64KiB", worst_large, "x", "target <= 1.05");
  results.add("out_of_bounds", double(total_wrong), "elements");
  if (main) {
    std::printf("# Out of bounds values : %lld %s\n", static_cast<long long>(total_wrong),
                total_wrong == 0 ? "OK" : "FAILED");
    std::printf("# Avg bus bandwidth    : %g \n", avg_busbw);
    std::printf(
        "# Max ratio mpigrad/raw: %.3f below 64 KiB (target <= 1.10), %.3f from 64 KiB (target <= "
        "1.05)\n",
        worst_small, worst_large);
    if (!o.json.empty() && !results.write_json(o.json)) {
      std::fprintf(stderr, "mpigrad-bench-allreduce: cannot write %s\n", o.json.c_str());
      return 1;
    }
  }
  return total_wrong == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  // The manager lives outside the try: a bad flag is reported, then MPI is finalized normally
  // (every rank sees the same flags, so every rank takes the same path).
  auto manager = launch::DistributedManager::initialize(&argc, &argv);
  try {
    return run(manager, argc, argv);
  } catch (const std::exception& error) {
    launch::print_rank_error(manager.rank(), manager.world_size(), "mpigrad-bench-allreduce",
                             error.what());
    return 1;
  }
}
