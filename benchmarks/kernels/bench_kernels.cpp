// mpigrad-bench-kernels: how close mpigrad's CUDA kernels come to the hardware.
//
// Every kernel family runs through the public Tensor API on tensors of at least 256 MB and is
// timed with CUDA events over many calls after a warm-up. Its effective bandwidth (bytes it must
// read and write, divided by the time) is reported beside the device-to-device cudaMemcpy
// bandwidth measured the same way in the same run, and as a fraction of it. matmul reports
// TFLOP/s through mpigrad against cuBLAS called directly with the same settings, in fp32 (no
// TF32), bf16 and fp16, each accumulating in fp32. conv2d (forward and both backward products of
// one 3x3 layer) reports TFLOP/s in fp32 (cuDNN, FMA math, no TF32) and under autocast in bf16 and
// fp16 (cuDNN's 16-bit configurations, tensor-op math), each as a ratio to fp32 in this run.
//
//   mpigrad-bench-kernels [--json FILE] [--iterations N]
//
// Without a visible GPU it says so, quoting the CUDA error, and exits with status 2 (1 when the
// GPU is there but broken).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/bench_util.h"
#include "mpigrad/core/autocast.h"
#include "mpigrad/core/cuda.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/linalg.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/core/ops/softmax.h"
#include "mpigrad/core/rng.h"
#include "mpigrad/core/stream.h"
#include "mpigrad/kernels/cross_entropy.h"
#include "mpigrad/nn/functional/conv.h"

namespace {

using namespace mpigrad::core;  // NOLINT

const Device kGpu = cuda(0);
constexpr int64_t kBytes = int64_t(256) << 20;  // 256 MiB per tensor

void check(cudaError_t status, const char* call) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "mpigrad-bench-kernels: %s failed: %s\n", call,
                 cudaGetErrorString(status));
    std::exit(1);
  }
}

void check(cublasStatus_t status, const char* call) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "mpigrad-bench-kernels: %s failed: %s\n", call,
                 cublasGetStatusString(status));
    std::exit(1);
  }
}

// Milliseconds per call of fn on the current stream, from CUDA events, after warm-up calls.
double time_ms(const std::function<void()>& fn, int iterations) {
  for (int i = 0; i < 3; ++i) fn();
  Event start(true), stop(true);
  start.record(current_stream(kGpu));
  for (int i = 0; i < iterations; ++i) fn();
  stop.record(current_stream(kGpu));
  stop.synchronize();
  return double(start.elapsed_ms(stop)) / iterations;
}

