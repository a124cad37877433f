// Elementwise ops: forward through Backend::unary/binary/where/clamp, backward as nodes.
#include "mpigrad/core/ops/elementwise.h"

#include "mpigrad/core/ops/op_support.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/core/profiler.h"

namespace mpigrad::core {

using detail::record;

Tensor scalar_like(double value, const Tensor& like) {
  return Tensor::scalar(value, TensorOptions(like.dtype()).device(like.device()));
}

Tensor sum_to(const Tensor& gradient, const Shape& shape) {
  if (gradient.shape() == shape) return gradient;
  std::vector<int64_t> dims;
  int leading = gradient.dim() - shape.size();
  for (int d = 0; d < gradient.dim(); ++d) {
    if (d < leading || (shape[d - leading] == 1 && gradient.shape()[d] != 1)) dims.push_back(d);
  }
  Tensor summed = sum(gradient, dims, /*keepdim=*/true);
  return summed.reshape(shape);
}

// ---- Binary ----------------------------------------------------------------------------------

namespace {

// Runs the kernel for out = a op b after broadcasting and promotion. The promotion casts are
// differentiable, so the caller records its node against the returned operands.
struct BinaryResult {
  Tensor out, a, b;
};

BinaryResult binary_kernel(BinaryOp op, const Tensor& a_in, const Tensor& b_in) {
  const char* name = kernels::binary_op_name(op);
  MPIGRAD_CHECK(a_in.defined() && b_in.defined(), name, ": undefined operand");
  detail::check_same_device(name, {&a_in, &b_in});
  Shape shape = broadcast_shapes(a_in.shape(), b_in.shape(), name);
  DType dtype = promote_types(a_in.dtype(), b_in.dtype());
  // True division, as in PyTorch and NumPy: integers divide as float32.
  if (op == BinaryOp::Div && !is_floating(dtype)) dtype = kFloat32;
  BinaryResult result{Tensor(), a_in.dtype() == dtype ? a_in : a_in.to(dtype),
                      b_in.dtype() == dtype ? b_in : b_in.to(dtype)};
  DType out_dtype = kernels::is_comparison(op) ? kBool : dtype;
  result.out = detail::empty_on(shape, out_dtype, a_in.device());
  if (result.out.numel() > 0) {
    StridedLoop loop = detail::make_loop(shape, {&result.out, &result.a, &result.b});
    backend_for(a_in.device())
        .binary(op, dtype, loop, result.out.data_ptr(), result.a.data_ptr(), result.b.data_ptr());
  }
  return result;
}

}  // namespace

namespace detail {
void binary_into(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b,
                 const char* name) {
  check_same_device(name, {&out, &a, &b});
  Shape shape = broadcast_shapes(a.shape(), b.shape(), name);
  MPIGRAD_CHECK(shape == out.shape(), name, ": result shape ", shape,
                " does not match the in-place target ", out.shape());
  Tensor a_cast = a.dtype() == out.dtype() ? a : a.to(out.dtype());
  Tensor b_cast = b.dtype() == out.dtype() ? b : b.to(out.dtype());
  if (out.numel() == 0) return;
  StridedLoop loop = make_loop(shape, {&out, &a_cast, &b_cast});
  backend_for(out.device())
      .binary(op, out.dtype(), loop, out.data_ptr(), a_cast.data_ptr(), b_cast.data_ptr());
}
}  // namespace detail

namespace {

struct AddBackward final : Node {
  Shape a_shape, b_shape;
  double b_sign;  // +1 for add, -1 for sub
  AddBackward(Shape a, Shape b, double sign) : a_shape(a), b_shape(b), b_sign(sign) {}
  const char* name() const override { return b_sign > 0 ? "AddBackward" : "SubBackward"; }
  bool differentiable_backward() const override { return true; }
  void apply(const Tensor& grad, std::vector<Tensor>& grads) override {
    if (gradient_needed(*this, 0)) grads[0] = sum_to(grad, a_shape);
    if (gradient_needed(*this, 1)) grads[1] = sum_to(b_sign > 0 ? grad : neg(grad), b_shape);
  }
};

struct MulBackward final : Node {
  SavedTensor a, b;
  const char* name() const override { return "MulBackward"; }
  bool differentiable_backward() const override { return true; }
  void apply(const Tensor& grad, std::vector<Tensor>& grads) override {
    if (gradient_needed(*this, 0)) grads[0] = sum_to(mul(grad, b.get(*this)), a.get(*this).shape());
    if (gradient_needed(*this, 1)) grads[1] = sum_to(mul(grad, a.get(*this)), b.get(*this).shape());
  }
  void release_saved() override {
    a.release();
    b.release();
  }
};

struct DivBackward final : Node {
  SavedTensor a, b;
  const char* name() const override { return "DivBackward"; }
  bool differentiable_backward() const override { return true; }
  void apply(const Tensor& grad, std::vector<Tensor>& grads) override {
    const Tensor& denominator = b.get(*this);
    Tensor grad_over_b = div(grad, denominator);
    if (gradient_needed(*this, 0)) grads[0] = sum_to(grad_over_b, a.get(*this).shape());
    if (gradient_needed(*this, 1)) {
      // d(a/b)/db = -a / b^2
      grads[1] = sum_to(neg(div(mul(grad_over_b, a.get(*this)), denominator)), denominator.shape());
    }
  }
  void release_saved() override {
    a.release();
    b.release();
  }
};

// maximum/minimum: the gradient goes to the winner; ties split it evenly, as in PyTorch.
struct ExtremumBackward final : Node {
  SavedTensor a, b;
  bool is_max;
  explicit ExtremumBackward(bool max) : is_max(max) {}
  const char* name() const override { return is_max ? "MaximumBackward" : "MinimumBackward"; }
  bool differentiable_backward() const override { return true; }
  void apply(const Tensor& grad, std::vector<Tensor>& grads) override {
    const Tensor& x = a.get(*this);
    const Tensor& y = b.get(*this);
    Tensor zero = scalar_like(0.0, grad);
    Tensor half = mul(grad, scalar_like(0.5, grad));
    Tensor tie = eq(x, y);
    Tensor a_wins = is_max ? gt(x, y) : lt(x, y);
    Tensor b_wins = is_max ? lt(x, y) : gt(x, y);
    if (gradient_needed(*this, 0))
      grads[0] = sum_to(where(a_wins, grad, where(tie, half, zero)), x.shape());
    if (gradient_needed(*this, 1))
      grads[1] = sum_to(where(b_wins, grad, where(tie, half, zero)), y.shape());
  }
  void release_saved() override {
    a.release();
    b.release();
  }
};

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  ProfileSpan span("add");
  BinaryResult r = binary_kernel(BinaryOp::Add, a, b);
  record<AddBackward>(r.out, {&r.a, &r.b}, r.a.shape(), r.b.shape(), 1.0);
  return r.out;
}

Tensor sub(const Tensor& a, const Tensor& b) {
  ProfileSpan span("sub");
  BinaryResult r = binary_kernel(BinaryOp::Sub, a, b);
  record<AddBackward>(r.out, {&r.a, &r.b}, r.a.shape(), r.b.shape(), -1.0);
  return r.out;
}

namespace {
// Records NodeT for a binary result and saves both (promoted) operands in it.
template <typename NodeT, typename... Args>
Tensor record_saving_operands(const BinaryResult& r, Args&&... args) {
  if (auto node = record<NodeT>(r.out, {&r.a, &r.b}, std::forward<Args>(args)...)) {
    node->a = r.a;
    node->b = r.b;
  }
  return r.out;
}
}  // namespace

Tensor mul(const Tensor& a, const Tensor& b) {
  ProfileSpan span("mul");
  return record_saving_operands<MulBackward>(binary_kernel(BinaryOp::Mul, a, b));
}
Tensor div(const Tensor& a, const Tensor& b) {
  ProfileSpan span("div");
  return record_saving_operands<DivBackward>(binary_kernel(BinaryOp::Div, a, b));
}
Tensor maximum(const Tensor& a, const Tensor& b) {
  ProfileSpan span("maximum");
  return record_saving_operands<ExtremumBackward>(binary_kernel(BinaryOp::Maximum, a, b), true);
}
Tensor minimum(const Tensor& a, const Tensor& b) {
  ProfileSpan span("minimum");
  return record_saving_operands<ExtremumBackward>(binary_kernel(BinaryOp::Minimum, a, b), false);
}

Tensor eq(const Tensor& a, const Tensor& b) {
  ProfileSpan span("eq");
  return binary_kernel(BinaryOp::Eq, a, b).out;
}
Tensor ne(const Tensor& a, const Tensor& b) {
  ProfileSpan span("ne");
  return binary_kernel(BinaryOp::Ne, a, b).out;
}
Tensor lt(const Tensor& a, const Tensor& b) {
  ProfileSpan span("lt");
  return binary_kernel(BinaryOp::Lt, a, b).out;
}
Tensor le(const Tensor& a, const Tensor& b) {
  ProfileSpan span("le");
  return binary_kernel(BinaryOp::Le, a, b).out;
}
Tensor gt(const Tensor& a, const Tensor& b) {
  ProfileSpan span("gt");
  return binary_kernel(BinaryOp::Gt, a, b).out;
}
Tensor ge(const Tensor& a, const Tensor& b) {
  ProfileSpan span("ge");
  return binary_kernel(BinaryOp::Ge, a, b).out;
}

// ---- Unary -----------------------------------------------------------------------------------

namespace {

// Ops whose derivative is cheaper from the result than from the input.
bool backward_uses_output(UnaryOp op) {
  return op == UnaryOp::Exp || op == UnaryOp::Sqrt || op == UnaryOp::Rsqrt ||
         op == UnaryOp::Sigmoid || op == UnaryOp::Tanh;
}

// dy/dx of y = op(x) in differentiable ops, from x or y (whichever the node saved; `x` is y for
// the ops that backward_uses_output): what a backward with create_graph multiplies the gradient
// by, so that the product can be differentiated again. The fused kernel computes the same.
Tensor unary_derivative(UnaryOp op, const Tensor& x, const Tensor& y) {
  const auto constant = [&](double value) { return scalar_like(value, x); };
  constexpr double kSqrtHalf = 0.70710678118654752440;    // 1/sqrt(2)
  constexpr double kInvSqrt2Pi = 0.39894228040143267794;  // 1/sqrt(2 pi)
  constexpr double kTwoOverSqrtPi = 1.12837916709551257390;
  constexpr double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2/pi)
  constexpr double kCubic = 0.044715;
  switch (op) {
    case UnaryOp::Neg:
      return constant(-1.0);
    case UnaryOp::Exp:
      return y;
    case UnaryOp::Log:
      return div(constant(1.0), x);
    case UnaryOp::Sqrt:
      return div(constant(0.5), y);
    case UnaryOp::Rsqrt:  // d x^(-1/2) = -x^(-3/2) / 2 = -y^3 / 2
      return mul(constant(-0.5), mul(y, mul(y, y)));
    case UnaryOp::Abs:
      return sign(x);
    case UnaryOp::Relu:
      return gt(x, constant(0.0)).to(x.dtype());
    case UnaryOp::Sign:
      return zeros_like(x);
    case UnaryOp::Sigmoid:
      return mul(y, sub(constant(1.0), y));
    case UnaryOp::Tanh:
      return sub(constant(1.0), mul(y, y));
    case UnaryOp::Erf:  // 2/sqrt(pi) exp(-x^2)
      return mul(constant(kTwoOverSqrtPi), exp(neg(mul(x, x))));
    case UnaryOp::Sin:
      return cos(x);
    case UnaryOp::Cos:
      return neg(sin(x));
    case UnaryOp::Softplus:
      return sigmoid(x);
    case UnaryOp::Silu: {  // s (1 + x (1 - s)), s = sigmoid(x)
      Tensor s = sigmoid(x);
      return mul(s, add(constant(1.0), mul(x, sub(constant(1.0), s))));
    }
    case UnaryOp::GeluErf: {  // Phi(x) + x phi(x)
      Tensor cdf = mul(constant(0.5), add(constant(1.0), erf(mul(x, constant(kSqrtHalf)))));
      Tensor pdf = mul(constant(kInvSqrt2Pi), exp(mul(constant(-0.5), mul(x, x))));
      return add(cdf, mul(x, pdf));
    }
    case UnaryOp::GeluTanh: {  // t = tanh(u), u = sqrt(2/pi) (x + 0.044715 x^3)
      Tensor x2 = mul(x, x);
      Tensor t = tanh(mul(constant(kSqrt2OverPi), add(x, mul(constant(kCubic), mul(x2, x)))));
      Tensor du = mul(constant(kSqrt2OverPi), add(constant(1.0), mul(constant(3 * kCubic), x2)));
      Tensor half_x = mul(constant(0.5), x);
      return add(mul(constant(0.5), add(constant(1.0), t)),
                 mul(half_x, mul(sub(constant(1.0), mul(t, t)), du)));
    }
  }
  fail("unary_derivative: unhandled op ", kernels::unary_op_name(op));
}

struct UnaryBackward final : Node {
  UnaryOp op;
  SavedTensor input, output;
  explicit UnaryBackward(UnaryOp op_) : op(op_) {}
  const char* name() const override { return kernels::unary_op_name(op); }
  bool differentiable_backward() const override { return true; }
  void apply(const Tensor& grad, std::vector<Tensor>& grads) override {
    const Tensor x = input.defined() ? input.get(*this) : output.get(*this);
    const Tensor y = output.defined() ? output.get(*this) : x;
    if (grad_enabled()) {  // create_graph: a product that can be differentiated again
      grads[0] = mul(grad, unary_derivative(op, x, y));
      return;
    }
    Tensor grad_in = detail::empty_on(grad.shape(), grad.dtype(), grad.device());
    if (grad_in.numel() > 0) {
      StridedLoop loop = detail::make_loop(grad.shape(), {&grad_in, &grad, &x, &y});
      backend_for(grad.device())
          .unary_backward(op, grad.dtype(), loop, grad_in.data_ptr(), grad.data_ptr(), x.data_ptr(),
                          y.data_ptr());
    }
    grads[0] = std::move(grad_in);
  }
  void release_saved() override {
    input.release();
    output.release();
  }
};

Tensor unary(UnaryOp op, const Tensor& x) {
  ProfileSpan span(kernels::unary_op_name(op));
  const char* name = kernels::unary_op_name(op);
  MPIGRAD_CHECK(x.defined(), name, ": undefined operand");
  bool integer_ok = kernels::unary_op_allows_integers(op);
  MPIGRAD_CHECK(integer_ok || is_floating(x.dtype()), name,
                ": expected a floating-point tensor, got ", x.dtype(),
                " (convert with .to(kFloat32))");
  MPIGRAD_CHECK(x.dtype() != kBool, name, ": not defined for bool tensors");
  Tensor out = detail::empty_on(x.shape(), x.dtype(), x.device());
  if (out.numel() > 0) {
    StridedLoop loop = detail::make_loop(x.shape(), {&out, &x});
    backend_for(x.device()).unary(op, x.dtype(), loop, out.data_ptr(), x.data_ptr());
  }
  if (op != UnaryOp::Sign) {
    if (auto node = record<UnaryBackward>(out, {&x}, op)) {
      if (backward_uses_output(op)) {
        node->output = SavedTensor(out, /*is_output=*/true);
      } else {
        node->input = x;
      }
    }
  }
  return out;
}

}  // namespace

