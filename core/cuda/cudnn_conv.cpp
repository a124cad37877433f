// Conv2d on CUDA with cuDNN: forward, backward data and backward filter (NCHW, groups, stride,
// padding, dilation; cross-correlation, as torch).
//
// Each (device, dtype, shape) gets one ConvPlan, built on its first call and kept by the device's
// backend: the cuDNN descriptors, and per direction an AlgorithmPlan (core/cuda/algorithm_plan.h)
// made from one heuristics query (the _v7 queries, which run nothing), followed by the plain
// algorithms every cuDNN has as a last resort. A training step therefore asks cuDNN nothing but
// to run. Each call sets the math type its algorithm needs on the descriptor, takes the
// workspace (at most kWorkspaceCap) from the caching allocator, and when the call fails (or its
// workspace cannot be had) moves on to the next algorithm for good.
// Math: the descriptor asks for CUDNN_FMA_MATH, and float32 takes only FMA algorithms, so float32
// convolutions do not drop to TF32 and agree with the CPU path to float rounding (torch's
// allow_tf32 would trade that for speed); the other dtypes (float64, bfloat16, float16) take any
// math type but the one that converts them to a lower precision.
//
// Autocast (the *_mixed calls, 16-bit operands): the legacy convolution API runs only
// configurations whose x, w and y share one type, so there is no cuDNN call with 16-bit inputs
// and a float32 output. The plans of a 16-bit dtype use cuDNN's PSEUDO_BFLOAT16 and PSEUDO_HALF
// configurations (16-bit tensors, CUDNN_DATA_FLOAT compute type: fp32 accumulation; TRUE_HALF,
// fp16 sums, is never asked for), start from CUDNN_TENSOR_OP_MATH so the heuristics offer the
// tensor-core algorithms, and write a 16-bit y into scratch that one cast kernel widens into the
// fp32 result. That rounds each result once to 16 bits, as torch's autocast convolution (whose
// output is 16-bit) does too. A shape for which cuDNN runs nothing (an older GPU or cuDNN without
// that configuration) is widened to fp32 instead, with one warning per dtype and process.
#include <array>
#include <atomic>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "mpigrad/core/cuda/cudnn_backend.cuh"
#include "mpigrad/core/threads.h"

namespace mpigrad::core::cuda_detail {

namespace {

constexpr const char* kOp = "conv2d (cuDNN)";
// Large enough for every algorithm of the layers we train; an algorithm asking for more is
// skipped rather than allowed to take a GPU's memory.
constexpr size_t kWorkspaceCap = size_t(512) << 20;

enum Direction { kForward = 0, kBackwardData = 1, kBackwardFilter = 2 };
constexpr const char* kDirectionNames[] = {"forward", "backward data", "backward filter"};

std::atomic<int64_t> plans_built{0}, heuristic_queries{0}, fallbacks{0};
std::atomic<int64_t> mixed_calls{0}, mixed_tensor_op_calls{0}, mixed_widened_calls{0};

bool is_16_bit(DType dtype) {
  return dtype == kBFloat16 || dtype == kFloat16;
}

// The math type a plan starts from: what the heuristics are asked with, and the descriptor's
// setting before any algorithm has set its own.
cudnnMathType_t starting_math(DType dtype) {
  return is_16_bit(dtype) ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH;
}

bool math_allowed(DType dtype, cudnnMathType_t math) {
  if (dtype == kFloat32) return math == CUDNN_FMA_MATH;
  return math != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
}

// The type of a convolution's tensors, and the type it computes in.
struct ConvTypes {
  cudnnDataType_t data, compute;
};
ConvTypes conv_types(DType dtype) {
  if (dtype == kBFloat16) return {CUDNN_DATA_BFLOAT16, CUDNN_DATA_FLOAT};  // PSEUDO_BFLOAT16
  if (dtype == kFloat16) return {CUDNN_DATA_HALF, CUDNN_DATA_FLOAT};       // PSEUDO_HALF
  const cudnnDataType_t type = cudnn_dtype(dtype, kOp);
  return {type, type};
}

// The calls of one direction, with cuDNN's types.
struct DirectionCalls {
  Direction direction;
  const ConvPlan& d;
  cudnnHandle_t handle;
  int device;

