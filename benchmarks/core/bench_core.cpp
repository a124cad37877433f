// benchmarks/core: what the CPU core costs next to the raw thing it wraps, in the same run.
//
//   op_overhead_ns          forward + backward of one tiny elementwise op (mul of two [4]
//                           tensors that require grad), all framework overhead included
//   op_overhead_profiled_ns the same while the per-op profiler records (mpigrad train
//                           --profile, launch/observe/op_profile.h), and what it adds per span
//   sgemm_ratio_vs_cblas    mpigrad matmul throughput / direct cblas_sgemm, 1024^3, same threads
//                           (mpigrad's own split into a block per thread against BLAS's pool)
//   add_bw_ratio_vs_memcpy  64 MiB float add bandwidth / memcpy bandwidth, both single-threaded
//   convert_*               kernels::cpu::convert_dense and add_16bit_dense (float32 <-> bfloat16
//                           and float16, the 16-bit sum) against the plain element loop they
//                           replace, built here for the baseline ISA, on 1 MiB of float32 (the
//                           hierarchical transport's piece), one thread: ns an element and the
//                           speed-up; and against memcpy of the float32 bytes
//   transpose_*             kernels::cpu::copy of a permuted view (the blocked transpose of
//                           kernels/cpu/transpose.cpp) against copy_generic (the element walk it
//                           replaces), one thread: GB/s (bytes read + written) and the speed-up
//
// Usage: mpigrad-bench-core [--json FILE] [--quick] [--checkpoint-mb 256]
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <unistd.h>

#include "../common/bench_util.h"
#include "mpigrad/core/crc32c.h"
#include "mpigrad/kernels/matmul.h"
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

struct ProfiledOverhead {
  double ns, spans_per_call;
};

// op_overhead_ns inside a profiling session: every op, autograd node and kernel span recorded.
ProfiledOverhead op_overhead_profiled_ns(int iterations) {
  ProfiledOverhead result{};
  {
    mpigrad::launch::OpProfiler profiler;
    result.ns = op_overhead_ns(iterations);
  }
  Tensor a = Tensor::from_vector<float>({1, 2, 3, 4}, {4}).set_requires_grad();
  Tensor b = Tensor::from_vector<float>({5, 6, 7, 8}, {4}).set_requires_grad();
  Tensor seed = ones({4});
  mpigrad::launch::OpProfiler one_call;
  mul(a, b).backward(seed);
  for (const auto& row : one_call.finish().rows) result.spans_per_call += double(row.calls);
  return result;
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
  // mpigrad runs BLAS on 1 thread inside its own regions (core/threads.h); the library called
  // directly threads itself, with as many threads.
  mpigrad::kernels::cpu::set_blas_threads(num_threads());
  double theirs = seconds_per_call(
      [&] {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(n), int(n), int(n), 1.0f, pa,
                    int(n), pb, int(n), 0.0f, c.data(), int(n));
      },
      iterations);
  mpigrad::kernels::cpu::set_blas_threads(1);
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

// The loops convert_dense replaced, kept out of line so the compiler cannot fold them into the
// timing loop: what the kernels' vectorized forms are measured against.
template <typename Out, typename In>
[[gnu::noinline]] void plain_convert(int64_t n, Out* out, const In* in) {
  for (int64_t i = 0; i < n; ++i) out[i] = Out(float(in[i]));
}
template <typename T>
[[gnu::noinline]] void plain_add(int64_t n, const T* in, T* inout) {
  for (int64_t i = 0; i < n; ++i) inout[i] = T(float(in[i]) + float(inout[i]));
}