Tensor neg(const Tensor& x) {
  return unary(UnaryOp::Neg, x);
}
Tensor exp(const Tensor& x) {
  return unary(UnaryOp::Exp, x);
}
Tensor log(const Tensor& x) {
  return unary(UnaryOp::Log, x);
}
Tensor sqrt(const Tensor& x) {
  return unary(UnaryOp::Sqrt, x);
}
Tensor rsqrt(const Tensor& x) {
  return unary(UnaryOp::Rsqrt, x);
}
Tensor abs(const Tensor& x) {
  return unary(UnaryOp::Abs, x);
}
Tensor sign(const Tensor& x) {
  return unary(UnaryOp::Sign, x);
}
Tensor relu(const Tensor& x) {
  return unary(UnaryOp::Relu, x);
}
Tensor gelu(const Tensor& x, GeluApproximation approximation) {
  return unary(approximation == GeluApproximation::Tanh ? UnaryOp::GeluTanh : UnaryOp::GeluErf, x);
}
Tensor silu(const Tensor& x) {
  return unary(UnaryOp::Silu, x);
}
Tensor sigmoid(const Tensor& x) {
  return unary(UnaryOp::Sigmoid, x);
}
Tensor softplus(const Tensor& x) {
  return unary(UnaryOp::Softplus, x);
}
Tensor erf(const Tensor& x) {
  return unary(UnaryOp::Erf, x);
}
Tensor tanh(const Tensor& x) {
  return unary(UnaryOp::Tanh, x);
}
Tensor sin(const Tensor& x) {
  return unary(UnaryOp::Sin, x);
}
Tensor cos(const Tensor& x) {
  return unary(UnaryOp::Cos, x);
}

