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
#include <array>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "mpigrad/core/cuda/cudnn_backend.cuh"

namespace mpigrad::core::cuda_detail {

namespace {

constexpr const char* kOp = "conv2d (cuDNN)";
// Large enough for every algorithm of the layers we train; an algorithm asking for more is
// skipped rather than allowed to take a GPU's memory.
constexpr size_t kWorkspaceCap = size_t(512) << 20;

enum Direction { kForward = 0, kBackwardData = 1, kBackwardFilter = 2 };
constexpr const char* kDirectionNames[] = {"forward", "backward data", "backward filter"};

std::atomic<int64_t> plans_built{0}, heuristic_queries{0}, fallbacks{0};

bool math_allowed(DType dtype, cudnnMathType_t math) {
  if (dtype == kFloat32) return math == CUDNN_FMA_MATH;
  return math != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
}

// The calls of one direction, with cuDNN's types.
struct DirectionCalls {
  Direction direction;
  const ConvPlan& d;
  cudnnHandle_t handle;
  int device;

  // The heuristics' suggestions of the descriptor's math type, in their order.
  std::vector<std::pair<int, cudnnMathType_t>> suggestions() const {
    std::vector<std::pair<int, cudnnMathType_t>> out;
    auto keep = [&](const auto* perf, int returned) {
      for (int i = 0; i < returned; ++i) {
        if (perf[i].status == CUDNN_STATUS_SUCCESS) {
          out.push_back({int(perf[i].algo), perf[i].mathType});
        }
      }
    };
    int returned = 0;
    if (direction == kForward) {
      cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
      MPIGRAD_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(
                              handle, d.x.get(), d.w.get(), d.conv.get(), d.y.get(),
                              CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &returned, perf),
                          device);
      keep(perf, returned);
    } else if (direction == kBackwardData) {
      cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
      MPIGRAD_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(
                              handle, d.w.get(), d.y.get(), d.conv.get(), d.x.get(),
                              CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &returned, perf),
                          device);
      keep(perf, returned);
    } else {
      cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
      MPIGRAD_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
                              handle, d.x.get(), d.y.get(), d.conv.get(), d.w.get(),
                              CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &returned, perf),
                          device);
      keep(perf, returned);
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
    std::vector<std::pair<int, cudnnMathType_t>> order = suggestions();
    ++heuristic_queries;
    for (int algorithm : plain_algorithms()) order.push_back({algorithm, CUDNN_FMA_MATH});
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
  const cudnnDataType_t type = cudnn_dtype(dtype, kOp);
  set_nchw(x, dtype, s.batch, g.channels, g.height, g.width, kOp, device);
  set_nchw(y, dtype, s.batch, s.out_channels, g.out_h, g.out_w, kOp, device);
  MPIGRAD_CUDNN_CHECK(
      cudnnSetFilter4dDescriptor(w.get(), type, CUDNN_TENSOR_NCHW, int(s.out_channels),
                                 int(g.channels / s.groups), int(g.kernel_h), int(g.kernel_w)),
      device);
  MPIGRAD_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(
                          conv.get(), int(g.pad_h), int(g.pad_w), int(g.stride_h), int(g.stride_w),
                          int(g.dilation_h), int(g.dilation_w), CUDNN_CROSS_CORRELATION, type),
                      device);
  MPIGRAD_CUDNN_CHECK(cudnnSetConvolutionGroupCount(conv.get(), int(s.groups)), device);
  MPIGRAD_CUDNN_CHECK(cudnnSetConvolutionMathType(conv.get(), CUDNN_FMA_MATH), device);
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

void CudnnBackend::conv_run(int which, DType dtype, const Conv2dShape& shape, const void* a,
                            const void* b, void* out) {
  const auto direction = Direction(which);
  launch(device(), [&] {
    HandleLease handle(*this);
    ConvPlan& d = conv_plan(shape, dtype);
    const DirectionCalls calls{direction, d, handle.get(), device()};
    auto& algorithms = d.algorithms[direction];
    if (!algorithms) algorithms = calls.build_plan(dtype);
    const auto one = scale(1.0), zero = scale(0.0);
    const size_t before = algorithms->remaining();
    // Only a call whose every algorithm failed needs its description.
    const auto what = [&] {
      return std::string(kOp) + " " + kDirectionNames[direction] +
             " on cuda:" + std::to_string(device()) + " (" + std::string(dtype_name(dtype)) + ")";
    };
    algorithms->run(what, [&](const AlgorithmChoice& choice) -> std::string {
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
    });
    fallbacks += int64_t(before - algorithms->remaining());
  });
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

ConvAlgorithmStats cudnn_conv_algorithm_stats() {
  return {plans_built.load(), heuristic_queries.load(), fallbacks.load()};
}

}  // namespace mpigrad::core::cuda_detail