// ns per element of the kernel and of the plain loop, for each conversion and sum.
void convert_dense_figures(mpigrad::bench::Results& results, int iterations) {
  namespace kernels = mpigrad::kernels;
  const int64_t n = int64_t(1) << 18;  // 1 MiB of float32
  Generator generator(3);
  const Tensor source = randn({n}, generator);
  const float* x = source.data<float>();
  std::vector<float> widened(static_cast<size_t>(n));
  std::vector<kernels::BFloat16> bf16(static_cast<size_t>(n)), bf16_other(bf16.size());
  std::vector<kernels::Half> half(static_cast<size_t>(n)), half_other(half.size());
  plain_convert(n, bf16_other.data(), x);
  plain_convert(n, half_other.data(), x);
  auto ns = [&](auto&& call) { return seconds_per_call(call, iterations) / double(n) * 1e9; };
  auto add = [&](const std::string& name, double kernel_ns, double plain_ns) {
    results.add("convert_" + name + "_ns", kernel_ns, "ns", "per element, convert_dense");
    results.add("convert_" + name + "_speedup", plain_ns / kernel_ns, "x",
                "over the plain element loop, same run");
  };
  add("f32_to_bf16",
      ns([&] { kernels::cpu::convert_dense(kBFloat16, kFloat32, n, bf16.data(), x); }),
      ns([&] { plain_convert(n, bf16.data(), x); }));
  add("bf16_to_f32",
      ns([&] { kernels::cpu::convert_dense(kFloat32, kBFloat16, n, widened.data(), bf16.data()); }),
      ns([&] { plain_convert(n, widened.data(), bf16.data()); }));
  add("f32_to_f16", ns([&] { kernels::cpu::convert_dense(kFloat16, kFloat32, n, half.data(), x); }),
      ns([&] { plain_convert(n, half.data(), x); }));
  add("f16_to_f32",
      ns([&] { kernels::cpu::convert_dense(kFloat32, kFloat16, n, widened.data(), half.data()); }),
      ns([&] { plain_convert(n, widened.data(), half.data()); }));
  // The sums keep adding into one buffer: the values drift, the work does not.
  add("add_bf16",
      ns([&] { kernels::cpu::add_16bit_dense(kBFloat16, n, bf16_other.data(), bf16.data()); }),
      ns([&] { plain_add(n, bf16_other.data(), bf16.data()); }));
  add("add_f16",
      ns([&] { kernels::cpu::add_16bit_dense(kFloat16, n, half_other.data(), half.data()); }),
      ns([&] { plain_add(n, half_other.data(), half.data()); }));
  std::vector<char> copy(size_t(n) * sizeof(float));
  results.add("memcpy_f32_ns", ns([&] { std::memcpy(copy.data(), x, copy.size()); }), "ns",
              "per float32 element copied, the same 1 MiB");
}

// CRC-32C of a 64 MiB buffer: the instruction (three streams) against Boost's byte table, and
// memcpy's rate on the same bytes for scale.
void crc_figures(mpigrad::bench::Results& results, int iterations) {
  const size_t bytes = size_t(64) << 20;
  std::vector<unsigned char> data(bytes), copy(bytes);
  for (size_t i = 0; i < bytes; ++i) data[i] = static_cast<unsigned char>(i * 2654435761u >> 24);
  uint32_t sink = 0;
  const auto gbps = [&](const std::function<void()>& fn) {
    return double(bytes) / mpigrad::bench::seconds_per_call(fn, iterations, 3) / 1e9;
  };
  const double hardware = gbps([&] { sink ^= mpigrad::core::crc32c(data.data(), bytes); });
  const double table =
      gbps([&] { sink ^= mpigrad::core::detail::crc32c_portable(data.data(), bytes); });
  const double memcpy_rate = gbps([&] { std::memcpy(copy.data(), data.data(), bytes); });
  results.add_text("crc32c_path", mpigrad::core::detail::crc32c_in_hardware()
                                      ? "crc32 instruction, 3 streams"
                                      : "byte table (no instruction on this CPU)");
  results.add("crc32c_gbps", hardware, "GB/s", "64 MiB, core::crc32c");
  results.add("crc32c_table_gbps", table, "GB/s", "the same through Boost's byte table");
  results.add("crc32c_speedup", hardware / table, "x", "instruction over table");
  results.add("crc32c_vs_memcpy", hardware / memcpy_rate, "ratio", "of memcpy's rate");
  if (sink == 0x12345678u) std::printf("\n");  // keeps the CRCs from being optimized away
}