  // The heuristics' suggestions, in their order. A 16-bit query cuDNN refuses suggests nothing
  // (the plain algorithms are then tried, and failing those the caller widens to fp32).
  std::vector<std::pair<int, cudnnMathType_t>> suggestions(DType dtype) const {
    std::vector<std::pair<int, cudnnMathType_t>> out;
    const auto check = [&](cudnnStatus_t status, const char* call) {
      if (status == CUDNN_STATUS_SUCCESS) return true;
      if (is_16_bit(dtype)) return false;
      check_cudnn(status, call, device);
      return false;
    };
    auto keep = [&](const auto* perf, int returned) {
      for (int i = 0; i < returned; ++i) {
        if (perf[i].status == CUDNN_STATUS_SUCCESS) {
          out.push_back({int(perf[i].algo), perf[i].mathType});
        }
      }
    };
    // The three directions share one descriptor, and the previous direction's workspace queries
    // left it at the math type of its last candidate (FMA): cuDNN's legacy API offers tensor-op
    // algorithms only for a descriptor set to a tensor-op math type, so set it back first.
    if (!check(cudnnSetConvolutionMathType(d.conv.get(), starting_math(dtype)),
               "cudnnSetConvolutionMathType")) {
      return out;
    }
    int returned = 0;
    if (direction == kForward) {
      cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
      if (check(cudnnGetConvolutionForwardAlgorithm_v7(handle, d.x.get(), d.w.get(), d.conv.get(),
                                                       d.y.get(), CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
                                                       &returned, perf),
                "cudnnGetConvolutionForwardAlgorithm_v7")) {
        keep(perf, returned);
      }
    } else if (direction == kBackwardData) {
      cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
      if (check(cudnnGetConvolutionBackwardDataAlgorithm_v7(
                    handle, d.w.get(), d.y.get(), d.conv.get(), d.x.get(),
                    CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &returned, perf),
                "cudnnGetConvolutionBackwardDataAlgorithm_v7")) {
        keep(perf, returned);
      }
    } else {
      cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
      if (check(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
                    handle, d.x.get(), d.y.get(), d.conv.get(), d.w.get(),
                    CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &returned, perf),
                "cudnnGetConvolutionBackwardFilterAlgorithm_v7")) {
        keep(perf, returned);
      }
    }
    return out;
  }

  // The algorithms that need no workspace tricks and exist in every cuDNN: the last resort.
  std::vector<int> plain_algorithms() const {
    if (direction == kForward) {
      return {CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
              CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM};
    }
    if (direction == kBackwardData) {
      return {CUDNN_CONVOLUTION_BWD_DATA_ALGO_0, CUDNN_CONVOLUTION_BWD_DATA_ALGO_1};
    }
    return {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1};
  }

  // The workspace `algorithm` needs under `math` (set on the descriptor), or false.
  bool workspace(int algorithm, cudnnMathType_t math, size_t& bytes) const {
    if (cudnnSetConvolutionMathType(d.conv.get(), math) != CUDNN_STATUS_SUCCESS) return false;
    cudnnStatus_t status;
    if (direction == kForward) {
      status = cudnnGetConvolutionForwardWorkspaceSize(
          handle, d.x.get(), d.w.get(), d.conv.get(), d.y.get(),
          cudnnConvolutionFwdAlgo_t(algorithm), &bytes);
    } else if (direction == kBackwardData) {
      status = cudnnGetConvolutionBackwardDataWorkspaceSize(
          handle, d.w.get(), d.y.get(), d.conv.get(), d.x.get(),
          cudnnConvolutionBwdDataAlgo_t(algorithm), &bytes);
    } else {
      status = cudnnGetConvolutionBackwardFilterWorkspaceSize(
          handle, d.x.get(), d.y.get(), d.conv.get(), d.w.get(),
          cudnnConvolutionBwdFilterAlgo_t(algorithm), &bytes);
    }
    return status == CUDNN_STATUS_SUCCESS;
  }

  std::unique_ptr<AlgorithmPlan> build_plan(DType dtype) const {
    std::vector<std::pair<int, cudnnMathType_t>> order = suggestions(dtype);
    ++heuristic_queries;
    for (int algorithm : plain_algorithms()) {
      if (is_16_bit(dtype)) order.push_back({algorithm, CUDNN_TENSOR_OP_MATH});
      order.push_back({algorithm, CUDNN_FMA_MATH});
    }
    std::vector<AlgorithmChoice> candidates;
    for (const auto& [algorithm, math] : order) {
      size_t bytes = 0;
      if (math_allowed(dtype, math) && workspace(algorithm, math, bytes)) {
        candidates.push_back({algorithm, int(math), bytes});
      }
    }
    ++plans_built;
    return std::make_unique<AlgorithmPlan>(candidates, kWorkspaceCap);
  }
};

}  // namespace

