#include "mpigrad/nn/functional/pooling.h"

#include <span>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/backend.h"
#include "mpigrad/core/enum_names.h"
#include "mpigrad/core/ops/indexing.h"
#include "mpigrad/core/ops/op_support.h"
#include "mpigrad/core/profiler.h"
#include "mpigrad/kernels/pooling.h"

namespace mpigrad::nn::functional {

using core::Tensor;

namespace {

enum class PoolKind { Max, Avg, AdaptiveAvg };

// The op's name in messages, and the name of its backward node.
constexpr core::EnumName<PoolKind> kPoolNames[] = {{PoolKind::Max, "max_pool2d"},
                                                   {PoolKind::Avg, "avg_pool2d"},
                                                   {PoolKind::AdaptiveAvg, "adaptive_avg_pool2d"}};
constexpr core::EnumName<PoolKind> kPoolBackwardNames[] = {
    {PoolKind::Max, "MaxPool2dBackward"},
    {PoolKind::Avg, "AvgPool2dBackward"},
    {PoolKind::AdaptiveAvg, "AdaptiveAvgPool2dBackward"}};

// Every spelling in the tables is a string literal, so the view is null-terminated.
const char* pool_name(PoolKind kind, std::span<const core::EnumName<PoolKind>> names = kPoolNames) {
  return core::enum_name(kind, names).data();
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

const void* data_or_null(const Tensor& t) {
  return t.defined() ? t.data_ptr() : nullptr;
}

Tensor run_pool(PoolKind kind, core::Pool2dMode mode, const Tensor& input,
                const kernels::Pool2dGeometry& g);
Tensor average_input_grad(PoolKind kind, core::Pool2dMode mode, const kernels::Pool2dGeometry& g,
                          const core::Shape& input_shape, const Tensor& grad);

// Max pooling's winners, per output element the flat h*width+w in its plane, for a backward
// with create_graph. The CPU records each winner's tap in its window in forward; cuDNN keeps none,
// so they are found again on the CPU from the input. Either way the CPU kernel turns the taps
// into flat positions (kernels/pooling.h), on the host: this path is rare and small.
Tensor max_pool_winners(const Tensor& recorded, const Tensor& input,
                        const kernels::Pool2dGeometry& g) {
  core::NoGradGuard no_grad;
  const int64_t outputs = g.planes * g.out_h * g.out_w;
  Tensor taps = recorded.defined() && recorded.numel() > 0 ? recorded.to(core::kCPU) : Tensor();
  if (!taps.defined()) {
    auto& cpu = core::backend_for(core::kCPU);
    const Tensor x = input.to(core::kCPU).contiguous();
    Tensor pooled = core::detail::empty_on({outputs}, x.dtype(), core::kCPU);
    taps = core::detail::empty_on({outputs}, cpu.max_pool2d_indices(g).dtype, core::kCPU);
    cpu.pool2d_forward(core::Pool2dMode::Max, x.dtype(), g, x.data_ptr(), pooled.data_ptr(),
                       taps.data_ptr());
  }
  MPIGRAD_CHECK(taps.numel() == outputs && taps.dtype() == kernels::cpu::max_pool2d_tap_dtype(g),
                "max_pool2d: recorded winners of ", taps.dtype(), " ", taps.shape(),
                " do not fit the geometry's ", outputs, " outputs");
  Tensor winners = core::detail::empty_on({outputs}, core::kInt64, core::kCPU);
  kernels::cpu::max_pool2d_flat_indices(g, taps.data_ptr(), winners.data<int64_t>());
  return winners.to(input.device());
}

struct Pool2dBackward final : core::Node {
  PoolKind kind;
  core::Pool2dMode mode = core::Pool2dMode::Max;
  kernels::Pool2dGeometry geometry;
  core::Shape input_shape;
  // Max pooling: what the backend's backward reads, detached (nobody else sees them as autograd
  // tensors): the winners it recorded, and the input and output it finds them again from.
  Tensor indices, input, output;
  explicit Pool2dBackward(PoolKind kind_) : kind(kind_) {}
  const char* name() const override { return pool_name(kind, kPoolBackwardNames); }
  bool differentiable_backward() const override { return true; }
  void apply(const Tensor& grad_output, std::vector<Tensor>& grads) override {
    if (core::grad_enabled()) {
      // create_graph: ops that record a graph. Max pooling adds each output's gradient to its
      // winner (a scatter, whose gradient gathers); averaging is linear in the gradient.
      if (kind == PoolKind::Max) {
        const int64_t planes = geometry.planes;
        const Tensor winners = max_pool_winners(indices, input, geometry).reshape({planes, -1});
        Tensor base =
            core::zeros({planes, geometry.height * geometry.width},
                        core::TensorOptions(grad_output.dtype()).device(grad_output.device()));
        grads[0] = core::scatter_add(base, 1, winners, grad_output.reshape({planes, -1}))
                       .reshape(input_shape);
      } else {
        grads[0] = average_input_grad(kind, mode, geometry, input_shape, grad_output);
      }
      return;
    }
    Tensor g = grad_output.contiguous();
    Tensor grad_in = core::detail::empty_on(input_shape, g.dtype(), g.device());
    core::backend_for(g.device())
        .pool2d_backward(mode, g.dtype(), geometry, data_or_null(input), data_or_null(output),
                         data_or_null(indices), g.data_ptr(), grad_in.data_ptr());
    grads[0] = grad_in;
  }
  void release_saved() override {
    indices = Tensor();
    input = Tensor();
    output = Tensor();
  }
};

// The input gradient of an average pooling, which is linear in the gradient, as an op that records
// a graph: its own gradient is the pooling of the incoming one.
struct AverageInputGradBackward final : core::Node {
  PoolKind kind;
  core::Pool2dMode mode;
  kernels::Pool2dGeometry geometry;
  AverageInputGradBackward(PoolKind kind_, core::Pool2dMode mode_, kernels::Pool2dGeometry g)
      : kind(kind_), mode(mode_), geometry(g) {}
  const char* name() const override { return "AvgPool2dInputGradBackward"; }
  bool differentiable_backward() const override { return true; }
  void apply(const Tensor& upstream, std::vector<Tensor>& grads) override {
    grads[0] = run_pool(kind, mode, upstream, geometry);
  }
};

Tensor average_input_grad(PoolKind kind, core::Pool2dMode mode, const kernels::Pool2dGeometry& g,
                          const core::Shape& input_shape, const Tensor& grad) {
  Tensor dense;
  {
    core::NoGradGuard no_grad;
    dense = grad.contiguous();
  }
  Tensor out = core::detail::empty_on(input_shape, grad.dtype(), grad.device());
  core::backend_for(grad.device())
      .pool2d_backward(mode, grad.dtype(), g, nullptr, nullptr, nullptr, dense.data_ptr(),
                       out.data_ptr());
  core::detail::record<AverageInputGradBackward>(out, {&grad}, kind, mode, g);
  return out;
}

// Runs `mode` on the input's backend and records the backward.
Tensor run_pool(PoolKind kind, core::Pool2dMode mode, const Tensor& input,
                const kernels::Pool2dGeometry& g) {
  core::ProfileSpan span(pool_name(kind));
  Tensor x;
  {
    core::NoGradGuard no_grad;
    x = input.contiguous();
  }
  Tensor out = core::detail::empty_on(output_shape(input, g), input.dtype(), input.device());
  auto& backend = core::backend_for(input.device());
  Tensor indices;
  if (mode == core::Pool2dMode::Max) {
    const core::Backend::MaxPoolIndices record = backend.max_pool2d_indices(g);
    indices = core::detail::empty_on({record.count}, record.dtype, input.device());
  }
  backend.pool2d_forward(mode, x.dtype(), g, x.data_ptr(), out.data_ptr(),
                         indices.defined() ? indices.data_ptr() : nullptr);
  if (auto node = core::detail::record<Pool2dBackward>(out, {&input}, kind)) {
    node->mode = mode;
    node->geometry = g;
    node->input_shape = input.shape();
    if (mode == core::Pool2dMode::Max) {
      node->indices = indices;
      node->input = x.detach();
      node->output = out.detach();
    }
  }
  return out;
}

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
  MPIGRAD_CHECK(
      g.pad_h >= 0 && g.pad_w >= 0 && 2 * g.pad_h <= g.kernel_h && 2 * g.pad_w <= g.kernel_w, name,
      ": padding must be >= 0 and at most half the kernel size, got ", g.pad_h, "x", g.pad_w,
      " for kernel ", g.kernel_h, "x", g.kernel_w);
  // The padded input must hold one whole (dilated) window: C++ division truncates toward zero,
  // so a span one too long would still give one output, whose window reads past the plane.
  const int64_t rows = g.height + 2 * g.pad_h - g.dilation_h * (g.kernel_h - 1) - 1;
  const int64_t cols = g.width + 2 * g.pad_w - g.dilation_w * (g.kernel_w - 1) - 1;
  MPIGRAD_CHECK(rows >= 0 && cols >= 0, name, ": input of shape ", input.shape(),
                " is too small for kernel ", g.kernel_h, "x", g.kernel_w);
  g.out_h = rows / g.stride_h + 1;
  g.out_w = cols / g.stride_w + 1;
  const core::Pool2dMode mode = kind == PoolKind::Max ? core::Pool2dMode::Max
                                : o.count_include_pad ? core::Pool2dMode::AvgIncludePad
                                                      : core::Pool2dMode::AvgExcludePad;
  return run_pool(kind, mode, input, g);
}

}  // namespace

Tensor max_pool2d(const Tensor& input, const Pool2dOptions& options) {
  return windowed_pool(PoolKind::Max, input, options);
}

Tensor avg_pool2d(const Tensor& input, const Pool2dOptions& options) {
  return windowed_pool(PoolKind::Avg, input, options);
}

Tensor adaptive_avg_pool2d(const Tensor& input, std::array<int64_t, 2> output_size) {
  const char* name = pool_name(PoolKind::AdaptiveAvg);
  kernels::Pool2dGeometry g = make_geometry(name, input);
  MPIGRAD_CHECK(output_size[0] >= 1 && output_size[1] >= 1, name,
                ": output size must be >= 1, got ", output_size[0], "x", output_size[1]);
  g.out_h = output_size[0];
  g.out_w = output_size[1];
  return run_pool(PoolKind::AdaptiveAvg, core::Pool2dMode::AdaptiveAvg, input, g);
}

}  // namespace mpigrad::nn::functional