// Writing a checkpoint of `megabytes` of float32 state (as a model plus Adam's two moments)
// against writing the same bytes to a file with one ofstream write: what the format (HDF5, the
// content CRC, the temporary file and rename) adds over the bytes themselves. The write-back of
// one arm's gigabytes must not land in the other's time, and neither may the freeing of an old
// file's blocks: before each write the earlier files are removed and sync() waits for the disk,
// both untimed; the arms alternate A B B A, and the medians are compared.
void checkpoint_figures(mpigrad::bench::Results& results, int64_t megabytes, int rounds) {
  namespace fs = std::filesystem;
  const int64_t floats = megabytes * (int64_t(1) << 20) / 4;
  mpigrad::nn::CheckpointData data;
  const int64_t per_tensor = floats / 3;
  for (const char* part : {"model", "exp_avg", "exp_avg_sq"}) {
    Tensor t = mpigrad::core::ones({per_tensor});
    if (std::string(part) == "model") {
      data.model.set(std::string("weight"), t);
    } else {
      data.optimizer.set(std::string("state.0.") + part, t);
    }
  }
  const fs::path dir = fs::temp_directory_path() / "mpigrad-bench-checkpoint";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string checkpoint = (dir / "ckpt.h5").string(), raw = (dir / "raw.bin").string();
  const auto timed = [&](const std::function<void()>& write) {
    fs::remove(checkpoint);
    fs::remove(raw);
    sync();
    const auto start = std::chrono::steady_clock::now();
    write();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  const auto save = [&] { mpigrad::nn::save_checkpoint(checkpoint, data); };
  const auto plain = [&] {
    std::ofstream out(raw, std::ios::binary);
    for (const auto* dict : {&data.model, &data.optimizer}) {
      for (const auto& [name, tensor] : dict->tensors()) {
        out.write(static_cast<const char*>(tensor.data_ptr()), std::streamsize(tensor.nbytes()));
      }
    }
  };
  std::vector<double> saves, plains;
  for (int round = 0; round < rounds; ++round) {
    if (round % 2 == 0) {
      saves.push_back(timed(save));
      plains.push_back(timed(plain));
    } else {
      plains.push_back(timed(plain));
      saves.push_back(timed(save));
    }
  }
  fs::remove_all(dir);
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 == 1 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  };
  const double save_s = median(saves), plain_s = median(plains);
  results.add("checkpoint_write_s", save_s, "s",
              std::to_string(megabytes) + " MiB: weights and two Adam moments; median of " +
                  std::to_string(rounds));
  results.add("raw_write_s", plain_s, "s", "the same bytes, one ofstream write each");
  results.add("checkpoint_over_raw", save_s / plain_s, "x", "target <= 1.2");
}

// A dense copy of `shape` permuted by `order` (out[i] = in[permuted i]), as contiguous() of a
// permuted view does it.
mpigrad::kernels::StridedLoop permuted_copy_loop(const std::vector<int64_t>& shape,
                                                 const std::vector<int64_t>& order) {
  std::vector<int64_t> in_strides(shape.size(), 1);
  for (size_t d = shape.size() - 1; d > 0; --d) in_strides[d - 1] = in_strides[d] * shape[d];
  mpigrad::kernels::StridedLoop loop;
  loop.ndim = int(shape.size());
  int64_t out_stride = 1;
  for (int d = loop.ndim - 1; d >= 0; --d) {
    loop.size[d] = shape[size_t(order[size_t(d)])];
    loop.stride[0][d] = out_stride;
    loop.stride[1][d] = in_strides[size_t(order[size_t(d)])];
    out_stride *= loop.size[d];
  }
  return loop;
}