ConvPlan::ConvPlan(const Conv2dShape& s, DType dtype, int device)
    : x(device), y(device), w(device), conv(device) {
  const auto& g = s.geometry;
  const ConvTypes types = conv_types(dtype);
  set_nchw(x, types.data, s.batch, g.channels, g.height, g.width, kOp, device);
  set_nchw(y, types.data, s.batch, s.out_channels, g.out_h, g.out_w, kOp, device);
  MPIGRAD_CUDNN_CHECK(
      cudnnSetFilter4dDescriptor(w.get(), types.data, CUDNN_TENSOR_NCHW, int(s.out_channels),
                                 int(g.channels / s.groups), int(g.kernel_h), int(g.kernel_w)),
      device);
  MPIGRAD_CUDNN_CHECK(
      cudnnSetConvolution2dDescriptor(conv.get(), int(g.pad_h), int(g.pad_w), int(g.stride_h),
                                      int(g.stride_w), int(g.dilation_h), int(g.dilation_w),
                                      CUDNN_CROSS_CORRELATION, types.compute),
      device);
  MPIGRAD_CUDNN_CHECK(cudnnSetConvolutionGroupCount(conv.get(), int(s.groups)), device);
  MPIGRAD_CUDNN_CHECK(cudnnSetConvolutionMathType(conv.get(), starting_math(dtype)), device);
}

ConvPlan& CudnnBackend::conv_plan(const Conv2dShape& s, DType dtype) {
  const auto& g = s.geometry;
  auto& plan = conv_plans_[{int(dtype),
                            {g.channels, g.height, g.width, g.kernel_h, g.kernel_w, g.pad_h,
                             g.pad_w, g.stride_h, g.stride_w, g.dilation_h, g.dilation_w, s.batch,
                             s.out_channels, s.groups, g.out_h, g.out_w}}];
  if (!plan) plan = std::make_unique<ConvPlan>(s, dtype, device());
  return *plan;
}

std::string CudnnBackend::conv_run(int which, DType dtype, const Conv2dShape& shape, const void* a,
                                   const void* b, void* out, bool may_fail) {
  const auto direction = Direction(which);
  return launch(device(), [&]() -> std::string {
    HandleLease handle(*this);
    // Only a call whose every algorithm failed needs its description.
    const auto what = [&] {
      return std::string(kOp) + " " + kDirectionNames[direction] +
             " on cuda:" + std::to_string(device()) + " (" + std::string(dtype_name(dtype)) + ")";
    };
    ConvPlan* plan = nullptr;
    try {
      plan = &conv_plan(shape, dtype);
      auto& algorithms = plan->algorithms[direction];
      if (!algorithms) {
        algorithms = DirectionCalls{direction, *plan, handle.get(), device()}.build_plan(dtype);
      }
    } catch (const Error& error) {
      if (!may_fail) throw;
      return what() + ": " + error.what();
    }
    ConvPlan& d = *plan;
    AlgorithmPlan& algorithms = *d.algorithms[direction];
    const auto one = scale(1.0), zero = scale(0.0);
    const size_t before = algorithms.remaining();
    const auto attempt = [&](const AlgorithmChoice& choice) -> std::string {
      const auto math = cudnnMathType_t(choice.math_type);
      cudnnStatus_t status = cudnnSetConvolutionMathType(d.conv.get(), math);
      if (status != CUDNN_STATUS_SUCCESS) return cudnnGetErrorString(status);
      std::unique_ptr<Scratch> workspace;
      try {
        workspace = std::make_unique<Scratch>(caching_allocator(), choice.workspace_bytes);
      } catch (const Error& error) {
        return std::string("workspace: ") + error.what();
      }
      void* space = workspace->get();
      const size_t bytes = choice.workspace_bytes;
      if (direction == kForward) {
        status = cudnnConvolutionForward(handle.get(), one.get(dtype), d.x.get(), a, d.w.get(), b,
                                         d.conv.get(), cudnnConvolutionFwdAlgo_t(choice.algorithm),
                                         space, bytes, zero.get(dtype), d.y.get(), out);
      } else if (direction == kBackwardData) {
        status = cudnnConvolutionBackwardData(handle.get(), one.get(dtype), d.w.get(), b, d.y.get(),
                                              a, d.conv.get(),
                                              cudnnConvolutionBwdDataAlgo_t(choice.algorithm),
                                              space, bytes, zero.get(dtype), d.x.get(), out);
      } else {
        status = cudnnConvolutionBackwardFilter(handle.get(), one.get(dtype), d.x.get(), a,
                                                d.y.get(), b, d.conv.get(),
                                                cudnnConvolutionBwdFilterAlgo_t(choice.algorithm),
                                                space, bytes, zero.get(dtype), d.w.get(), out);
      }
      return status == CUDNN_STATUS_SUCCESS ? std::string() : cudnnGetErrorString(status);
    };
    const AlgorithmChoice* ran =
        may_fail ? algorithms.try_run(attempt) : &algorithms.run(what, attempt);
    fallbacks += int64_t(before - algorithms.remaining());
    if (ran == nullptr) return what() + ": no algorithm could run (" + algorithms.describe() + ")";
    if (is_16_bit(dtype)) {
      ++mixed_calls;
      // CUDNN_FMA_MATH is the one math type that keeps cuDNN off the tensor cores.
      if (ran->math_type != int(CUDNN_FMA_MATH)) ++mixed_tensor_op_calls;
    }
    return {};
  });
}

