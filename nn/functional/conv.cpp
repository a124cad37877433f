#include "mpigrad/nn/functional/conv.h"

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/backend.h"
#include "mpigrad/core/ops/op_support.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/kernels/conv.h"
#if defined(MPIGRAD_WITH_CUDA)
#include "mpigrad/nn/cuda/cuda_ops.h"
#endif

namespace mpigrad::nn::functional {

using core::Tensor;

namespace {

// Everything the forward and backward passes share about one convolution.
struct ConvPlan {
  kernels::Conv2dGeometry geometry;  // of the whole image (all channels)
  int64_t batch = 0, out_channels = 0, groups = 1;
  int64_t group_in = 0, group_out = 0;  // channels per group
  int64_t patch = 0;                     // group_in * kh * kw: rows of a group's columns
  int64_t out_area = 0;
  bool direct = false;  // 1x1, stride 1, no padding: the image already is its column matrix
};

ConvPlan make_plan(const Tensor& input, const Tensor& weight, const Conv2dOptions& o) {
  MPIGRAD_CHECK(input.dim() == 4, "conv2d: input must be 4-d NCHW, got shape ", input.shape());
  MPIGRAD_CHECK(weight.dim() == 4, "conv2d: weight must be 4-d [out, in/groups, kh, kw], got ",
                weight.shape());
  MPIGRAD_CHECK(o.groups >= 1, "conv2d: groups must be >= 1, got ", o.groups);
  for (int i = 0; i < 2; ++i) {
    MPIGRAD_CHECK(o.stride[i] >= 1 && o.dilation[i] >= 1 && o.padding[i] >= 0,
                  "conv2d: stride and dilation must be >= 1 and padding >= 0");
  }
  ConvPlan p;
  const auto& s = input.shape();
  const auto& w = weight.shape();
  p.batch = s[0];
  p.groups = o.groups;
  p.out_channels = w[0];
  MPIGRAD_CHECK(s[1] % o.groups == 0 && w[0] % o.groups == 0, "conv2d: in_channels ", s[1],
                " and out_channels ", w[0], " must both be divisible by groups ", o.groups);
  MPIGRAD_CHECK(w[1] * o.groups == s[1], "conv2d: weight of shape ", w, " with groups ", o.groups,
                " expects ", w[1] * o.groups, " input channels, input has shape ", s);
  auto& g = p.geometry;
  g.channels = s[1];
  g.height = s[2];
  g.width = s[3];
  g.kernel_h = w[2];
  g.kernel_w = w[3];
  g.stride_h = o.stride[0];
  g.stride_w = o.stride[1];
  g.pad_h = o.padding[0];
  g.pad_w = o.padding[1];
  g.dilation_h = o.dilation[0];
  g.dilation_w = o.dilation[1];
  g.out_h = (g.height + 2 * g.pad_h - g.dilation_h * (g.kernel_h - 1) - 1) / g.stride_h + 1;
  g.out_w = (g.width + 2 * g.pad_w - g.dilation_w * (g.kernel_w - 1) - 1) / g.stride_w + 1;
  MPIGRAD_CHECK(g.out_h > 0 && g.out_w > 0, "conv2d: input of shape ", s, " is smaller than the ",
                "dilated kernel ", w, " (with padding ", g.pad_h, "x", g.pad_w, ")");
  p.group_in = s[1] / o.groups;
  p.group_out = w[0] / o.groups;
  p.patch = p.group_in * g.kernel_h * g.kernel_w;
  p.out_area = g.out_h * g.out_w;
  p.direct = g.kernel_h == 1 && g.kernel_w == 1 && g.stride_h == 1 && g.stride_w == 1 &&
             g.pad_h == 0 && g.pad_w == 0;
  return p;
}

// The CUDA paths (cuDNN, nn/cuda/cudnn_conv.cpp). Each computes one of y, grad_x, grad_w.
enum class CudaConv { Forward, BackwardData, BackwardFilter };

void conv_cuda(CudaConv which, const ConvPlan& p, const Tensor& a, const Tensor& b, Tensor& out) {
#if defined(MPIGRAD_WITH_CUDA)
  cuda_ops::ConvShape shape;
  shape.geometry = p.geometry;
  shape.batch = p.batch;
  shape.out_channels = p.out_channels;
  shape.groups = p.groups;
  switch (which) {
    case CudaConv::Forward: return cuda_ops::conv2d_forward(shape, a, b, out);
    case CudaConv::BackwardData: return cuda_ops::conv2d_backward_data(shape, a, b, out);
    case CudaConv::BackwardFilter: return cuda_ops::conv2d_backward_filter(shape, a, b, out);
  }
#else
  (void)which, (void)p, (void)a, (void)b, (void)out;
  core::fail("conv2d: this libmpigrad has no CUDA backend");
#endif
}

// The column matrix of image n: a pointer into the input itself (direct) or into `columns`.
const void* columns_of(const ConvPlan& p, const Tensor& x, int64_t n, Tensor& columns) {
  const char* image = static_cast<const char*>(x.data_ptr()) +
                      n * p.geometry.channels * p.geometry.height * p.geometry.width *
                          x.element_size();
  if (p.direct) return image;
  kernels::cpu::im2col(x.dtype(), p.geometry, image, columns.data_ptr());
  return columns.data_ptr();
}

char* image_ptr(const Tensor& t, int64_t n) {
  return static_cast<char*>(t.data_ptr()) + n * (t.numel() / t.shape()[0]) * t.element_size();
}

struct Conv2dBackward final : core::Node {
  ConvPlan plan;
  core::SavedTensor input, weight;
  bool has_bias = false;
  const char* name() const override { return "Conv2dBackward"; }
  void apply(const Tensor& grad_output, std::vector<Tensor>& grads) override {
    const Tensor& x = input.get(*this);
    const Tensor& w = weight.get(*this);
    const ConvPlan& p = plan;
    Tensor g = grad_output.contiguous();
    if (x.device().is_cuda() && p.batch == 0) {
      if (next[0]) grads[0] = core::zeros(x.shape(), core::TensorOptions(x.dtype()).device(x.device()));
      if (next[1]) grads[1] = core::zeros(w.shape(), core::TensorOptions(w.dtype()).device(w.device()));
      if (has_bias && next[2]) grads[2] = core::sum(g, {0, 2, 3});
      return;
    }
    if (x.device().is_cuda()) {
      if (next[0]) {
        Tensor grad_input = core::detail::empty_on(x.shape(), x.dtype(), x.device());
        conv_cuda(CudaConv::BackwardData, p, g, w, grad_input);
        grads[0] = grad_input;
      }
      if (next[1]) {
        Tensor grad_weight = core::detail::empty_on(w.shape(), w.dtype(), w.device());
        conv_cuda(CudaConv::BackwardFilter, p, x, g, grad_weight);
        grads[1] = grad_weight;
      }
      if (has_bias && next[2]) grads[2] = core::sum(g, {0, 2, 3});
      return;
    }
    auto& backend = core::backend_for(x.device());
    const int64_t rows = p.geometry.channels * p.geometry.kernel_h * p.geometry.kernel_w;
    Tensor columns = core::detail::empty_on({p.direct ? 1 : rows, p.direct ? 1 : p.out_area},
                                            x.dtype(), x.device());
    if (next[0]) {
      Tensor grad_input = core::zeros(x.shape(), core::TensorOptions(x.dtype()).device(x.device()));
      // columns = W^T g[n], one GEMM per group; then scatter the columns onto the image.
      kernels::GemmShape shape;
      shape.transpose_a = true;
      shape.m = p.patch;
      shape.n = p.out_area;
      shape.k = p.group_out;
      shape.lda = p.patch;
      shape.ldb = p.out_area;
      shape.ldc = p.out_area;
      shape.batch = p.groups;
      shape.batch_stride_a = p.group_out * p.patch;
      shape.batch_stride_b = p.group_out * p.out_area;
      shape.batch_stride_c = p.patch * p.out_area;
      for (int64_t n = 0; n < p.batch; ++n) {
        void* target = p.direct ? image_ptr(grad_input, n) : columns.data_ptr();
        backend.gemm(x.dtype(), shape, 1.0, w.data_ptr(), image_ptr(g, n), 0.0, target);
        if (!p.direct) {
          kernels::cpu::col2im(x.dtype(), p.geometry, columns.data_ptr(), image_ptr(grad_input, n));
        }
      }
      grads[0] = grad_input;
    }
    if (next[1]) {
      Tensor grad_weight = core::detail::empty_on(w.shape(), w.dtype(), w.device());
      // dW[g] (+)= g[n][g] columns[g]^T
      kernels::GemmShape shape;
      shape.transpose_b = true;
      shape.m = p.group_out;
      shape.n = p.patch;
      shape.k = p.out_area;
      shape.lda = p.out_area;
      shape.ldb = p.out_area;
      shape.ldc = p.patch;
      shape.batch = p.groups;
      shape.batch_stride_a = p.group_out * p.out_area;
      shape.batch_stride_b = p.patch * p.out_area;
      shape.batch_stride_c = p.group_out * p.patch;
      for (int64_t n = 0; n < p.batch; ++n) {
        const void* cols = columns_of(p, x, n, columns);
        backend.gemm(x.dtype(), shape, 1.0, image_ptr(g, n), cols, n == 0 ? 0.0 : 1.0,
                     grad_weight.data_ptr());
      }
      if (p.batch == 0) grad_weight.zero_();
      grads[1] = grad_weight;
    }
    if (has_bias && next[2]) grads[2] = core::sum(g, {0, 2, 3});
  }
  void release_saved() override {
    input.release();
    weight.release();
  }
};

}  // namespace

Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias,
              const Conv2dOptions& options) {
  MPIGRAD_CHECK(input.defined() && weight.defined(), "conv2d: undefined input or weight");
  core::detail::check_same_device("conv2d", {&input, &weight});
  MPIGRAD_CHECK(input.dtype() == weight.dtype() &&
                    (input.dtype() == core::kFloat32 || input.dtype() == core::kFloat64),
                "conv2d: input and weight must both be float32 or float64, got ", input.dtype(),
                " and ", weight.dtype());
  const ConvPlan p = make_plan(input, weight, options);
  if (bias.defined()) {
    MPIGRAD_CHECK(bias.dim() == 1 && bias.shape()[0] == p.out_channels,
                  "conv2d: bias must have shape [", p.out_channels, "], got ", bias.shape());
    MPIGRAD_CHECK(bias.dtype() == input.dtype(), "conv2d: bias dtype ", bias.dtype(),
                  " differs from input dtype ", input.dtype());
  }
  Tensor x, w;
  {
    core::NoGradGuard no_grad;
    x = input.contiguous();
    w = weight.contiguous();
  }
  Tensor out = core::detail::empty_on({p.batch, p.out_channels, p.geometry.out_h, p.geometry.out_w},
                                      input.dtype(), input.device());
  auto& backend = core::backend_for(input.device());
  const int64_t rows = p.geometry.channels * p.geometry.kernel_h * p.geometry.kernel_w;
  const bool cuda = input.device().is_cuda();
  Tensor columns = cuda ? Tensor()
                        : core::detail::empty_on({p.direct ? 1 : rows, p.direct ? 1 : p.out_area},
                                                 input.dtype(), input.device());
  if (cuda && p.batch > 0) conv_cuda(CudaConv::Forward, p, x, w, out);
  // out[n][g] = W[g] columns[g], one GEMM per image over the groups.
  kernels::GemmShape shape;
  shape.m = p.group_out;
  shape.n = p.out_area;
  shape.k = p.patch;
  shape.lda = p.patch;
  shape.ldb = p.out_area;
  shape.ldc = p.out_area;
  shape.batch = p.groups;
  shape.batch_stride_a = p.group_out * p.patch;
  shape.batch_stride_b = p.patch * p.out_area;
  shape.batch_stride_c = p.group_out * p.out_area;
  for (int64_t n = 0; !cuda && n < p.batch; ++n) {
    const void* cols = columns_of(p, x, n, columns);
    backend.gemm(input.dtype(), shape, 1.0, w.data_ptr(), cols, 0.0, image_ptr(out, n));
  }
  if (bias.defined()) {
    core::NoGradGuard no_grad;
    out.add_(bias.detach().view({1, p.out_channels, 1, 1}));
  }
  if (auto node = core::detail::record<Conv2dBackward>(out, {&input, &weight, &bias})) {
    node->plan = p;
    node->input = core::SavedTensor(x);
    node->weight = core::SavedTensor(w);
    node->has_bias = bias.defined();
  }
  return out;
}

}  // namespace mpigrad::nn::functional