double gbps(double bytes, double ms) {
  return bytes / (ms * 1e-3) / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  int iterations = 20;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0 && i + 1 < argc) {
      json_path = argv[++i];
    } else if (std::strcmp(argv[i], "--iterations") == 0 && i + 1 < argc) {
      iterations = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: mpigrad-bench-kernels [--json FILE] [--iterations N]\n");
      return 2;
    }
  }
  if (iterations < 1) {
    std::fprintf(stderr, "mpigrad-bench-kernels: --iterations must be at least 1\n");
    return 2;
  }
  const CudaVisibility& visibility = cuda_visibility();
  if (!visibility.has_gpu()) {
    // A broken GPU is a failure (1); no GPU at all is "cannot run here" (2).
    std::fprintf(stderr, "mpigrad-bench-kernels: cannot run: %s\n", visibility.describe().c_str());
    return visibility.broken ? 1 : 2;
  }

  try {
    mpigrad::bench::Results results;
    results.add_text("device", cuda_device_name(kGpu));
    results.add_text("tensor_bytes", std::to_string(kBytes));
    Generator generator(1);
    const int64_t n32 = kBytes / 4, n16 = kBytes / 2;
    Tensor a = rand({n32}, generator, TensorOptions().device(kGpu));
    Tensor b = rand({n32}, generator, TensorOptions().device(kGpu));
    Tensor a16 = rand({n16}, generator, TensorOptions(kBFloat16).device(kGpu));
    Tensor b16 = rand({n16}, generator, TensorOptions(kBFloat16).device(kGpu));
    Tensor copy_dst = empty({n32}, TensorOptions().device(kGpu));

    // Baseline: device-to-device cudaMemcpy reads and writes kBytes.
    auto stream = static_cast<cudaStream_t>(current_stream(kGpu).handle());
    const double copy_ms = time_ms(
        [&] {
          check(cudaMemcpyAsync(copy_dst.data_ptr(), a.data_ptr(), size_t(kBytes),
                                cudaMemcpyDeviceToDevice, stream),
                "cudaMemcpyAsync");
        },
        iterations);
    const double copy_gbps = gbps(2.0 * double(kBytes), copy_ms);
    results.add("copy_d2d_gbps", copy_gbps, "GB/s", "cudaMemcpy baseline, read + write");

    auto family = [&](const std::string& key, double bytes, const std::function<void()>& fn,
                      const std::string& note) {
      const double ms = time_ms(fn, iterations);
      const double rate = gbps(bytes, ms);
      results.add(key + "_gbps", rate, "GB/s", note);
      results.add(key + "_of_copy", rate / copy_gbps, "ratio", "fraction of cudaMemcpy D2D");
    };

    family(
        "elementwise_add_f32", 3.0 * double(kBytes), [&] { Tensor c = a + b; }, "c = a + b");
    family(
        "elementwise_mul_bf16", 3.0 * double(kBytes), [&] { Tensor c = a16 * b16; }, "c = a * b");
    family(
        "elementwise_gelu_f32", 2.0 * double(kBytes), [&] { Tensor c = gelu(a); }, "unary");
    family(
        "elementwise_broadcast_f32", 2.0 * double(kBytes),
        [&] {
          Tensor c = a.view({-1, 1024}) * b.slice(0, 0, 1024);
        },
        "[N,1024] * [1024]");
    family(
        "reduction_sum_all_f32", double(kBytes), [&] { Tensor s = sum(a); }, "sum of 64M floats");
    family(
        "reduction_sum_rows_f32", double(kBytes),
        [&] {
          Tensor s = sum(a.view({-1, 1024}), {1});
        },
        "[65536,1024] over dim 1");
    family(
        "reduction_sum_cols_f32", double(kBytes),
        [&] {
          Tensor s = sum(a.view({-1, 1024}), {0});
        },
        "[65536,1024] over dim 0");
    family(
        "softmax_f32", 2.0 * double(kBytes),
        [&] {
          Tensor s = softmax(a.view({-1, 1024}));
        },
        "rows of 1024 (warp per row)");
    family(
        "softmax_long_rows_f32", 2.0 * double(kBytes),
        [&] {
          Tensor s = softmax(a.view({-1, 32768}));
        },
        "rows of 32768 (block per row)");
    family(
        "softmax_bf16", 2.0 * double(kBytes),
        [&] {
          Tensor s = softmax(a16.view({-1, 1024}));
        },
        "rows of 1024");
    family(
        "cast_f32_to_bf16", 1.5 * double(kBytes), [&] { Tensor c = a.to(kBFloat16); },
        "read 4 B, write 2 B");
    family(
        "cast_bf16_to_f32", 3.0 * double(kBytes), [&] { Tensor c = a16.to(kFloat32); },
        "read 2 B, write 4 B");

    {  // Fused cross-entropy: logits [65536, 1024] f32 read, gradient written. The targets are
       // checked inside the kernel; the code it lowers on a bad one is read once, at the end.
      Tensor logits = a.view({-1, 1024});
      const int64_t rows = logits.size(0), cols = logits.size(1);
      std::vector<int64_t> target_values(static_cast<size_t>(rows));
      for (int64_t r = 0; r < rows; ++r) target_values[size_t(r)] = (r * 37) % cols;
      Tensor targets = Tensor::from_vector(target_values, {rows}).to(kGpu);
      Tensor losses = empty({rows}, TensorOptions().device(kGpu));
      Tensor grad = empty({rows, cols}, TensorOptions().device(kGpu));
      Tensor code = full({1}, -1.0, TensorOptions(kInt64).device(kGpu));  // kNoBadTarget
      family(
          "cross_entropy_f32", 2.0 * double(kBytes),
          [&] {
            mpigrad::kernels::cuda::cross_entropy(
                kFloat32, rows, cols, logits.data_ptr(), targets.data<int64_t>(), -100,
                1.0 / double(rows), losses.data_ptr(), grad.data_ptr(),
                static_cast<uint64_t*>(code.data_ptr()), current_stream(kGpu).handle());
          },
          "loss + gradient, rows of 1024");
      if (uint64_t(code.item<int64_t>()) != mpigrad::kernels::cuda::kNoBadTarget) {
        throw Error("cross_entropy: bad target in the benchmark data");
      }
    }

    // matmul through mpigrad against cublasGemmEx, same types, fp32 compute, default algorithm.
    cublasHandle_t handle = nullptr;
    check(cublasCreate(&handle), "cublasCreate");
    check(cublasSetStream(handle, stream), "cublasSetStream");
    for (DType dtype : {kFloat32, kBFloat16, kFloat16}) {
      for (int64_t n : {int64_t(4096), int64_t(8192)}) {
        Tensor x = rand({n, n}, generator, TensorOptions(dtype).device(kGpu));
        Tensor y = rand({n, n}, generator, TensorOptions(dtype).device(kGpu));
        Tensor z = empty({n, n}, TensorOptions(dtype).device(kGpu));
        const int reps = n == 4096 ? 20 : 5;
        const double flops = 2.0 * double(n) * double(n) * double(n);
        const double ours_ms = time_ms([&] { Tensor p = matmul(x, y); }, reps);
        const cudaDataType_t type = dtype == kFloat32    ? CUDA_R_32F
                                    : dtype == kBFloat16 ? CUDA_R_16BF
                                                         : CUDA_R_16F;
        const float one = 1.0f, zero = 0.0f;
        const double cublas_ms = time_ms(
            [&] {
              check(
                  cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, int(n), int(n), int(n), &one,
                               y.data_ptr(), type, int(n), x.data_ptr(), type, int(n), &zero,
                               z.data_ptr(), type, int(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                  "cublasGemmEx");
            },
            reps);
        const char* tag = dtype == kFloat32 ? "f32" : dtype == kBFloat16 ? "bf16" : "f16";
        const std::string key = std::string("matmul_") + tag + "_" + std::to_string(n);
        results.add(key + "_tflops", flops / (ours_ms * 1e-3) / 1e12, "TFLOP/s", "mpigrad matmul");
        results.add(key + "_cublas_tflops", flops / (cublas_ms * 1e-3) / 1e12, "TFLOP/s",
                    "cublasGemmEx direct");
        results.add(key + "_of_cublas", cublas_ms / ours_ms, "ratio", "mpigrad / direct cuBLAS");
      }
    }
    check(cublasDestroy(handle), "cublasDestroy");

    {  // conv2d, 3x3 with padding 1, 256 -> 256 channels on 64 x 28 x 28 (a ResNet stage's
       // shape): forward, backward data and backward filter through autograd, the 16-bit runs
       // including autocast's casts of x and of the gradient (the weight's is cached per step).
      Tensor x = randn({64, 256, 28, 28}, generator, TensorOptions().device(kGpu));
      Tensor w = randn({256, 256, 3, 3}, generator, TensorOptions().device(kGpu)) * (1.0 / 48.0);
      x.set_requires_grad(true);
      w.set_requires_grad(true);
      Tensor grad_y = randn({64, 256, 28, 28}, generator, TensorOptions().device(kGpu));
      mpigrad::nn::functional::Conv2dOptions options;
      options.padding = {1, 1};
      const double flops = 3.0 * 2.0 * 64 * 256 * 256 * 9 * 28 * 28;
      double fp32_ms = 0;
      for (const std::optional<DType> low :
           {std::optional<DType>(), std::optional<DType>(kBFloat16),
            std::optional<DType>(kFloat16)}) {
        const double ms = time_ms(
            [&] {
              x.set_grad(Tensor());
              w.set_grad(Tensor());
              Tensor y;
              {
                AutocastGuard autocast(low);
                y = mpigrad::nn::functional::conv2d(x, w, Tensor(), options);
              }
              y.backward(grad_y);
            },
            10);
        const std::string tag = !low ? "f32" : *low == kBFloat16 ? "bf16" : "f16";
        results.add("conv2d_" + tag + "_tflops", flops / (ms * 1e-3) / 1e12, "TFLOP/s",
                    "3x3, 64x256x28x28, forward + both backward");
        if (!low) {
          fp32_ms = ms;
        } else {
          results.add("conv2d_" + tag + "_over_f32", fp32_ms / ms, "ratio",
                      "speed-up of autocast over fp32 (cuDNN)");
        }
      }
    }

    return results.report(json_path, "mpigrad-bench-kernels");
  } catch (const std::exception& error) {
    std::fprintf(stderr, "mpigrad-bench-kernels: %s\n", error.what());
    return 1;
  }
  return 0;
}
