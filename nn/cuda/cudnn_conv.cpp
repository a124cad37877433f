// Conv2d on CUDA with cuDNN: forward, backward data and backward filter (NCHW, groups, stride,
// padding, dilation; cross-correlation, as torch).
//
// Each (device, dtype, shape) gets one ConvPlan, built on its first call and kept for the
// process: the cuDNN descriptors, and per direction an AlgorithmPlan (nn/cuda/algorithm_plan.h)
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

#include "mpigrad/nn/cuda/algorithm_plan.h"
#include "mpigrad/nn/cuda/cuda_ops.h"
#include "mpigrad/nn/cuda/cudnn_support.cuh"

namespace mpigrad::nn::cuda_ops {

using core::Tensor;

namespace {

constexpr const char* kOp = "conv2d (cuDNN)";
// Large enough for every algorithm of the layers we train; an algorithm asking for more is
// skipped rather than allowed to take a GPU's memory.
constexpr size_t kWorkspaceCap = size_t(512) << 20;

enum Direction { kForward = 0, kBackwardData = 1, kBackwardFilter = 2 };
constexpr const char* kDirectionNames[] = {"forward", "backward data", "backward filter"};

std::atomic<int64_t> plans_built{0}, heuristic_queries{0}, fallbacks{0};

// The descriptors of one convolution.
struct ConvDescriptors {
  detail::TensorDescriptor x, y;
  detail::FilterDescriptor w;
  detail::ConvolutionDescriptor conv;

  ConvDescriptors(const ConvShape& s, core::DType dtype, int device)
      : x(device), y(device), w(device), conv(device) {
    const auto& g = s.geometry;
    const cudnnDataType_t type = detail::cudnn_dtype(dtype, kOp);
    detail::set_nchw(x, dtype, s.batch, g.channels, g.height, g.width, kOp, device);
    detail::set_nchw(y, dtype, s.batch, s.out_channels, g.out_h, g.out_w, kOp, device);
    MPIGRAD_CUDNN_CHECK(cudnnSetFilter4dDescriptor(w.get(), type, CUDNN_TENSOR_NCHW,
                                                   int(s.out_channels),
                                                   int(g.channels / s.groups), int(g.kernel_h),
                                                   int(g.kernel_w)),
                        device);
    MPIGRAD_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(
                            conv.get(), int(g.pad_h), int(g.pad_w), int(g.stride_h),
                            int(g.stride_w), int(g.dilation_h), int(g.dilation_w),
                            CUDNN_CROSS_CORRELATION, type),
                        device);
    MPIGRAD_CUDNN_CHECK(cudnnSetConvolutionGroupCount(conv.get(), int(s.groups)), device);
    MPIGRAD_CUDNN_CHECK(cudnnSetConvolutionMathType(conv.get(), CUDNN_FMA_MATH), device);
  }
};

// One shape on one device. Used only while its device's HandleLease is held, which serializes
// the math-type changes on the shared descriptor and the plans' fall-backs.
struct ConvPlan {
  ConvDescriptors descriptors;
  std::array<std::unique_ptr<AlgorithmPlan>, 3> algorithms;
  ConvPlan(const ConvShape& shape, core::DType dtype, int device)
      : descriptors(shape, dtype, device) {}
};

using PlanKey = std::tuple<int, int, std::array<int64_t, 16>>;

PlanKey plan_key(const ConvShape& s, core::DType dtype, int device) {
  const auto& g = s.geometry;
  return {device, int(dtype),
          {g.channels, g.height, g.width, g.kernel_h, g.kernel_w, g.pad_h, g.pad_w, g.stride_h,
           g.stride_w, g.dilation_h, g.dilation_w, g.out_h, g.out_w, s.batch, s.out_channels,
           s.groups}};
}

ConvPlan& plan_for(const ConvShape& shape, core::DType dtype, int device) {
  // Leaked on purpose, like the handle cache: convolutions may run from static destructors.
  static std::mutex mutex;
  static auto* plans = new std::map<PlanKey, std::unique_ptr<ConvPlan>>();
  std::lock_guard<std::mutex> lock(mutex);
  auto& plan = (*plans)[plan_key(shape, dtype, device)];
  if (!plan) plan = std::make_unique<ConvPlan>(shape, dtype, device);
  return *plan;
}

bool math_allowed(core::DType dtype, cudnnMathType_t math) {
  if (dtype == core::kFloat32) return math == CUDNN_FMA_MATH;
  return math != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
}

// The calls of one direction, with cuDNN's types.
struct DirectionCalls {
  Direction direction;
  const ConvDescriptors& d;
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
      status = cudnnGetConvolutionForwardWorkspaceSize(handle, d.x.get(), d.w.get(), d.conv.get(),
                                                       d.y.get(),
                                                       cudnnConvolutionFwdAlgo_t(algorithm),
                                                       &bytes);
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