// ---- pow, clamp, where -----------------------------------------------------------------------

namespace {

struct PowBackward final : Node {
  SavedTensor input;
  double exponent;
  explicit PowBackward(double e) : exponent(e) {}
  const char* name() const override { return "PowBackward"; }
  bool differentiable_backward() const override { return true; }
  void apply(const Tensor& grad, std::vector<Tensor>& grads) override {
    const Tensor& x = input.get(*this);
    if (exponent == 0.0) {
      grads[0] = zeros_like(grad);
      return;
    }
    // d(x^e)/dx = e * x^(e-1)
    grads[0] = mul(grad, mul(pow(x, exponent - 1.0), scalar_like(exponent, x)));
  }
  void release_saved() override { input.release(); }
};

struct ClampBackward final : Node {
  SavedTensor input;
  double lo, hi;
  ClampBackward(double lo_, double hi_) : lo(lo_), hi(hi_) {}
  const char* name() const override { return "ClampBackward"; }
  bool differentiable_backward() const override { return true; }
  void apply(const Tensor& grad, std::vector<Tensor>& grads) override {
    const Tensor& x = input.get(*this);
    // The gradient passes where lo <= x <= hi, as in PyTorch.
    Tensor zero = scalar_like(0.0, grad);
    Tensor below = lt(x, scalar_like(lo, x));
    Tensor above = gt(x, scalar_like(hi, x));
    grads[0] = where(below, zero, where(above, zero, grad));
  }
  void release_saved() override { input.release(); }
};

struct WhereBackward final : Node {
  SavedTensor condition;
  Shape a_shape, b_shape;
  WhereBackward(Shape a, Shape b) : a_shape(a), b_shape(b) {}
  const char* name() const override { return "WhereBackward"; }
  bool differentiable_backward() const override { return true; }
  void apply(const Tensor& grad, std::vector<Tensor>& grads) override {
    const Tensor& cond = condition.get(*this);
    Tensor zero = scalar_like(0.0, grad);
    if (gradient_needed(*this, 0)) grads[0] = sum_to(where(cond, grad, zero), a_shape);
    if (gradient_needed(*this, 1)) grads[1] = sum_to(where(cond, zero, grad), b_shape);
  }
  void release_saved() override { condition.release(); }
};

}  // namespace

