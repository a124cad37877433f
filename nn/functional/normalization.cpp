#include "mpigrad/nn/functional/normalization.h"

#include <cmath>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/backend.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/indexing.h"
#include "mpigrad/core/ops/op_support.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/core/profiler.h"
#include "mpigrad/kernels/normalization.h"
#include "mpigrad/nn/functional/pooling.h"

namespace mpigrad::nn::functional {

using core::Tensor;

namespace {

void check_input(const char* name, const Tensor& input) {
  MPIGRAD_CHECK(input.defined(), name, ": undefined input");
  MPIGRAD_CHECK(input.dtype() == core::kFloat32 || input.dtype() == core::kFloat64, name,
                ": input must be float32 or float64, got ", input.dtype());
}

// The per-channel parameter `t` as a dense tensor of `dtype`, or an undefined tensor.
Tensor dense_vector(const char* name, const char* what, const Tensor& t, int64_t n,
                    core::DType dtype) {
  if (!t.defined()) return t;
  MPIGRAD_CHECK(t.numel() == n, name, ": ", what, " has ", t.numel(), " elements, expected ", n);
  core::NoGradGuard no_grad;
  return t.detach().to(dtype).contiguous().reshape({n});
}

// A normalization's operands as its kernels read them: the input dense (the copy its node saves)
// and the weight and bias as dense vectors of n elements in the input's dtype (undefined where
// absent).
struct DenseOperands {
  Tensor x, w, b;
};
DenseOperands dense_operands(const char* name, const Tensor& input, const Tensor& weight,
                             const Tensor& bias, int64_t n) {
  DenseOperands d;
  {
    core::NoGradGuard no_grad;
    d.x = input.contiguous();
  }
  d.w = dense_vector(name, "weight", weight, n, input.dtype());
  d.b = dense_vector(name, "bias", bias, n, input.dtype());
  return d;
}

const void* ptr_or_null(const Tensor& t) {
  return t.defined() ? t.data_ptr() : nullptr;
}

void* out_or_null(Tensor& t) {
  return t.defined() ? t.data_ptr() : nullptr;
}

// A normalization's gradients in ops that record a graph, for a backward with create_graph. x
// (with its history) is shaped so that the statistics over `dims` broadcast against it; the
// result's gradient g is shaped like x, and w (null: none) broadcasts like the statistics'
// complement. With x^ = (x - mean) r, r = 1/sqrt(var + eps), and g^ = g w:
//   dx = r (g^ - mean(g^) - x^ mean(g^ x^)),   dw = sum(g x^),   db = sum(g)
// with the statistics over `dims` and the parameters' sums over `param_dims` (batch norm: both
// over batch and space; layer norm: statistics per row, sums over rows). With the statistics given
// (`mean`, `r`: batch norm in eval mode, whose running statistics are constants), x^ uses them and
// dx = g^ r.
struct NormGradients {
  Tensor input, weight, bias;
};
NormGradients normalization_gradients(const Tensor& x, const Tensor& g, const Tensor& w,
                                      const std::vector<int64_t>& dims,
                                      const std::vector<int64_t>& param_dims, double eps,
                                      const Tensor& given_mean = Tensor(),
                                      const Tensor& given_r = Tensor()) {
  using namespace mpigrad::core;
  const bool given = given_mean.defined();
  Tensor centered = given ? sub(x, given_mean) : sub(x, mean(x, dims, /*keepdim=*/true));
  Tensor r =
      given
          ? given_r
          : rsqrt(add(mean(mul(centered, centered), dims, /*keepdim=*/true), scalar_like(eps, x)));
  Tensor normalized = mul(centered, r);
  Tensor scaled = w.defined() ? mul(g, w) : g;
  NormGradients out;
  if (given) {
    out.input = mul(scaled, r);
  } else {
    out.input = mul(r, sub(sub(scaled, mean(scaled, dims, true)),
                           mul(normalized, mean(mul(scaled, normalized), dims, true))));
  }
  out.weight = sum(mul(g, normalized), param_dims);
  out.bias = sum(g, param_dims);
  return out;
}

// A batch norm node's gradients in ops that record a graph, for a backward with create_graph:
// x and w (undefined: none) stand in for the node's inputs 0 and 1. With `relu_output` (the
// ReLU's output that followed, in training), the gradient first goes through the ReLU's
// create_graph backward: times its derivative, the constant mask relu_output > 0.
void batch_norm_graph_gradients(const core::Node& node, const Tensor& x, const Tensor& w,
                                const Tensor& relu_output, const Tensor& grad_output, bool training,
                                double eps, const Tensor& mean, const Tensor& invstd,
                                const core::Shape& per_channel, std::vector<Tensor>& grads) {
  const core::Shape broadcast{1, per_channel[1], 1};
  Tensor x3 = core::stand_in(x, node.next[0]).reshape(per_channel);
  Tensor w3 = w.defined() ? core::stand_in(w, node.next[1]).reshape(broadcast) : Tensor();
  Tensor g = relu_output.defined()
                 ? core::mul(grad_output,
                             core::gt(relu_output.detach(), core::scalar_like(0.0, grad_output))
                                 .to(grad_output.dtype()))
                 : grad_output;
  NormGradients d =
      training ? normalization_gradients(x3, g.reshape(per_channel), w3, {0, 2}, {0, 2}, eps)
               : normalization_gradients(x3, g.reshape(per_channel), w3, {0, 2}, {0, 2}, eps,
                                         mean.reshape(broadcast), invstd.reshape(broadcast));
  if (node.next[0]) grads[0] = d.input.reshape(x.shape());
  if (node.next[1]) grads[1] = d.weight;
  if (node.next[2]) grads[2] = d.bias;
}

// With `relu` (training only), the node is batch_norm_relu's: `output` is y = relu(batch norm),
// and the gradient reaching batch norm is grad_output where y > 0 and 0 elsewhere, as ReLU's
// backward gives it (y > 0 exactly where ReLU's input is).
struct BatchNormBackward final : core::Node {
  core::SavedTensor input, mean, invstd, weight, bias, output;  // bias, output: relu only
  bool training = true, has_weight = false, has_bias = false, relu = false;
  double eps = 1e-5;
  int64_t batch = 0, channels = 0, inner = 0;
  const char* name() const override { return relu ? "BatchNormReluBackward" : "BatchNormBackward"; }
  bool differentiable_backward() const override { return true; }
  void apply(const Tensor& grad_output, std::vector<Tensor>& grads) override {
    const Tensor x = input.get(*this);
    if (core::grad_enabled()) {
      Tensor relu_output = relu ? output.get(*this) : Tensor();
      batch_norm_graph_gradients(*this, x, has_weight ? weight.get(*this) : Tensor(), relu_output,
                                 grad_output, training, eps, mean.get(*this), invstd.get(*this),
                                 {batch, channels, inner}, grads);
      return;
    }
    Tensor g = grad_output.contiguous();
    Tensor w = has_weight ? weight.get(*this) : Tensor();
    Tensor b = has_bias ? bias.get(*this) : Tensor();
    Tensor grad_x;
    if (next[0]) {
      // The fused kernel may write grad_x over grad_y, so it takes the incoming buffer when
      // nothing else can see it (the engine's handle and g; no view), as AccumulateGrad adopts
      // one: that buffer was just written and is in cache, where a fresh block's every store
      // waits for its line to come from memory.
      const bool adopt = relu && g.dtype() == x.dtype() && g.numel() == x.numel() &&
                         core::is_exclusive_gradient(g);
      grad_x = adopt ? g.detach().reshape(x.shape())
                     : core::detail::empty_on(x.shape(), x.dtype(), x.device());
    }
    Tensor grad_w = next[1] ? core::detail::empty_on({channels}, x.dtype(), x.device()) : Tensor();
    Tensor grad_b = next[2] ? core::detail::empty_on({channels}, x.dtype(), x.device()) : Tensor();
    core::Backend& backend = core::backend_for(x.device());
    if (relu) {
      backend.batch_norm_relu_backward(
          x.dtype(), batch, channels, inner, x.data_ptr(), output.get(*this).data_ptr(),
          g.data_ptr(), mean.get(*this).data_ptr(), invstd.get(*this).data_ptr(), ptr_or_null(w),
          ptr_or_null(b), out_or_null(grad_x), out_or_null(grad_w), out_or_null(grad_b));
    } else {
      backend.batch_norm_backward(x.dtype(), batch, channels, inner, training, eps, x.data_ptr(),
                                  g.data_ptr(), mean.get(*this).data_ptr(),
                                  invstd.get(*this).data_ptr(), ptr_or_null(w), out_or_null(grad_x),
                                  out_or_null(grad_w), out_or_null(grad_b));
    }
    grads[0] = grad_x;
    grads[1] = grad_w;
    grads[2] = grad_b;
  }
  void release_saved() override {
    input.release();
    mean.release();
    invstd.release();
    weight.release();
    bias.release();
    output.release();
  }
};

// batch_norm_relu_max_pool2d's node: the pooled gradient goes back through the pooling, the ReLU
// and batch norm in one backend call, bitwise MaxPool2dBackward then BatchNormReluBackward. With
// create_graph it records the ops those two nodes record there, in the same order, so the
// second derivatives are theirs too.
struct BatchNormReluMaxPoolBackward final : core::Node {
  core::SavedTensor input, mean, invstd, weight, bias;
  Tensor taps;  // max pooling's, one byte per output
  bool has_weight = false, has_bias = false;
  double eps = 1e-5;
  kernels::Pool2dGeometry geometry;
  int64_t batch = 0, channels = 0;
  const char* name() const override { return "BatchNormReluMaxPoolBackward"; }
  bool differentiable_backward() const override { return true; }
  void apply(const Tensor& grad_output, std::vector<Tensor>& grads) override {
    const Tensor x = input.get(*this);
    const Tensor w = has_weight ? weight.get(*this) : Tensor();
    const Tensor b = has_bias ? bias.get(*this) : Tensor();
    if (core::grad_enabled()) {
      graph_gradients(x, w, b, grad_output, grads);
      return;
    }
    Tensor g = grad_output.contiguous();
    Tensor grad_x = next[0] ? core::detail::empty_on(x.shape(), x.dtype(), x.device()) : Tensor();
    Tensor grad_w = next[1] ? core::detail::empty_on({channels}, x.dtype(), x.device()) : Tensor();
    Tensor grad_b = next[2] ? core::detail::empty_on({channels}, x.dtype(), x.device()) : Tensor();
    core::backend_for(x.device())
        .batch_norm_relu_max_pool_backward(
            x.dtype(), geometry, batch, channels, x.data_ptr(), g.data_ptr(), taps.data_ptr(),
            mean.get(*this).data_ptr(), invstd.get(*this).data_ptr(), ptr_or_null(w),
            ptr_or_null(b), out_or_null(grad_x), out_or_null(grad_w), out_or_null(grad_b));
    grads[0] = grad_x;
    grads[1] = grad_w;
    grads[2] = grad_b;
  }
  // create_graph: max pooling's backward scatters each output's gradient onto its winner (whose
  // gradient gathers), then batch norm + ReLU's, whose mask is the forward's ReLU output > 0: that
  // output is recomputed, bitwise, by batch_norm_relu from the saved input (without running
  // statistics, which it would otherwise update again). The taps are the CPU's (the one backend
  // with the fusion), turned into flat winners as max pooling's own create_graph backward does.
  void graph_gradients(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& grad_output,
                       std::vector<Tensor>& grads) const {
    const int64_t planes = geometry.planes, inner = geometry.height * geometry.width;
    Tensor winners =
        core::detail::empty_on({planes, geometry.out_h * geometry.out_w}, core::kInt64, core::kCPU);
    kernels::cpu::max_pool2d_flat_indices(geometry, taps.data_ptr(), winners.data<int64_t>());
    Tensor zero = core::zeros(
        {planes, inner}, core::TensorOptions(grad_output.dtype()).device(grad_output.device()));
    Tensor g = core::scatter_add(zero, 1, winners.to(x.device()), grad_output.reshape({planes, -1}))
                   .reshape(x.shape());
    Tensor relu_output;
    {
      core::NoGradGuard no_grad;
      relu_output =
          batch_norm_relu(x.detach(), Tensor(), Tensor(), w, b, /*training=*/true, 0.0, eps);
    }
    batch_norm_graph_gradients(*this, x, w, relu_output, g, /*training=*/true, eps, Tensor(),
                               Tensor(), {batch, channels, inner}, grads);
  }
  void release_saved() override {
    input.release();
    mean.release();
    invstd.release();
    weight.release();
    bias.release();
    taps = Tensor();
  }
};

struct LayerNormBackward final : core::Node {
  core::SavedTensor input, mean, rstd, weight;
  bool has_weight = false;
  double eps = 1e-5;
  int64_t rows = 0, cols = 0;
  core::Shape param_shape;
  const char* name() const override { return "LayerNormBackward"; }
  bool differentiable_backward() const override { return true; }
  void apply(const Tensor& grad_output, std::vector<Tensor>& grads) override {
    const Tensor x = input.get(*this);
    if (core::grad_enabled()) {
      Tensor x2 = core::stand_in(x, next[0]).reshape({rows, cols});
      // A stand-in has the shape of the input it stands for (the weight's, not the saved [cols]).
      Tensor w2 =
          has_weight
              ? core::stand_in(weight.get(*this).reshape(param_shape), next[1]).reshape({1, cols})
              : Tensor();
      // The statistics are recomputed from x, so that they carry its history.
      NormGradients d =
          normalization_gradients(x2, grad_output.reshape({rows, cols}), w2, {1}, {0}, eps);
      if (next[0]) grads[0] = d.input.reshape(x.shape());
      if (next[1]) grads[1] = d.weight.reshape(param_shape);
      if (next[2]) grads[2] = d.bias.reshape(param_shape);
      return;
    }
    Tensor g = grad_output.contiguous();
    Tensor w = has_weight ? weight.get(*this) : Tensor();
    Tensor grad_x = next[0] ? core::detail::empty_on(x.shape(), x.dtype(), x.device()) : Tensor();
    Tensor grad_w = next[1] ? core::detail::empty_on(param_shape, x.dtype(), x.device()) : Tensor();
    Tensor grad_b = next[2] ? core::detail::empty_on(param_shape, x.dtype(), x.device()) : Tensor();
    core::backend_for(x.device())
        .layer_norm_backward(x.dtype(), rows, cols, x.data_ptr(), g.data_ptr(),
                             mean.get(*this).data_ptr(), rstd.get(*this).data_ptr(), ptr_or_null(w),
                             out_or_null(grad_x), out_or_null(grad_w), out_or_null(grad_b));
    grads[0] = grad_x;
    grads[1] = grad_w;
    grads[2] = grad_b;
  }
  void release_saved() override {
    input.release();
    mean.release();
    rstd.release();
    weight.release();
  }
};

// Training forward: normalizes with the batch statistics, writes mean and invstd, and blends
// the running statistics in place. The backends update dense running statistics of the data's
// dtype, so running statistics of another dtype or layout are updated through a temporary. With
// `pool` (and relu), out is the 2x2 max pooling of the ReLU's output and `taps` its taps.
void batch_norm_training(const Tensor& input, const Tensor& x, const Tensor& w, const Tensor& b,
                         const Tensor& running_mean, const Tensor& running_var, double factor,
                         double eps, int64_t batch, int64_t channels, int64_t inner, bool relu,
                         Tensor& out, Tensor& mean, Tensor& invstd,
                         const kernels::Pool2dGeometry* pool = nullptr, Tensor* taps = nullptr) {
  const char* name = "batch_norm";
  const core::DType dtype = x.dtype();
  core::NoGradGuard no_grad;
  const bool have_running = running_mean.defined() && running_var.defined();
  invstd = core::detail::empty_on({channels}, dtype, input.device());
  Tensor rm, rv;
  bool direct = false;
  if (have_running) {
    MPIGRAD_CHECK(running_mean.numel() == channels && running_var.numel() == channels, name,
                  ": running statistics have ", running_mean.numel(), " elements, expected ",
                  channels);
    core::detail::check_same_device(name, {&input, &running_mean, &running_var});
    direct = running_mean.dtype() == dtype && running_var.dtype() == dtype &&
             running_mean.is_contiguous() && running_var.is_contiguous();
    rm = direct ? running_mean
                : dense_vector(name, "running_mean", running_mean, channels, dtype).clone();
    rv = direct ? running_var
                : dense_vector(name, "running_var", running_var, channels, dtype).clone();
  }
  core::Backend& backend = core::backend_for(input.device());
  if (pool != nullptr) {
    backend.batch_norm_relu_max_pool_forward_training(
        dtype, *pool, batch, channels, factor, eps, x.data_ptr(), ptr_or_null(w), ptr_or_null(b),
        out_or_null(rm), out_or_null(rv), out.data_ptr(), taps->data_ptr(), mean.data_ptr(),
        invstd.data_ptr());
  } else if (relu) {
    backend.batch_norm_relu_forward_training(
        dtype, batch, channels, inner, factor, eps, x.data_ptr(), ptr_or_null(w), ptr_or_null(b),
        out_or_null(rm), out_or_null(rv), out.data_ptr(), mean.data_ptr(), invstd.data_ptr());
  } else {
    backend.batch_norm_forward_training(
        dtype, batch, channels, inner, factor, eps, x.data_ptr(), ptr_or_null(w), ptr_or_null(b),
        out_or_null(rm), out_or_null(rv), out.data_ptr(), mean.data_ptr(), invstd.data_ptr());
  }
  if (!have_running) return;
  if (direct) {
    running_mean.storage()->bump_version();
    running_var.storage()->bump_version();
  } else {
    Tensor target_mean = running_mean, target_var = running_var;
    target_mean.copy_(rm.reshape(running_mean.shape()));
    target_var.copy_(rv.reshape(running_var.shape()));
  }
}

// batch_norm, or with `relu` (training on a backend that supports the fusion) batch_norm_relu's
// fused op.
Tensor batch_norm_op(const Tensor& input, const Tensor& running_mean, const Tensor& running_var,
                     const Tensor& weight, const Tensor& bias, bool training, double factor,
                     double eps, bool relu) {
  const char* name = relu ? "batch_norm_relu" : "batch_norm";
  core::ProfileSpan span(name);
  check_input(name, input);
  MPIGRAD_CHECK(input.dim() >= 2, name, ": input must be [N, C, *], got shape ", input.shape());
  const int64_t batch = input.shape()[0], channels = input.shape()[1];
  const int64_t inner = batch * channels == 0 ? 0 : input.numel() / (batch * channels);
  const bool have_running = running_mean.defined() && running_var.defined();
  MPIGRAD_CHECK(training || have_running, name,
                ": eval mode needs running statistics (track_running_stats)");
  if (training) {
    MPIGRAD_CHECK(batch * inner > 1, name,
                  ": expected more than 1 value per channel when "
                  "training, got input of shape ",
                  input.shape());
  }
  const core::DType dtype = input.dtype();
  const auto [x, w, b] = dense_operands(name, input, weight, bias, channels);
  Tensor mean = core::detail::empty_on({channels}, dtype, input.device());
  Tensor invstd;
  Tensor out = core::detail::empty_on(input.shape(), dtype, input.device());
  if (training) {
    batch_norm_training(input, x, w, b, running_mean, running_var, factor, eps, batch, channels,
                        inner, relu, out, mean, invstd);
  } else {
    core::NoGradGuard no_grad;
    mean = dense_vector(name, "running_mean", running_mean, channels, dtype).clone();
    Tensor var = dense_vector(name, "running_var", running_var, channels, dtype).contiguous();
    invstd = core::rsqrt(var + eps);
    core::backend_for(input.device())
        .batch_norm_forward_inference(dtype, batch, channels, inner, eps, x.data_ptr(),
                                      ptr_or_null(w), ptr_or_null(b), mean.data_ptr(),
                                      var.data_ptr(), invstd.data_ptr(), out.data_ptr());
  }
  if (auto node = core::detail::record<BatchNormBackward>(out, {&input, &weight, &bias})) {
    node->input = core::SavedTensor(x);
    node->mean = core::SavedTensor(mean);
    node->invstd = core::SavedTensor(invstd);
    if (w.defined()) node->weight = core::SavedTensor(w);
    node->has_weight = w.defined();
    node->training = training;
    node->eps = eps;
    node->batch = batch;
    node->channels = channels;
    node->inner = inner;
    node->relu = relu;
    if (relu) {
      node->output = core::SavedTensor(out, /*is_output=*/true);
      if (b.defined()) node->bias = core::SavedTensor(b);
      node->has_bias = b.defined();
    }
  }
  return out;
}

}  // namespace

Tensor batch_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight, const Tensor& bias, bool training, double factor,
                  double eps) {
  return batch_norm_op(input, running_mean, running_var, weight, bias, training, factor, eps,
                       /*relu=*/false);
}

