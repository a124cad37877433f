// benchmarks/core: what the CPU core costs next to the raw thing it wraps, in the same run.
//
//   op_overhead_ns          forward + backward of one tiny elementwise op (mul of two [4]
//                           tensors that require grad), all framework overhead included
//   sgemm_ratio_vs_cblas    mpigrad matmul throughput / direct cblas_sgemm, 1024^3, same threads
//   add_bw_ratio_vs_memcpy  64 MiB float add bandwidth / memcpy bandwidth, both single-threaded
//
// Usage: mpigrad-bench-core [--json FILE] [--quick]
#include <cblas.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "../common/bench_util.h"
#include "mpigrad/mpigrad.h"

using namespace mpigrad::core;
using mpigrad::bench::seconds_per_call;

namespace {

double op_overhead_ns(int iterations) {
  Tensor a = Tensor::from_vector<float>({1, 2, 3, 4}, {4}).set_requires_grad();
  Tensor b = Tensor::from_vector<float>({5, 6, 7, 8}, {4}).set_requires_grad();
  Tensor seed = ones({4});
  double seconds = seconds_per_call([&] { mul(a, b).backward(seed); }, iterations, 15);
  return seconds * 1e9;
}

struct GemmResult {
  double mpigrad_gflops, cblas_gflops;
};

GemmResult sgemm(int64_t n, int iterations) {
  Generator generator(1);
  Tensor a = rand({n, n}, generator);
  Tensor b = rand({n, n}, generator);
  std::vector<float> c(size_t(n * n));
  double flops = 2.0 * double(n) * double(n) * double(n);
  double ours = seconds_per_call([&] { (void)matmul(a, b); }, iterations);
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  double theirs = seconds_per_call(
      [&] {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(n), int(n), int(n), 1.0f, pa,
                    int(n), pb, int(n), 0.0f, c.data(), int(n));
      },
      iterations);
  return {flops / ours * 1e-9, flops / theirs * 1e-9};
}

struct BandwidthResult {
  double add_gbps, memcpy_gbps;
};

// Bytes moved: add reads two arrays and writes one; memcpy reads one and writes one.
BandwidthResult add_bandwidth(int64_t bytes, int iterations) {
  int64_t n = bytes / int64_t(sizeof(float));
  Tensor a = ones({n});
  Tensor b = ones({n});
  std::vector<char> src(size_t(bytes), 1), dst(size_t(bytes), 0);
  double add_seconds = seconds_per_call([&] { (void)add(a, b); }, iterations);
  double copy_seconds =
      seconds_per_call([&] { std::memcpy(dst.data(), src.data(), size_t(bytes)); }, iterations);
  return {3.0 * double(bytes) / add_seconds * 1e-9, 2.0 * double(bytes) / copy_seconds * 1e-9};
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--json" && i + 1 < argc) {
      json_path = argv[++i];
    } else if (arg == "--quick") {
      quick = true;
    } else if (arg == "--help" || arg == "-h") {
      std::printf("usage: %s [--json FILE] [--quick]\n", argv[0]);
      return 0;
    } else {
      std::fprintf(stderr, "mpigrad-bench-core: unknown argument '%s' (try --help)\n", arg.c_str());
      return 2;
    }
  }

  initialize_cpu_runtime();
  mpigrad::bench::Results results;
  results.add_text("blas_core", blas_core_name());
  results.add_text("threads", std::to_string(num_threads()));

  double overhead = op_overhead_ns(quick ? 2000 : 20000);
  results.add("op_overhead_ns", overhead, "ns", "mul fwd+bwd on [4]; target <= 1000");

  GemmResult gemm = sgemm(1024, quick ? 2 : 10);
  results.add("sgemm_mpigrad_gflops", gemm.mpigrad_gflops, "GFLOP/s", "1024^3 matmul");
  results.add("sgemm_cblas_gflops", gemm.cblas_gflops, "GFLOP/s", "1024^3 cblas_sgemm");
  results.add("sgemm_ratio_vs_cblas", gemm.mpigrad_gflops / gemm.cblas_gflops, "ratio",
              "target >= 0.97");

  int threads = num_threads();
  set_num_threads(1);
  BandwidthResult bw = add_bandwidth(int64_t(64) << 20, quick ? 3 : 10);
  set_num_threads(threads);
  results.add("add_gbps", bw.add_gbps, "GB/s", "64 MiB float add, 1 thread, 3 arrays");
  results.add("memcpy_gbps", bw.memcpy_gbps, "GB/s", "64 MiB memcpy, 2 arrays");
  results.add("add_bw_ratio_vs_memcpy", bw.add_gbps / bw.memcpy_gbps, "ratio", "target >= 0.6");

  results.print();
  if (!json_path.empty() && !results.write_json(json_path)) {
    std::fprintf(stderr, "mpigrad-bench-core: cannot write %s\n", json_path.c_str());
    return 1;
  }
  return 0;
}