bool CudnnBackend::conv_run_mixed(int direction, DType operand, const Conv2dShape& shape,
                                  const void* a, const void* b, float* out, int64_t out_count) {
  MPIGRAD_CHECK(is_16_bit(operand), kOp,
                ": mixed precision takes bfloat16 or float16 operands, got ", operand);
  const std::string why = launch(device(), [&] {
    Scratch low(caching_allocator(), size_t(out_count) * size_t(element_size(operand)));
    std::string error = conv_run(direction, operand, shape, a, b, low.get(), /*may_fail=*/true);
    if (error.empty()) {
      // Queued behind the convolution on the same stream, before `low` goes back to the pool.
      StridedLoop loop;
      loop.ndim = 1;
      loop.size[0] = out_count;
      loop.stride[0][0] = loop.stride[1][0] = 1;
      copy(kFloat32, operand, loop, out, low.get());
    }
    return error;
  });
  if (why.empty()) return true;
  ++mixed_widened_calls;
  std::lock_guard<std::mutex> lock(mixed_mutex_);
  auto [first, inserted] = mixed_widened_.try_emplace(operand, why);
  if (inserted && launcher_rank_zero()) {
    std::fprintf(stderr,
                 "mpigrad: warning: autocast convolutions in %s run widened to float32 on "
                 "cuda:%d, without tensor cores, for the shapes cuDNN cannot run in 16 bits; "
                 "the first: %s\n",
                 std::string(dtype_name(operand)).c_str(), device(), first->second.c_str());
  }
  return false;
}

// cuDNN rejects empty tensors: an empty batch has nothing to compute, and a zero weight gradient.
void CudnnBackend::conv2d_forward(DType dtype, const Conv2dShape& shape, const void* x,
                                  const void* w, void* y) {
  if (shape.batch == 0) return;
  conv_run(kForward, dtype, shape, x, w, y);
}

void CudnnBackend::conv2d_backward_data(DType dtype, const Conv2dShape& shape, const void* grad_y,
                                        const void* w, void* grad_x) {
  if (shape.batch == 0) return;
  conv_run(kBackwardData, dtype, shape, grad_y, w, grad_x);
}

void CudnnBackend::conv2d_backward_filter(DType dtype, const Conv2dShape& shape, const void* x,
                                          const void* grad_y, void* grad_w) {
  if (shape.batch == 0) {
    const auto& g = shape.geometry;
    fill(dtype, shape.out_channels * (g.channels / shape.groups) * g.kernel_h * g.kernel_w, grad_w,
         0.0);
    return;
  }
  conv_run(kBackwardFilter, dtype, shape, x, grad_y, grad_w);
}

void CudnnBackend::conv2d_forward_mixed(DType operand, const Conv2dShape& shape, const void* x,
                                        const void* w, float* y) {
  if (shape.batch == 0) return;
  const auto& g = shape.geometry;
  if (!conv_run_mixed(kForward, operand, shape, x, w, y,
                      shape.batch * shape.out_channels * g.out_h * g.out_w)) {
    Backend::conv2d_forward_mixed(operand, shape, x, w, y);
  }
}