Tensor batch_norm_relu(const Tensor& input, const Tensor& running_mean, const Tensor& running_var,
                       const Tensor& weight, const Tensor& bias, bool training, double factor,
                       double eps) {
  const bool fused = training && input.defined() &&
                     core::backend_for(input.device()).supports_batch_norm_relu(input.dtype());
  if (!fused) {
    return core::relu(
        batch_norm(input, running_mean, running_var, weight, bias, training, factor, eps));
  }
  return batch_norm_op(input, running_mean, running_var, weight, bias, training, factor, eps,
                       /*relu=*/true);
}

bool fused_max_pool_window(const Pool2dOptions& pool) {
  using Pair = std::array<int64_t, 2>;
  return pool.kernel_size == Pair{2, 2} &&
         (pool.stride == Pair{0, 0} || pool.stride == Pair{2, 2}) && pool.padding == Pair{0, 0} &&
         pool.dilation == Pair{1, 1};
}

Tensor batch_norm_relu_max_pool2d(const Tensor& input, const Tensor& running_mean,
                                  const Tensor& running_var, const Tensor& weight,
                                  const Tensor& bias, bool training, double factor, double eps,
                                  const Pool2dOptions& pool) {
  // The fusion's geometry: 2x2 windows of stride 2 without padding or dilation, over a 4-d input
  // with a whole window in each plane (an odd last row or column is left out).
  kernels::Pool2dGeometry g;
  bool fused = training && fused_max_pool_window(pool) && input.defined() && input.dim() == 4 &&
               (input.dtype() == core::kFloat32 || input.dtype() == core::kFloat64);
  if (fused) {
    g.planes = input.shape()[0] * input.shape()[1];
    g.height = input.shape()[2];
    g.width = input.shape()[3];
    g.kernel_h = g.kernel_w = g.stride_h = g.stride_w = 2;
    g.out_h = g.height / 2;
    g.out_w = g.width / 2;
    fused = g.planes > 0 && g.out_h >= 1 && g.out_w >= 1 &&
            core::backend_for(input.device()).supports_batch_norm_relu_max_pool(input.dtype(), g);
  }
  if (!fused) {
    return max_pool2d(
        batch_norm_relu(input, running_mean, running_var, weight, bias, training, factor, eps),
        pool);
  }
  const char* name = "batch_norm_relu_max_pool2d";
  core::ProfileSpan span(name);
  const int64_t batch = input.shape()[0], channels = input.shape()[1];
  const int64_t inner = g.height * g.width;
  MPIGRAD_CHECK(batch * inner > 1, name,
                ": expected more than 1 value per channel when training, got input of shape ",
                input.shape());
  const core::DType dtype = input.dtype();
  const auto [x, w, b] = dense_operands(name, input, weight, bias, channels);
  Tensor mean = core::detail::empty_on({channels}, dtype, input.device());
  Tensor invstd;
  Tensor out = core::detail::empty_on({batch, channels, g.out_h, g.out_w}, dtype, input.device());
  Tensor taps =
      core::detail::empty_on({batch, channels, g.out_h, g.out_w}, core::kUInt8, input.device());
  batch_norm_training(input, x, w, b, running_mean, running_var, factor, eps, batch, channels,
                      inner, /*relu=*/true, out, mean, invstd, &g, &taps);
  if (auto node =
          core::detail::record<BatchNormReluMaxPoolBackward>(out, {&input, &weight, &bias})) {
    node->input = core::SavedTensor(x);
    node->mean = core::SavedTensor(mean);
    node->invstd = core::SavedTensor(invstd);
    if (w.defined()) node->weight = core::SavedTensor(w);
    if (b.defined()) node->bias = core::SavedTensor(b);
    node->has_weight = w.defined();
    node->has_bias = b.defined();
    node->eps = eps;
    node->taps = taps;
    node->geometry = g;
    node->batch = batch;
    node->channels = channels;
  }
  return out;
}

