#include "mpigrad/nn/functional/pooling.h"

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/ops/op_support.h"
#include "mpigrad/kernels/pooling.h"
#if defined(MPIGRAD_WITH_CUDA)
#include "mpigrad/nn/cuda/cuda_ops.h"
#endif

namespace mpigrad::nn::functional {

using core::Tensor;

namespace {

enum class PoolKind { Max, Avg, AdaptiveAvg };

const char* pool_name(PoolKind kind) {
  switch (kind) {
    case PoolKind::Max: return "max_pool2d";
    case PoolKind::Avg: return "avg_pool2d";
    default: return "adaptive_avg_pool2d";
  }
}

kernels::Pool2dGeometry make_geometry(const char* name, const Tensor& input) {
  MPIGRAD_CHECK(input.defined(), name, ": undefined input");
  MPIGRAD_CHECK(input.dim() == 3 || input.dim() == 4, name,
                ": input must be [N, C, H, W] or [C, H, W], got shape ", input.shape());
  MPIGRAD_CHECK(input.dtype() == core::kFloat32 || input.dtype() == core::kFloat64, name,
                ": input must be float32 or float64, got ", input.dtype());
  kernels::Pool2dGeometry g;
  g.height = input.size(-2);
  g.width = input.size(-1);
  g.planes = g.height * g.width == 0 ? 0 : input.numel() / (g.height * g.width);
  return g;
}

core::Shape output_shape(const Tensor& input, const kernels::Pool2dGeometry& g) {
  core::Shape shape = input.shape();
  shape[shape.size() - 2] = g.out_h;
  shape[shape.size() - 1] = g.out_w;
  return shape;
}

// On CUDA every pooling is a cuDNN window pooling (cuda_ops::PoolMode).
enum class CudaPool { Max, AvgIncludePad, AvgExcludePad };

#if defined(MPIGRAD_WITH_CUDA)
cuda_ops::PoolMode to_mode(CudaPool mode) {
  switch (mode) {
    case CudaPool::Max: return cuda_ops::PoolMode::Max;
    case CudaPool::AvgIncludePad: return cuda_ops::PoolMode::AvgIncludePad;
    default: return cuda_ops::PoolMode::AvgExcludePad;
  }
}
#endif

void pool_forward_cuda(CudaPool mode, const kernels::Pool2dGeometry& g, const Tensor& x,
                       Tensor& out) {
#if defined(MPIGRAD_WITH_CUDA)
  cuda_ops::pool2d_forward(to_mode(mode), g, x, out);
#else
  (void)mode, (void)g, (void)x, (void)out;
  core::fail("pool2d: this libmpigrad has no CUDA backend");
#endif
}

void pool_backward_cuda(CudaPool mode, const kernels::Pool2dGeometry& g, const Tensor& x,
                        const Tensor& y, const Tensor& grad_y, Tensor& grad_x) {
#if defined(MPIGRAD_WITH_CUDA)
  cuda_ops::pool2d_backward(to_mode(mode), g, x, y, grad_y, grad_x);
#else
  (void)mode, (void)g, (void)x, (void)y, (void)grad_y, (void)grad_x;
  core::fail("pool2d: this libmpigrad has no CUDA backend");
#endif
}

struct Pool2dBackward final : core::Node {
  PoolKind kind;
  kernels::Pool2dGeometry geometry;
  bool count_include_pad = true;
  core::Shape input_shape;
  Tensor indices;  // max pooling: not an autograd tensor, nobody else can modify it
  // CUDA: the cuDNN pooling that ran, and for max pooling the (detached) input and output,
  // from which cuDNN finds the winners again.
  bool cuda = false;
  CudaPool cuda_mode = CudaPool::Max;
  kernels::Pool2dGeometry cuda_geometry;
  Tensor cuda_input, cuda_output;
  explicit Pool2dBackward(PoolKind kind_) : kind(kind_) {}
  const char* name() const override {
    switch (kind) {
      case PoolKind::Max: return "MaxPool2dBackward";
      case PoolKind::Avg: return "AvgPool2dBackward";
      default: return "AdaptiveAvgPool2dBackward";
    }
  }
  void apply(const Tensor& grad_output, std::vector<Tensor>& grads) override {
    Tensor g = grad_output.contiguous();
    Tensor grad_in = core::detail::empty_on(input_shape, g.dtype(), g.device());
    if (cuda) {
      pool_backward_cuda(cuda_mode, cuda_geometry, cuda_input, cuda_output, g, grad_in);
      grads[0] = grad_in;
      return;
    }
    switch (kind) {
      case PoolKind::Max:
        kernels::cpu::max_pool2d_backward(g.dtype(), geometry, g.data_ptr(),
                                          indices.data<int64_t>(), grad_in.data_ptr());
        break;
      case PoolKind::Avg:
        kernels::cpu::avg_pool2d_backward(g.dtype(), geometry, count_include_pad, g.data_ptr(),
                                          grad_in.data_ptr());
        break;
      case PoolKind::AdaptiveAvg:
        kernels::cpu::adaptive_avg_pool2d_backward(g.dtype(), geometry, g.data_ptr(),
                                                   grad_in.data_ptr());
        break;
    }
    grads[0] = grad_in;
  }
  void release_saved() override {
    indices = Tensor();
    cuda_input = Tensor();
    cuda_output = Tensor();
  }
};

Tensor windowed_pool(PoolKind kind, const Tensor& input, const Pool2dOptions& o) {
  const char* name = pool_name(kind);
  kernels::Pool2dGeometry g = make_geometry(name, input);
  g.kernel_h = o.kernel_size[0];
  g.kernel_w = o.kernel_size[1];
  g.stride_h = o.stride[0] == 0 ? g.kernel_h : o.stride[0];
  g.stride_w = o.stride[1] == 0 ? g.kernel_w : o.stride[1];
  g.pad_h = o.padding[0];
  g.pad_w = o.padding[1];
  if (kind == PoolKind::Max) {
    g.dilation_h = o.dilation[0];
    g.dilation_w = o.dilation[1];
  }
  MPIGRAD_CHECK(g.kernel_h >= 1 && g.kernel_w >= 1 && g.stride_h >= 1 && g.stride_w >= 1 &&
                    g.dilation_h >= 1 && g.dilation_w >= 1,
                name, ": kernel size, stride and dilation must be >= 1");
  MPIGRAD_CHECK(g.pad_h >= 0 && g.pad_w >= 0 && 2 * g.pad_h <= g.kernel_h &&
                    2 * g.pad_w <= g.kernel_w,
                name, ": padding must be >= 0 and at most half the kernel size, got ", g.pad_h,
                "x", g.pad_w, " for kernel ", g.kernel_h, "x", g.kernel_w);
  g.out_h = (g.height + 2 * g.pad_h - g.dilation_h * (g.kernel_h - 1) - 1) / g.stride_h + 1;
  g.out_w = (g.width + 2 * g.pad_w - g.dilation_w * (g.kernel_w - 1) - 1) / g.stride_w + 1;
  MPIGRAD_CHECK(g.out_h > 0 && g.out_w > 0, name, ": input of shape ", input.shape(),
                " is too small for kernel ", g.kernel_h, "x", g.kernel_w);
  Tensor x;
  {
    core::NoGradGuard no_grad;
    x = input.contiguous();
  }
  Tensor out = core::detail::empty_on(output_shape(input, g), input.dtype(), input.device());
  Tensor indices;
  const bool cuda = input.device().is_cuda();
  const CudaPool cuda_mode = kind == PoolKind::Max ? CudaPool::Max
                             : o.count_include_pad ? CudaPool::AvgIncludePad
                                                   : CudaPool::AvgExcludePad;
  if (cuda) {
    pool_forward_cuda(cuda_mode, g, x, out);
  } else if (kind == PoolKind::Max) {
    indices = core::detail::empty_on(out.shape(), core::kInt64, input.device());
    kernels::cpu::max_pool2d_forward(x.dtype(), g, x.data_ptr(), out.data_ptr(),
                                     indices.data<int64_t>());
  } else {
    kernels::cpu::avg_pool2d_forward(x.dtype(), g, o.count_include_pad, x.data_ptr(),
                                     out.data_ptr());
  }
  if (auto node = core::detail::record<Pool2dBackward>(out, {&input}, kind)) {
    node->geometry = g;
    node->count_include_pad = o.count_include_pad;
    node->input_shape = input.shape();
    node->indices = indices;
    node->cuda = cuda;
    node->cuda_mode = cuda_mode;
    node->cuda_geometry = g;
    if (cuda && kind == PoolKind::Max) {
      node->cuda_input = x.detach();
      node->cuda_output = out.detach();
    }
  }
  return out;
}

}  // namespace

Tensor max_pool2d(const Tensor& input, const Pool2dOptions& options) {
  return windowed_pool(PoolKind::Max, input, options);
}

Tensor avg_pool2d(const Tensor& input, const Pool2dOptions& options) {
  return windowed_pool(PoolKind::Avg, input, options);
}

Tensor adaptive_avg_pool2d(const Tensor& input, std::array<int64_t, 2> output_size) {
  const char* name = "adaptive_avg_pool2d";
  kernels::Pool2dGeometry g = make_geometry(name, input);
  MPIGRAD_CHECK(output_size[0] >= 1 && output_size[1] >= 1, name,
                ": output size must be >= 1, got ", output_size[0], "x", output_size[1]);
  g.out_h = output_size[0];
  g.out_w = output_size[1];
  Tensor x;
  {
    core::NoGradGuard no_grad;
    x = input.contiguous();
  }
  Tensor out = core::detail::empty_on(output_shape(input, g), input.dtype(), input.device());
  // On CUDA the adaptive pooling is cuDNN's plain average pooling, which it equals when the
  // output size divides the input size (the common 1x1 global pooling included).
  kernels::Pool2dGeometry window = g;
  const bool cuda = input.device().is_cuda();
  if (cuda) {
    MPIGRAD_CHECK(g.height % g.out_h == 0 && g.width % g.out_w == 0, name,
                  ": on CUDA the input size must be a multiple of the output size, got input ",
                  g.height, "x", g.width, " and output ", g.out_h, "x", g.out_w);
    window.kernel_h = window.stride_h = g.height / g.out_h;
    window.kernel_w = window.stride_w = g.width / g.out_w;
    pool_forward_cuda(CudaPool::AvgIncludePad, window, x, out);
  } else {
    kernels::cpu::adaptive_avg_pool2d_forward(x.dtype(), g, x.data_ptr(), out.data_ptr());
  }
  if (auto node = core::detail::record<Pool2dBackward>(out, {&input}, PoolKind::AdaptiveAvg)) {
    node->geometry = g;
    node->input_shape = input.shape();
    node->cuda = cuda;
    node->cuda_mode = CudaPool::AvgIncludePad;
    node->cuda_geometry = window;
  }
  return out;
}

}  // namespace mpigrad::nn::functional