Tensor pow(const Tensor& x, double exponent) {
  ProfileSpan span("pow");
  detail::check_floating("pow", x);
  Tensor e = scalar_like(exponent, x);
  Tensor out = detail::empty_on(x.shape(), x.dtype(), x.device());
  if (out.numel() > 0) {
    StridedLoop loop = detail::make_loop(x.shape(), {&out, &x, &e});
    backend_for(x.device())
        .binary(BinaryOp::Pow, x.dtype(), loop, out.data_ptr(), x.data_ptr(), e.data_ptr());
  }
  if (auto node = record<PowBackward>(out, {&x}, exponent)) node->input = x;
  return out;
}

namespace {
// d(a^b)/da = b * a^(b-1); d(a^b)/db = a^b * log(a), which is only real where a > 0, so the
// exponent's gradient is left 0 elsewhere (where PyTorch gives NaN), keeping a base <= 0 with a
// constant exponent harmless.
struct PowTensorBackward final : Node {
  SavedTensor a, b;
  const char* name() const override { return "PowBackward"; }
  bool differentiable_backward() const override { return true; }
  void apply(const Tensor& grad, std::vector<Tensor>& grads) override {
    const Tensor& x = a.get(*this);
    const Tensor& e = b.get(*this);
    if (gradient_needed(*this, 0))
      grads[0] = sum_to(mul(grad, mul(e, pow(x, sub(e, scalar_like(1.0, e))))), x.shape());
    if (gradient_needed(*this, 1)) {
      Tensor positive = gt(x, scalar_like(0.0, x));
      Tensor safe = where(positive, x, scalar_like(1.0, x));
      grads[1] = sum_to(mul(grad, mul(pow(safe, e), log(safe))), e.shape());
    }
  }
  void release_saved() override {
    a.release();
    b.release();
  }
};
}  // namespace