Tensor layer_norm(const Tensor& input, const std::vector<int64_t>& normalized_shape,
                  const Tensor& weight, const Tensor& bias, double eps) {
  const char* name = "layer_norm";
  core::ProfileSpan span(name);
  check_input(name, input);
  const int k = int(normalized_shape.size());
  MPIGRAD_CHECK(k >= 1 && input.dim() >= k, name, ": normalized shape of ", k,
                " dims does not fit input of shape ", input.shape());
  int64_t cols = 1;
  for (int i = 0; i < k; ++i) {
    MPIGRAD_CHECK(input.shape()[input.dim() - k + i] == normalized_shape[size_t(i)], name,
                  ": input of shape ", input.shape(), " does not end in the normalized shape ",
                  core::Shape(normalized_shape));
    cols *= normalized_shape[size_t(i)];
  }
  const int64_t rows = cols == 0 ? 0 : input.numel() / cols;
  const core::DType dtype = input.dtype();
  const auto [x, w, b] = dense_operands(name, input, weight, bias, cols);
  Tensor out = core::detail::empty_on(input.shape(), dtype, input.device());
  Tensor mean = core::detail::empty_on({rows}, dtype, input.device());
  Tensor rstd = core::detail::empty_on({rows}, dtype, input.device());
  core::backend_for(input.device())
      .layer_norm_forward(dtype, rows, cols, eps, x.data_ptr(), ptr_or_null(w), ptr_or_null(b),
                          out.data_ptr(), mean.data_ptr(), rstd.data_ptr());
  if (auto node = core::detail::record<LayerNormBackward>(out, {&input, &weight, &bias})) {
    node->input = core::SavedTensor(x);
    node->mean = core::SavedTensor(mean);
    node->rstd = core::SavedTensor(rstd);
    if (w.defined()) node->weight = core::SavedTensor(w);
    node->has_weight = w.defined();
    node->rows = rows;
    node->cols = cols;
    node->eps = eps;
    node->param_shape = core::Shape(normalized_shape);
  }
  return out;
}

}  // namespace mpigrad::nn::functional
