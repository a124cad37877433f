#include "mpigrad/nn/functional/conv.h"

#include <atomic>

#include "mpigrad/core/autocast.h"
#include "mpigrad/core/autograd.h"
#include "mpigrad/core/backend.h"
#include "mpigrad/core/ops/op_support.h"
#include "mpigrad/core/ops/reduce.h"

namespace mpigrad::nn::functional {

using core::Tensor;

namespace {

core::Conv2dShape make_shape(const Tensor& input, const Tensor& weight, const Conv2dOptions& o) {
  MPIGRAD_CHECK(input.dim() == 4, "conv2d: input must be 4-d NCHW, got shape ", input.shape());
  MPIGRAD_CHECK(weight.dim() == 4, "conv2d: weight must be 4-d [out, in/groups, kh, kw], got ",
                weight.shape());
  MPIGRAD_CHECK(o.groups >= 1, "conv2d: groups must be >= 1, got ", o.groups);
  for (int i = 0; i < 2; ++i) {
    MPIGRAD_CHECK(o.stride[i] >= 1 && o.dilation[i] >= 1 && o.padding[i] >= 0,
                  "conv2d: stride and dilation must be >= 1 and padding >= 0");
  }
  core::Conv2dShape p;
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
  return p;
}

// Both convolution backwards compute the weight's and the bias's gradients first and hand them
// over before the input's (core/autograd.h, "Early gradients"), so a DDP bucket holding them
// starts while the data gradient, as costly a pass, is computed.
void release_weight_gradients_early(const core::Node& node, std::vector<Tensor>& grads) {
  for (size_t i = 1; i < grads.size(); ++i) core::release_gradient_early(node, grads, i);
}

// The convolution family for derivatives of any order (each saves its operands dense, and its
// backward lets them stand in for its inputs, core::stand_in): C(X, W) the convolution itself (no
// bias), D(G, W) its data gradient (a transposed convolution) and F(X, G) its filter gradient, all
// for one Conv2dShape. Each is bilinear, and the derivatives of each are the others:
//   C(X, W), upstream G:  dX = D(G, W),  dW = F(X, G)
//   D(G, W), upstream H:  dG = C(H, W),  dW = F(H, G)
//   F(X, G), upstream K:  dX = D(G, K),  dG = C(X, K)
// so a backward with create_graph computes convolution gradients as these ops, and they record
// a graph of their own.
Tensor convolve(const Tensor& x, const Tensor& w, const core::Conv2dShape& shape);
Tensor convolve_data_grad(const Tensor& g, const Tensor& w, const core::Conv2dShape& shape);
Tensor convolve_filter_grad(const Tensor& x, const Tensor& g, const core::Conv2dShape& shape);

struct Conv2dBackward final : core::Node {
  core::Conv2dShape shape;
  core::SavedTensor input, weight;
  bool has_bias = false;
  const char* name() const override { return "Conv2dBackward"; }
  bool differentiable_backward() const override { return true; }
  void apply(const Tensor& grad_output, std::vector<Tensor>& grads) override {
    const Tensor x = input.get(*this);
    const Tensor w = weight.get(*this);
    if (core::grad_enabled()) {
      // create_graph: the family's ops, on the saved operands standing in for the inputs.
      if (next[1]) grads[1] = convolve_filter_grad(core::stand_in(x, next[0]), grad_output, shape);
      if (has_bias && next[2]) grads[2] = core::sum(grad_output, {0, 2, 3});
      if (next[0]) grads[0] = convolve_data_grad(grad_output, core::stand_in(w, next[1]), shape);
      return;
    }
    Tensor g = grad_output.contiguous();
    auto& backend = core::backend_for(x.device());
    const bool bias_wanted = has_bias && next[2];
    if (next[1]) {
      // The bias's gradient from the filter gradient's pass where the backend fuses them.
      Tensor grad_weight = core::detail::empty_on(w.shape(), w.dtype(), w.device());
      Tensor grad_bias = bias_wanted
                             ? core::detail::empty_on({shape.out_channels}, x.dtype(), x.device())
                             : Tensor();
      const bool fused = backend.conv2d_backward_filter_bias(
          x.dtype(), shape, x.data_ptr(), g.data_ptr(), grad_weight.data_ptr(),
          bias_wanted ? grad_bias.data_ptr() : nullptr);
      grads[1] = grad_weight;
      if (fused) grads[2] = grad_bias;
    }
    if (bias_wanted && !grads[2].defined()) grads[2] = core::sum(g, {0, 2, 3});
    if (next[0]) {
      release_weight_gradients_early(*this, grads);
      Tensor grad_input = core::detail::empty_on(x.shape(), x.dtype(), x.device());
      backend.conv2d_backward_data(x.dtype(), shape, g.data_ptr(), w.data_ptr(),
                                   grad_input.data_ptr());
      grads[0] = grad_input;
    }
  }
  void release_saved() override {
    input.release();
    weight.release();
  }
};

// The autocast convolution's backward (core/autocast.h): both passes from the 16-bit input and
// weight the forward kept, with the incoming gradient cast to 16 bits too, into float32.
struct MixedConv2dBackward final : core::Node {
  core::Conv2dShape shape;
  Tensor input_low, weight_low;
  bool has_bias = false;
  const char* name() const override { return "MixedConv2dBackward"; }
  bool differentiable_backward() const override { return true; }
  void apply(const Tensor& grad_output, std::vector<Tensor>& grads) override {
    if (core::grad_enabled()) {
      // create_graph: float32 ops of the family, the 16-bit operands standing in for the inputs.
      Tensor x32, w32;
      {
        core::NoGradGuard no_grad;
        x32 = input_low.detach().to(core::kFloat32);
        w32 = weight_low.detach().to(core::kFloat32);
      }
      Tensor g = grad_output.to(core::kFloat32);
      if (next[1]) grads[1] = convolve_filter_grad(core::stand_in(x32, next[0]), g, shape);
      if (has_bias && next[2]) grads[2] = core::sum(grad_output, {0, 2, 3});
      if (next[0]) grads[0] = convolve_data_grad(g, core::stand_in(w32, next[1]), shape);
      return;
    }
    const core::DType low = input_low.dtype();
    Tensor g = core::detail::copy_as(grad_output, low);
    auto& backend = core::backend_for(input_low.device());
    if (next[1]) {
      Tensor grad_weight =
          core::detail::empty_on(weight_low.shape(), core::kFloat32, weight_low.device());
      backend.conv2d_backward_filter_mixed(low, shape, input_low.data_ptr(), g.data_ptr(),
                                           grad_weight.data<float>());
      grads[1] = grad_weight;
    }
    if (has_bias && next[2]) grads[2] = core::sum(grad_output, {0, 2, 3});
    if (next[0]) {
      release_weight_gradients_early(*this, grads);
      Tensor grad_input =
          core::detail::empty_on(input_low.shape(), core::kFloat32, input_low.device());
      backend.conv2d_backward_data_mixed(low, shape, g.data_ptr(), weight_low.data_ptr(),
                                         grad_input.data<float>());
      grads[0] = grad_input;
    }
  }
  void release_saved() override {
    input_low = Tensor();
    weight_low = Tensor();
  }
};

// D(G, W)'s backward: dG = C(H, W), dW = F(H, G).
struct ConvDataGradBackward final : core::Node {
  core::Conv2dShape shape;
  core::SavedTensor grad, weight;
  const char* name() const override { return "Conv2dDataGradBackward"; }
  bool differentiable_backward() const override { return true; }
  // The saved operands stand in for the inputs (their edges), so each product records a graph.
  void apply(const Tensor& upstream, std::vector<Tensor>& grads) override {
    if (next[0]) grads[0] = convolve(upstream, core::stand_in(weight.get(*this), next[1]), shape);
    if (next[1]) {
      grads[1] = convolve_filter_grad(upstream, core::stand_in(grad.get(*this), next[0]), shape);
    }
  }
  void release_saved() override {
    grad.release();
    weight.release();
  }
};

// F(X, G)'s backward: dX = D(G, K), dG = C(X, K).
struct ConvFilterGradBackward final : core::Node {
  core::Conv2dShape shape;
  core::SavedTensor input, grad;
  const char* name() const override { return "Conv2dFilterGradBackward"; }
  bool differentiable_backward() const override { return true; }
  void apply(const Tensor& upstream, std::vector<Tensor>& grads) override {
    if (next[0]) {
      grads[0] = convolve_data_grad(core::stand_in(grad.get(*this), next[1]), upstream, shape);
    }
    if (next[1]) grads[1] = convolve(core::stand_in(input.get(*this), next[0]), upstream, shape);
  }
  void release_saved() override {
    input.release();
    grad.release();
  }
};

Tensor dense(const Tensor& t) {
  core::NoGradGuard no_grad;
  return t.contiguous();
}

Tensor convolve(const Tensor& x_in, const Tensor& w_in, const core::Conv2dShape& shape) {
  const Tensor x = dense(x_in), w = dense(w_in);
  Tensor out = core::detail::empty_on(
      {shape.batch, shape.out_channels, shape.geometry.out_h, shape.geometry.out_w}, x.dtype(),
      x.device());
  core::backend_for(x.device())
      .conv2d_forward(x.dtype(), shape, x.data_ptr(), w.data_ptr(), out.data_ptr());
  const Tensor no_bias;
  if (auto node = core::detail::record<Conv2dBackward>(out, {&x_in, &w_in, &no_bias})) {
    node->shape = shape;
    node->input = core::SavedTensor(x);
    node->weight = core::SavedTensor(w);
  }
  return out;
}

Tensor convolve_data_grad(const Tensor& g_in, const Tensor& w_in, const core::Conv2dShape& shape) {
  const Tensor g = dense(g_in), w = dense(w_in);
  const auto& geometry = shape.geometry;
  Tensor out = core::detail::empty_on(
      {shape.batch, geometry.channels, geometry.height, geometry.width}, g.dtype(), g.device());
  core::backend_for(g.device())
      .conv2d_backward_data(g.dtype(), shape, g.data_ptr(), w.data_ptr(), out.data_ptr());
  if (auto node = core::detail::record<ConvDataGradBackward>(out, {&g_in, &w_in})) {
    node->shape = shape;
    node->grad = core::SavedTensor(g);
    node->weight = core::SavedTensor(w);
  }
  return out;
}

Tensor convolve_filter_grad(const Tensor& x_in, const Tensor& g_in,
                            const core::Conv2dShape& shape) {
  const Tensor x = dense(x_in), g = dense(g_in);
  const auto& geometry = shape.geometry;
  Tensor out = core::detail::empty_on(
      {shape.out_channels, geometry.channels / shape.groups, geometry.kernel_h, geometry.kernel_w},
      x.dtype(), x.device());
  core::backend_for(x.device())
      .conv2d_backward_filter(x.dtype(), shape, x.data_ptr(), g.data_ptr(), out.data_ptr());
  if (auto node = core::detail::record<ConvFilterGradBackward>(out, {&x_in, &g_in})) {
    node->shape = shape;
    node->input = core::SavedTensor(x);
    node->grad = core::SavedTensor(g);
  }
  return out;
}

std::atomic<bool>& drop_padding_taps() {
  static std::atomic<bool> drop{true};
  return drop;
}

}  // namespace

bool set_conv2d_drop_padding_taps(bool drop) {
  return drop_padding_taps().exchange(drop);
}

UsedTaps used_taps(int64_t size, int64_t kernel, int64_t stride, int64_t padding,
                   int64_t dilation) {
  const UsedTaps all{0, kernel, padding};
  if (size < 1 || kernel < 1 || stride < 1 || dilation < 1 || padding < 0) return all;
  const int64_t span = size + 2 * padding - dilation * (kernel - 1) - 1;
  if (span < 0) return all;
  const int64_t out = span / stride + 1;
  // Whether `tap` reads a row of the image at some output position: its row at output o is
  // o * stride + tap * dilation - padding.
  auto reads_image = [&](int64_t tap) {
    const int64_t at_first = tap * dilation - padding;
    const int64_t o = at_first >= 0 ? 0 : (-at_first + stride - 1) / stride;
    return o < out && o * stride + at_first < size;
  };
  int64_t first = 0, last = kernel - 1;
  while (first < kernel && !reads_image(first)) ++first;
  if (first == kernel) return all;  // every tap on padding: the output is the bias alone
  while (!reads_image(last)) --last;
  const int64_t count = last - first + 1, kept = padding - first * dilation;
  if (count == kernel || kept < 0) return all;
  // The same output positions with `kept` on both sides (the right side may keep more padding
  // than it needs; those rows are zeros either way).
  const int64_t kept_span = size + 2 * kept - dilation * (count - 1) - 1;
  if (kept_span < 0 || kept_span / stride + 1 != out) return all;
  return {first, count, kept};
}

Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias,
              const Conv2dOptions& options) {
  MPIGRAD_CHECK(input.defined() && weight.defined(), "conv2d: undefined input or weight");
  // The bias too: the convolution reads it by pointer (Backend::conv2d_forward_bias).
  core::detail::check_same_device("conv2d", {&input, &weight, &bias});
  MPIGRAD_CHECK(input.dtype() == weight.dtype() &&
                    (input.dtype() == core::kFloat32 || input.dtype() == core::kFloat64),
                "conv2d: input and weight must both be float32 or float64, got ", input.dtype(),
                " and ", weight.dtype());
  const core::Conv2dShape p = make_shape(input, weight, options);
  if (bias.defined()) {
    MPIGRAD_CHECK(bias.dim() == 1 && bias.shape()[0] == p.out_channels,
                  "conv2d: bias must have shape [", p.out_channels, "], got ", bias.shape());
    MPIGRAD_CHECK(bias.dtype() == input.dtype(), "conv2d: bias dtype ", bias.dtype(),
                  " differs from input dtype ", input.dtype());
  }
  const auto& g = p.geometry;
  const UsedTaps rows = used_taps(g.height, g.kernel_h, g.stride_h, g.pad_h, g.dilation_h);
  const UsedTaps cols = used_taps(g.width, g.kernel_w, g.stride_w, g.pad_w, g.dilation_w);
  if ((rows.count < g.kernel_h || cols.count < g.kernel_w) && drop_padding_taps().load()) {
    // Taps that see only padding dropped (conv.h): the narrowed weight is a view, so the
    // gradient reaches the whole weight, zeros at the dropped taps.
    Conv2dOptions used = options;
    used.padding = {rows.padding, cols.padding};
    const auto& ws = weight.shape();
    Tensor w;
    if (rows.count == 1 || cols.count == g.kernel_w) {
      // The kept taps are one run of the flattened kernel: one view, one window in the
      // gradient's zeros (the centre of a 3x3 kernel on a 1x1 image).
      const int64_t first = rows.first * g.kernel_w + cols.first;
      const int64_t count = rows.count == 1 ? cols.count : rows.count * g.kernel_w;
      w = weight.reshape({ws[0], ws[1], g.kernel_h * g.kernel_w})
              .narrow(2, first, count)
              .reshape({ws[0], ws[1], rows.count, cols.count});
    } else {
      w = weight.narrow(2, rows.first, rows.count).narrow(3, cols.first, cols.count);
    }
    // Dense before anything else reads it: under autocast the 16-bit cast of a strided view is an
    // element walk, 4% of ResNet-50's bf16 step; a dense float32 copy, then a vector cast.
    return conv2d(input, w.contiguous(), bias, used);
  }
  const std::optional<core::DType> low = core::autocast_dtype_for("conv2d", {&input, &weight});
  Tensor x, w, b;
  {
    core::NoGradGuard no_grad;
    x = low ? core::autocast_operand(input, *low) : input.contiguous();
    w = low ? core::autocast_operand(weight, *low) : weight.contiguous();
    // The bias stays in the output's dtype (float32 under autocast) and is added by the
    // convolution's own pass (Backend::conv2d_forward_bias).
    if (bias.defined()) b = bias.detach().contiguous();
  }
  Tensor out = core::detail::empty_on({p.batch, p.out_channels, p.geometry.out_h, p.geometry.out_w},
                                      input.dtype(), input.device());
  auto& backend = core::backend_for(input.device());
  if (low) {
    backend.conv2d_forward_mixed_bias(*low, p, x.data_ptr(), w.data_ptr(),
                                      b.defined() ? b.data<float>() : nullptr, out.data<float>());
  } else {
    backend.conv2d_forward_bias(input.dtype(), p, x.data_ptr(), w.data_ptr(),
                                b.defined() ? b.data_ptr() : nullptr, out.data_ptr());
  }
  if (low) {
    if (auto node = core::detail::record<MixedConv2dBackward>(out, {&input, &weight, &bias})) {
      node->shape = p;
      node->input_low = x;
      node->weight_low = w;
      node->has_bias = bias.defined();
    }
  } else if (auto node = core::detail::record<Conv2dBackward>(out, {&input, &weight, &bias})) {
    node->shape = p;
    node->input = core::SavedTensor(x);
    node->weight = core::SavedTensor(w);
    node->has_bias = bias.defined();
  }
  return out;
}

}  // namespace mpigrad::nn::functional