void transpose_figures(mpigrad::bench::Results& results, bool quick) {
  namespace kernels = mpigrad::kernels;
  struct Case {
    const char* name;
    std::vector<int64_t> shape, order;
    DType dtype;
    const char* note;
  };
  const int64_t batch = quick ? 8 : 64;
  const std::vector<Case> cases = {
      {"nhwc_to_nchw", {batch, 56, 56, 96}, {0, 3, 1, 2}, kFloat32, "[N,56,56,96] f32 -> NCHW"},
      {"nchw_to_nhwc", {batch, 96, 56, 56}, {0, 2, 3, 1}, kFloat32, "[N,96,56,56] f32 -> NHWC"},
      {"nhwc_to_nchw_bf16", {batch, 56, 56, 96}, {0, 3, 1, 2}, kBFloat16, "the same in bf16"},
      {"matrix_t", {3072, 768}, {1, 0}, kFloat32, "[3072,768] f32 -> [768,3072]"},
      {"convnext_stage1", {8, 8, 8, 96}, {0, 3, 1, 2}, kFloat32, "[8,8,8,96] -> NCHW, in cache"},
      {"heads", {4, 64, 12, 64}, {0, 2, 1, 3}, kFloat32, "[B,T,H,D] -> [B,H,T,D], memcpy rows"},
      {"heads_d8_bf16",
       {8, 128, 12, 8},
       {0, 2, 1, 3},
       kBFloat16,
       "[B,T,H,8] bf16 -> [B,H,T,8], 16-byte words"},
  };
  for (const Case& c : cases) {
    const kernels::StridedLoop loop = permuted_copy_loop(c.shape, c.order);
    const int64_t bytes = loop.numel() * kernels::element_size(c.dtype);
    std::vector<char> in(size_t(bytes), 1), out(size_t(bytes), 0);
    const int iterations = int(std::max<int64_t>(2, std::min<int64_t>(2000, (1 << 28) / bytes)));
    auto gbps = [&](auto&& copy) {
      return 2.0 * double(bytes) / seconds_per_call(copy, quick ? 2 : iterations) * 1e-9;
    };
    const double blocked =
        gbps([&] { kernels::cpu::copy(c.dtype, c.dtype, loop, out.data(), in.data()); });
    const double generic =
        gbps([&] { kernels::cpu::copy_generic(c.dtype, c.dtype, loop, out.data(), in.data()); });
    const std::string key = std::string("transpose_") + c.name;
    results.add(key + "_gbps", blocked, "GB/s", std::string(c.note) + ", blocked, 1 thread");
    results.add(key + "_generic_gbps", generic, "GB/s", "the element walk, same copy");
    results.add(key + "_speedup", blocked / generic, "x", "blocked over the element walk");
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  bool quick = false;
  int64_t checkpoint_mb = 256;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--json" && i + 1 < argc) {
      json_path = argv[++i];
    } else if (arg == "--quick") {
      quick = true;
    } else if (arg == "--checkpoint-mb" && i + 1 < argc) {
      checkpoint_mb = std::stoll(argv[++i]);
    } else if (arg == "--help" || arg == "-h") {
      std::printf("usage: %s [--json FILE] [--quick] [--checkpoint-mb 256]\n", argv[0]);
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
  const ProfiledOverhead profiled = op_overhead_profiled_ns(quick ? 2000 : 20000);
  results.add("op_overhead_profiled_ns", profiled.ns, "ns", "the same, --profile recording");
  results.add("profile_spans_per_op", profiled.spans_per_call, "spans", "recorded per fwd+bwd");
  results.add("profile_ns_per_span", (profiled.ns - overhead) / profiled.spans_per_call, "ns",
              "what recording adds per span");

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
  convert_dense_figures(results, quick ? 20 : 200);
  crc_figures(results, quick ? 2 : 10);
  checkpoint_figures(results, quick ? 16 : checkpoint_mb, quick ? 4 : 6);
  set_num_threads(1);
  transpose_figures(results, quick);
  set_num_threads(threads);

  return results.report(json_path, "mpigrad-bench-core");
}