void CudnnBackend::conv2d_backward_data_mixed(DType operand, const Conv2dShape& shape,
                                              const void* grad_y, const void* w, float* grad_x) {
  if (shape.batch == 0) return;
  const auto& g = shape.geometry;
  if (!conv_run_mixed(kBackwardData, operand, shape, grad_y, w, grad_x,
                      shape.batch * g.channels * g.height * g.width)) {
    Backend::conv2d_backward_data_mixed(operand, shape, grad_y, w, grad_x);
  }
}

void CudnnBackend::conv2d_backward_filter_mixed(DType operand, const Conv2dShape& shape,
                                                const void* x, const void* grad_y, float* grad_w) {
  const auto& g = shape.geometry;
  const int64_t count = shape.out_channels * (g.channels / shape.groups) * g.kernel_h * g.kernel_w;
  if (shape.batch == 0) {
    fill(kFloat32, count, grad_w, 0.0);
    return;
  }
  if (!conv_run_mixed(kBackwardFilter, operand, shape, x, grad_y, grad_w, count)) {
    Backend::conv2d_backward_filter_mixed(operand, shape, x, grad_y, grad_w);
  }
}

std::string CudnnBackend::mixed_precision_kernels(DType operand) {
  std::string text = CudaBackend::mixed_precision_kernels(operand);
  if (!is_16_bit(operand)) return text;
  std::lock_guard<std::mutex> lock(mixed_mutex_);
  auto probe = mixed_probes_.find(operand);
  if (probe == mixed_probes_.end()) {
    // A 3x3 convolution of 16 channels, each direction once, on zeros: whether this device's
    // cuDNN runs the configuration at all. Its plans stay, as any shape's do.
    Conv2dShape shape;
    shape.batch = 2;
    shape.groups = 1;
    shape.out_channels = 16;
    auto& g = shape.geometry;
    g.channels = 16;
    g.height = g.width = g.out_h = g.out_w = 8;
    g.kernel_h = g.kernel_w = 3;
    g.stride_h = g.stride_w = g.dilation_h = g.dilation_w = 1;
    g.pad_h = g.pad_w = 1;
    const int64_t elements = 2 * 16 * 8 * 8, weights = 16 * 16 * 3 * 3;
    const int64_t tensor_op_before = mixed_tensor_op_calls.load();
    std::string verdict = launch(device(), [&] {
      const size_t half = element_size(operand);
      Scratch x(caching_allocator(), size_t(elements) * half);
      Scratch w(caching_allocator(), size_t(weights) * half);
      Scratch y(caching_allocator(), size_t(elements) * half);
      fill(operand, elements, x.get(), 0.0);
      fill(operand, weights, w.get(), 0.0);
      std::string error = conv_run(kForward, operand, shape, x.get(), w.get(), y.get(), true);
      if (error.empty()) {
        error = conv_run(kBackwardData, operand, shape, y.get(), w.get(), x.get(), true);
      }
      if (error.empty()) {
        error = conv_run(kBackwardFilter, operand, shape, x.get(), y.get(), w.get(), true);
      }
      return error;
    });
    probe =
        mixed_probes_
            .emplace(operand, MixedProbe{verdict, mixed_tensor_op_calls.load() - tensor_op_before})
            .first;
  }
  // cuDNN 9 numbers its versions major * 10000 + minor * 100 + patch.
  const size_t number = cudnnGetVersion();
  const std::string version = std::to_string(number / 10000) + "." +
                              std::to_string(number / 100 % 100) + "." +
                              std::to_string(number % 100);
  if (!probe->second.error.empty()) {
    return text + "; convolution widened to float32: cuDNN " + version +
           " cannot run it in 16 bits here (" + probe->second.error + ")";
  }
  text += "; convolution on cuDNN " + version + " in " + std::string(dtype_name(operand)) +
          " with fp32 compute and tensor-op math allowed (" +
          std::to_string(probe->second.tensor_op_calls) +
          " of a probe's 3 calls took it), its 16-bit result widened to float32";
  const auto widened = mixed_widened_.find(operand);
  if (widened != mixed_widened_.end()) {
    text += " (some shapes widened to float32 first: " + widened->second + ")";
  }
  return text;
}

ConvAlgorithmStats cudnn_conv_algorithm_stats() {
  return {plans_built.load(), heuristic_queries.load(),     fallbacks.load(),
          mixed_calls.load(), mixed_tensor_op_calls.load(), mixed_widened_calls.load()};
}

}  // namespace mpigrad::core::cuda_detail