Tensor pow(const Tensor& x, const Tensor& exponent) {
  ProfileSpan span("pow");
  MPIGRAD_CHECK(x.defined() && exponent.defined(), "pow: undefined operand");
  MPIGRAD_CHECK(is_floating(x.dtype()) || !is_floating(exponent.dtype()),
                "pow: an integer base needs an integer exponent");
  // The result has the base's dtype (ONNX Pow, and torch for a float base).
  Tensor e = exponent.to(x.dtype());
  return record_saving_operands<PowTensorBackward>(binary_kernel(BinaryOp::Pow, x, e));
}

Tensor clamp(const Tensor& x, double lo, double hi) {
  ProfileSpan span("clamp");
  MPIGRAD_CHECK(x.defined(), "clamp: undefined operand");
  MPIGRAD_CHECK(lo <= hi, "clamp: min ", lo, " is greater than max ", hi);
  Tensor out = detail::empty_on(x.shape(), x.dtype(), x.device());
  if (out.numel() > 0) {
    StridedLoop loop = detail::make_loop(x.shape(), {&out, &x});
    backend_for(x.device()).clamp(x.dtype(), loop, out.data_ptr(), x.data_ptr(), lo, hi);
  }
  if (auto node = record<ClampBackward>(out, {&x}, lo, hi)) node->input = x;
  return out;
}