  std::unique_ptr<AlgorithmPlan> build_plan(core::DType dtype) const {
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

void check_tensors(const char* what, std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* t : tensors) {
    MPIGRAD_CHECK(t->defined() && t->device().is_cuda() && t->is_contiguous(), kOp, ": ", what,
                  " needs dense CUDA tensors");
  }
}

// Runs one direction of `shape`: `a` and `b` are its inputs and `out` its output, in the order
// the cuDNN call of that direction takes them.
void run(Direction direction, const ConvShape& shape, const Tensor& a, const Tensor& b,
         Tensor& out) {
  const core::Device device = out.device();
  detail::on_device(device, [&] {
    detail::HandleLease handle(device);
    const core::DType dtype = out.dtype();
    ConvPlan& plan = plan_for(shape, dtype, handle.device());
    const ConvDescriptors& d = plan.descriptors;
    const DirectionCalls calls{direction, d, handle.get(), handle.device()};
    auto& algorithms = plan.algorithms[direction];
    if (!algorithms) algorithms = calls.build_plan(dtype);
    const auto one = detail::scale(1.0), zero = detail::scale(0.0);
    const size_t before = algorithms->remaining();
    // Only a call whose every algorithm failed needs its description.
    const auto what = [&] {
      return std::string(kOp) + " " + kDirectionNames[direction] + " on " + device.str() +
             " (" + std::string(core::dtype_name(dtype)) + ")";
    };
    algorithms->run(what, [&](const AlgorithmChoice& choice) -> std::string {
      const auto math = cudnnMathType_t(choice.math_type);
      cudnnStatus_t status = cudnnSetConvolutionMathType(d.conv.get(), math);
      if (status != CUDNN_STATUS_SUCCESS) return cudnnGetErrorString(status);
      Tensor workspace;
      try {
        workspace = detail::workspace(device, choice.workspace_bytes);
      } catch (const core::Error& error) {
        return std::string("workspace: ") + error.what();
      }
      void* space = workspace.data_ptr();
      const size_t bytes = choice.workspace_bytes;
      if (direction == kForward) {
        status = cudnnConvolutionForward(handle.get(), one.get(dtype), d.x.get(), a.data_ptr(),
                                         d.w.get(), b.data_ptr(), d.conv.get(),
                                         cudnnConvolutionFwdAlgo_t(choice.algorithm), space,
                                         bytes, zero.get(dtype), d.y.get(), out.data_ptr());
      } else if (direction == kBackwardData) {
        status = cudnnConvolutionBackwardData(
            handle.get(), one.get(dtype), d.w.get(), b.data_ptr(), d.y.get(), a.data_ptr(),
            d.conv.get(), cudnnConvolutionBwdDataAlgo_t(choice.algorithm), space, bytes,
            zero.get(dtype), d.x.get(), out.data_ptr());
      } else {
        status = cudnnConvolutionBackwardFilter(
            handle.get(), one.get(dtype), d.x.get(), a.data_ptr(), d.y.get(), b.data_ptr(),
            d.conv.get(), cudnnConvolutionBwdFilterAlgo_t(choice.algorithm), space, bytes,
            zero.get(dtype), d.w.get(), out.data_ptr());
      }
      return status == CUDNN_STATUS_SUCCESS ? std::string() : cudnnGetErrorString(status);
    });
    fallbacks += int64_t(before - algorithms->remaining());
  });
}

}  // namespace

void conv2d_forward(const ConvShape& shape, const Tensor& x, const Tensor& w, Tensor& y) {
  check_tensors("forward", {&x, &w, &y});
  run(kForward, shape, x, w, y);
}

void conv2d_backward_data(const ConvShape& shape, const Tensor& grad_y, const Tensor& w,
                          Tensor& grad_x) {
  check_tensors("backward data", {&grad_y, &w, &grad_x});
  run(kBackwardData, shape, grad_y, w, grad_x);
}

void conv2d_backward_filter(const ConvShape& shape, const Tensor& x, const Tensor& grad_y,
                            Tensor& grad_w) {
  check_tensors("backward filter", {&x, &grad_y, &grad_w});
  run(kBackwardFilter, shape, x, grad_y, grad_w);
}

ConvAlgorithmStats cudnn_conv_algorithm_stats() {
  return {plans_built.load(), heuristic_queries.load(), fallbacks.load()};
}

}  // namespace mpigrad::nn::cuda_ops