Tensor where(const Tensor& cond, const Tensor& a_in, const Tensor& b_in) {
  ProfileSpan span("where");
  MPIGRAD_CHECK(cond.defined() && a_in.defined() && b_in.defined(), "where: undefined operand");
  detail::check_same_device("where", {&cond, &a_in, &b_in});
  MPIGRAD_CHECK(cond.dtype() == kBool, "where: the condition must be bool, got ", cond.dtype());
  Shape shape = broadcast_shapes(broadcast_shapes(cond.shape(), a_in.shape(), "where"),
                                 b_in.shape(), "where");
  DType dtype = promote_types(a_in.dtype(), b_in.dtype());
  Tensor a = a_in.to(dtype);
  Tensor b = b_in.to(dtype);
  Tensor out = detail::empty_on(shape, dtype, a.device());
  if (out.numel() > 0) {
    StridedLoop loop = detail::make_loop(shape, {&out, &cond, &a, &b});
    backend_for(a.device())
        .where(dtype, loop, out.data_ptr(), cond.data_ptr(), a.data_ptr(), b.data_ptr());
  }
  if (auto node = record<WhereBackward>(out, {&a, &b}, a.shape(), b.shape())) {
    node->condition = cond;
  }
  return out;
}

}  // namespace mpigrad::core
