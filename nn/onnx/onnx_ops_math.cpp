// ONNX's elementwise ops, activations, Gemm and MatMul, reductions and softmax, on core ops.
#include <cmath>
#include <limits>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/error.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/indexing.h"
#include "mpigrad/core/ops/linalg.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/core/ops/softmax.h"
#include "mpigrad/nn/onnx/onnx_fusion.h"
#include "mpigrad/nn/onnx/onnx_op_table.h"

namespace mpigrad::nn::onnx_ops {

namespace {

using core::Tensor;

Tensor scalar(double value, const Tensor& like) {
  return core::scalar_like(value, like);
}

template <typename F>
OpBuilder unary(F f) {
  return [f](const NodeView&) -> OpFunction {
    return
        [f](const std::vector<Tensor>& in, RunContext&) { return std::vector<Tensor>{f(in[0])}; };
  };
}

// Integer operands of Div and Mod follow C (truncating) and Python/ONNX rules on the host: they
// only ever hold small shape arithmetic.
Tensor integer_binary(const Tensor& a, const Tensor& b, const std::string& op, bool fmod,
                      const std::string& where) {
  const core::Shape shape = core::broadcast_shapes(a.shape(), b.shape(), op.c_str());
  const std::vector<int64_t> x = host_ints(a.expand(shape).contiguous());
  const std::vector<int64_t> y = host_ints(b.expand(shape).contiguous());
  std::vector<int64_t> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    MPIGRAD_CHECK(y[i] != 0, where, ": integer ", op, " by zero");
    if (op == "Div") {
      out[i] = x[i] / y[i];
    } else {
      int64_t r = x[i] % y[i];
      if (!fmod && r != 0 && ((r < 0) != (y[i] < 0))) r += y[i];
      out[i] = r;
    }
  }
  return on_device_of(Tensor::from_vector(out, shape).to(core::promote_types(a.dtype(), b.dtype())),
                      a);
}

template <typename F>
OpBuilder binary(F f) {
  return [f](const NodeView&) -> OpFunction {
    return [f](const std::vector<Tensor>& in, RunContext&) {
      return std::vector<Tensor>{f(in[0], on_device_of(in[1], in[0]))};
    };
  };
}

// Sum, Max, Min, Mean: any number of inputs, broadcast.
template <typename F>
OpBuilder variadic(F f, bool mean) {
  return [f, mean](const NodeView&) -> OpFunction {
    return [f, mean](const std::vector<Tensor>& in, RunContext&) {
      Tensor out = in[0];
      for (size_t i = 1; i < in.size(); ++i) out = f(out, on_device_of(in[i], out));
      if (mean && in.size() > 1) out = out / double(in.size());
      return std::vector<Tensor>{out};
    };
  };
}

Tensor positive(const Tensor& x) {
  return core::gt(x, scalar(0.0, x));
}

// The axes of a reduction: an attribute before `axes_input_opset`, the second input from it.
struct ReduceSpec {
  std::optional<std::vector<int64_t>> axes;  // from the attribute
  bool axes_from_input = false;
  bool keepdims = true;
  bool noop_with_empty_axes = false;
};

ReduceSpec reduce_spec(const NodeView& node, int64_t axes_input_opset) {
  ReduceSpec spec;
  spec.keepdims = node.get_int("keepdims", 1) != 0;
  spec.noop_with_empty_axes = node.get_int("noop_with_empty_axes", 0) != 0;
  if (node.opset() >= axes_input_opset) {
    spec.axes_from_input = true;
  } else {
    spec.axes = node.get_ints("axes");
  }
  return spec;
}

enum class Reduction { Sum, Mean, Max, Min, L1, L2, SumSquare, LogSum, LogSumExp };

OpBuilder reduce(Reduction kind, int64_t axes_input_opset) {
  return [kind, axes_input_opset](const NodeView& node) -> OpFunction {
    const ReduceSpec spec = reduce_spec(node, axes_input_opset);
    const std::string where = node.where();
    return [spec, kind, where](const std::vector<Tensor>& in, RunContext&) {
      const Tensor& x = in[0];
      std::vector<int64_t> axes;
      if (spec.axes_from_input) {
        if (in.size() > 1 && in[1].defined()) axes = host_ints(in[1]);
      } else if (spec.axes) {
        axes = *spec.axes;
      }
      if (axes.empty()) {
        if (spec.noop_with_empty_axes) return std::vector<Tensor>{x};
        for (int64_t d = 0; d < x.dim(); ++d) axes.push_back(d);
      }
      for (auto& axis : axes) axis = wrap_axis(axis, x.dim(), where);
      std::sort(axes.begin(), axes.end());
      axes.erase(std::unique(axes.begin(), axes.end()), axes.end());
      if (x.dim() == 0) return std::vector<Tensor>{x};
      Tensor out;
      switch (kind) {
        case Reduction::Sum:
          out = core::sum(x, axes, spec.keepdims);
          break;
        case Reduction::Mean:
          out = core::mean(x, axes, spec.keepdims);
          break;
        case Reduction::Max:
        case Reduction::Min: {
          out = x;
          for (auto it = axes.rbegin(); it != axes.rend(); ++it)
            out = kind == Reduction::Max ? core::max(out, *it, true).values
                                         : core::min(out, *it, true).values;
          if (!spec.keepdims)
            for (auto it = axes.rbegin(); it != axes.rend(); ++it) out = out.squeeze(*it);
          break;
        }
        case Reduction::L1:
          out = core::sum(core::abs(x), axes, spec.keepdims);
          break;
        case Reduction::L2:
          out = core::sqrt(core::sum(x * x, axes, spec.keepdims));
          break;
        case Reduction::SumSquare:
          out = core::sum(x * x, axes, spec.keepdims);
          break;
        case Reduction::LogSum:
          out = core::log(core::sum(x, axes, spec.keepdims));
          break;
        case Reduction::LogSumExp: {
          // max + log(sum(exp(x - max))), with the max held constant: it cancels in the value
          // and in the gradient.
          Tensor peak = x.detach();
          for (auto it = axes.rbegin(); it != axes.rend(); ++it)
            peak = core::max(peak, *it, true).values;
          out = core::log(core::sum(core::exp(x - peak), axes, true)) + peak;
          if (!spec.keepdims)
            for (auto it = axes.rbegin(); it != axes.rend(); ++it) out = out.squeeze(*it);
          break;
        }
      }
      return std::vector<Tensor>{out};
    };
  };
}

OpBuilder softmax(bool log) {
  return [log](const NodeView& node) -> OpFunction {
    const bool legacy = node.opset() < 13;
    const int64_t axis = node.get_int("axis", legacy ? 1 : -1);
    const std::string where = node.where();
    return [log, legacy, axis, where](const std::vector<Tensor>& in, RunContext&) {
      const Tensor& x = in[0];
      const int64_t a = wrap_axis(axis, x.dim(), where);
      if (!legacy || a == x.dim() - 1) {
        return std::vector<Tensor>{log ? core::log_softmax(x, a) : core::softmax(x, a)};
      }
      // Before opset 13 the input is seen as 2-d [prod(shape[:axis]), prod(shape[axis:])].
      int64_t rows = 1;
      for (int64_t d = 0; d < a; ++d) rows *= x.shape()[int(d)];
      Tensor flat = x.reshape({rows, x.numel() / std::max<int64_t>(rows, 1)});
      Tensor y = log ? core::log_softmax(flat, 1) : core::softmax(flat, 1);
      return std::vector<Tensor>{y.reshape(x.shape())};
    };
  };
}

OpFunction gemm(const NodeView& node) {
  const bool trans_a = node.get_int("transA", 0) != 0;
  const bool trans_b = node.get_int("transB", 0) != 0;
  const double alpha = node.get_float("alpha", 1.0);
  const double beta = node.get_float("beta", 1.0);
  return [=](const std::vector<Tensor>& in, RunContext&) {
    const Tensor a = trans_a ? in[0].t() : in[0];
    // transB with a [out, in] weight is nn::Linear's layout: the same matmul of a transposed view.
    const Tensor b = trans_b ? in[1].t() : in[1];
    Tensor y = core::matmul(a, b);
    if (alpha != 1.0) y = y * alpha;
    if (in.size() > 2 && in[2].defined() && beta != 0.0) {
      const Tensor c = on_device_of(in[2], y);
      y = y + (beta == 1.0 ? c : c * beta);
    }
    return std::vector<Tensor>{y};
  };
}

// softmax(scale * x + mask) along the last axis: attention's Mul (or Div), Add and Softmax as the
// importer's fusion writes them (onnx_fusion.h, fuse_attention_softmax); not an ONNX op.
OpFunction softmax_scale_mask_op(const NodeView& node) {
  const double scale = node.get_float("scale", 1.0);
  return [scale](const std::vector<Tensor>& in, RunContext&) {
    const Tensor mask = in.size() > 1 && in[1].defined() ? on_device_of(in[1], in[0]) : Tensor();
    return std::vector<Tensor>{core::softmax_scale_mask(in[0], scale, mask)};
  };
}

OpFunction clip(const NodeView& node) {
  const bool legacy = node.opset() < 11;
  const double lo_attr = node.get_float("min", -std::numeric_limits<double>::infinity());
  const double hi_attr = node.get_float("max", std::numeric_limits<double>::infinity());
  return [=](const std::vector<Tensor>& in, RunContext&) {
    double lo = lo_attr, hi = hi_attr;
    if (!legacy) {
      lo = in.size() > 1 && in[1].defined() ? host_doubles(in[1]).at(0)
                                            : -std::numeric_limits<double>::infinity();
      hi = in.size() > 2 && in[2].defined() ? host_doubles(in[2]).at(0)
                                            : std::numeric_limits<double>::infinity();
    }
    if (lo > hi) {  // ONNX: every element becomes max
      return std::vector<Tensor>{
          core::full(in[0].shape(), hi, core::TensorOptions(in[0].dtype()).device(in[0].device()))};
    }
    return std::vector<Tensor>{core::clamp(in[0], lo, hi)};
  };
}

OpFunction pow_op(const NodeView&) {
  return [](const std::vector<Tensor>& in, RunContext&) {
    const Tensor& x = in[0];
    const Tensor e = on_device_of(in[1], x);
    if (e.numel() == 1 && !e.requires_grad() && core::is_floating(x.dtype()) && e.dim() <= x.dim())
      return std::vector<Tensor>{core::pow(x, host_doubles(e)[0])};
    if (!core::is_floating(x.dtype()) && core::is_floating(e.dtype()))  // int base, float power
      return std::vector<Tensor>{
          core::pow(x.to(core::kFloat64), e.to(core::kFloat64)).to(x.dtype())};
    return std::vector<Tensor>{core::pow(x, e)};
  };
}

OpFunction div_op(const NodeView& node) {
  const std::string where = node.where();
  return [where](const std::vector<Tensor>& in, RunContext&) {
    if (!core::is_floating(in[0].dtype()) && !core::is_floating(in[1].dtype()))
      return std::vector<Tensor>{integer_binary(in[0], in[1], "Div", false, where)};
    return std::vector<Tensor>{core::div(in[0], on_device_of(in[1], in[0]))};
  };
}

OpFunction mod_op(const NodeView& node) {
  const bool fmod = node.get_int("fmod", 0) != 0;
  const std::string where = node.where();
  return [fmod, where](const std::vector<Tensor>& in, RunContext&) {
    const Tensor& a = in[0];
    const Tensor b = on_device_of(in[1], a);
    if (!core::is_floating(a.dtype()) && !core::is_floating(b.dtype()))
      return std::vector<Tensor>{integer_binary(a, b, "Mod", fmod, where)};
    // a - b * q with q = trunc(a / b) (fmod) or floor(a / b), q computed without a gradient.
    Tensor q;
    {
      core::NoGradGuard no_grad;
      const core::Shape shape = core::broadcast_shapes(a.shape(), b.shape(), "Mod");
      std::vector<double> x = host_doubles(a.expand(shape).contiguous());
      const std::vector<double> y = host_doubles(b.expand(shape).contiguous());
      for (size_t i = 0; i < x.size(); ++i)
        x[i] = fmod ? std::trunc(x[i] / y[i]) : std::floor(x[i] / y[i]);
      q = on_device_of(Tensor::from_vector(x, shape).to(a.dtype()), a);
    }
    return std::vector<Tensor>{a - b * q};
  };
}

OpFunction gelu_op(const NodeView& node) {
  const std::string approximate = node.get_string("approximate", "none");
  if (approximate != "none" && approximate != "tanh")
    node.fail("approximate must be 'none' or 'tanh', got '" + approximate + "'");
  const auto mode =
      approximate == "tanh" ? core::GeluApproximation::Tanh : core::GeluApproximation::None;
  return [mode](const std::vector<Tensor>& in, RunContext&) {
    return std::vector<Tensor>{core::gelu(in[0], mode)};
  };
}

OpBuilder alpha_activation(double default_alpha, Tensor (*f)(const Tensor&, double)) {
  return [default_alpha, f](const NodeView& node) -> OpFunction {
    const double alpha = node.get_float("alpha", default_alpha);
    return [alpha, f](const std::vector<Tensor>& in, RunContext&) {
      return std::vector<Tensor>{f(in[0], alpha)};
    };
  };
}

Tensor leaky_relu(const Tensor& x, double alpha) {
  return core::where(positive(x), x, x * alpha);
}
Tensor elu(const Tensor& x, double alpha) {
  // exp of min(x, 0), so the unused branch cannot overflow into a NaN gradient.
  const Tensor negative = core::exp(core::minimum(x, scalar(0.0, x))) - 1.0;
  return core::where(positive(x), x, negative * alpha);
}

OpFunction selu(const NodeView& node) {
  const double alpha = node.get_float("alpha", 1.67326319217681884765625);
  const double gamma = node.get_float("gamma", 1.05070102214813232421875);
  return [alpha, gamma](const std::vector<Tensor>& in, RunContext&) {
    return std::vector<Tensor>{elu(in[0], alpha) * gamma};
  };
}

OpFunction hard_sigmoid(const NodeView& node) {
  const double alpha = node.get_float("alpha", 0.2);
  const double beta = node.get_float("beta", 0.5);
  return [alpha, beta](const std::vector<Tensor>& in, RunContext&) {
    return std::vector<Tensor>{core::clamp(in[0] * alpha + beta, 0.0, 1.0)};
  };
}

OpBuilder arg_extremum(bool max) {
  return [max](const NodeView& node) -> OpFunction {
    const int64_t axis = node.get_int("axis", 0);
    const bool keepdims = node.get_int("keepdims", 1) != 0;
    const bool last = node.get_int("select_last_index", 0) != 0;
    const std::string where = node.where();
    return [=](const std::vector<Tensor>& in, RunContext&) {
      const Tensor& x = in[0];
      const int64_t a = wrap_axis(axis, x.dim(), where);
      const Tensor signed_x = max ? x : -x;
      if (!last) return std::vector<Tensor>{core::argmax(signed_x, a, keepdims)};
      // The last extremum is the first one along the reversed axis.
      const int64_t length = x.shape()[int(a)];
      std::vector<int64_t> reversed(static_cast<size_t>(length));
      for (int64_t i = 0; i < length; ++i) reversed[size_t(i)] = length - 1 - i;
      const Tensor flipped =
          core::index_select(signed_x, a, on_device_of(int64_vector(reversed), x));
      const Tensor first = core::argmax(flipped, a, keepdims);
      return std::vector<Tensor>{core::scalar_like(double(length - 1), first) - first};
    };
  };
}

// Floor, Ceil, Round: no gradient (zero almost everywhere), computed on the host.
template <typename F>
OpBuilder rounding(F f) {
  return [f](const NodeView&) -> OpFunction {
    return [f](const std::vector<Tensor>& in, RunContext&) {
      const Tensor& x = in[0];
      if (!core::is_floating(x.dtype())) return std::vector<Tensor>{x};
      std::vector<double> values = host_doubles(x);
      for (double& v : values) v = f(v);
      return std::vector<Tensor>{
          on_device_of(Tensor::from_vector(values, x.shape()).to(x.dtype()), x)};
    };
  };
}

OpBuilder logical(int kind) {  // 0 and, 1 or, 2 xor
  return [kind](const NodeView&) -> OpFunction {
    return [kind](const std::vector<Tensor>& in, RunContext&) {
      const Tensor a = in[0].to(core::kUInt8), b = on_device_of(in[1], in[0]).to(core::kUInt8);
      Tensor out = kind == 0   ? core::minimum(a, b)
                   : kind == 1 ? core::maximum(a, b)
                               : core::ne(a, b);
      return std::vector<Tensor>{out.to(core::kBool)};
    };
  };
}

// Celu: x for x > 0, alpha (exp(x / alpha) - 1) below.
OpFunction celu(const NodeView& node) {
  const double alpha = node.get_float("alpha", 1.0);
  return [alpha](const std::vector<Tensor>& in, RunContext&) {
    const Tensor& x = in[0];
    const Tensor negative = (core::exp(core::minimum(x, scalar(0.0, x)) / alpha) - 1.0) * alpha;
    return std::vector<Tensor>{core::where(positive(x), x, negative)};
  };
}

OpFunction thresholded_relu(const NodeView& node) {
  const double alpha = node.get_float("alpha", 1.0);
  return [alpha](const std::vector<Tensor>& in, RunContext&) {
    const Tensor& x = in[0];
    return std::vector<Tensor>{core::where(core::gt(x, scalar(alpha, x)), x, scalar(0.0, x))};
  };
}

OpFunction shrink(const NodeView& node) {
  const double lambd = node.get_float("lambd", 0.5), bias = node.get_float("bias", 0.0);
  return [=](const std::vector<Tensor>& in, RunContext&) {
    const Tensor& x = in[0];
    const Tensor zero = scalar(0.0, x);
    return std::vector<Tensor>{
        core::where(core::lt(x, scalar(-lambd, x)), x + bias,
                    core::where(core::gt(x, scalar(lambd, x)), x - bias, zero))};
  };
}

OpFunction where_op(const NodeView&) {
  return [](const std::vector<Tensor>& in, RunContext&) {
    const Tensor& like = in[1];
    return std::vector<Tensor>{
        core::where(on_device_of(in[0], like), like, on_device_of(in[2], like))};
  };
}

OpFunction prelu(const NodeView&) {
  return [](const std::vector<Tensor>& in, RunContext&) {
    const Tensor& x = in[0];
    return std::vector<Tensor>{core::where(positive(x), x, x * on_device_of(in[1], x))};
  };
}

}  // namespace

void add_math_ops(OpTable& t) {
  using T = const Tensor&;  // the lambdas' parameter, short so that each row fits a line
  // Elementwise on one tensor.
  t.add("Neg", unary([](T x) { return core::neg(x); }));
  t.add("Abs", unary([](T x) { return core::abs(x); }));
  t.add("Sign", unary([](T x) { return core::sign(x); }));
  t.add("Sqrt", unary([](T x) { return core::sqrt(x); }));
  t.add("Exp", unary([](T x) { return core::exp(x); }));
  t.add("Log", unary([](T x) { return core::log(x); }));
  t.add("Erf", unary([](T x) { return core::erf(x); }));
  t.add("Sin", unary([](T x) { return core::sin(x); }));
  t.add("Cos", unary([](T x) { return core::cos(x); }));
  t.add("Reciprocal", unary([](T x) { return 1.0 / x; }));
  t.add("Floor", rounding([](double v) { return std::floor(v); }));
  t.add("Ceil", rounding([](double v) { return std::ceil(v); }));
  t.add("Round", rounding([](double v) { return std::nearbyint(v); }));  // to even
  t.add("Not", unary([](T x) {
          return core::eq(x.to(core::kUInt8), core::scalar_like(0.0, x.to(core::kUInt8)));
        }));
  t.add("IsNaN", unary([](T x) { return core::ne(x, x); }));
  // Activations.
  t.add("Relu", unary([](T x) { return core::relu(x); }));
  t.add("Sigmoid", unary([](T x) { return core::sigmoid(x); }));
  t.add("Tanh", unary([](T x) { return core::tanh(x); }));
  t.add("Softplus", unary([](T x) { return core::softplus(x); }));
  t.add("Softsign", unary([](T x) { return x / (core::abs(x) + 1.0); }));
  t.add("HardSwish", unary([](T x) { return x * core::clamp(x / 6.0 + 0.5, 0.0, 1.0); }));
  t.add("LeakyRelu", alpha_activation(0.01, leaky_relu));
  t.add("Elu", alpha_activation(1.0, elu));
  t.add("Selu", selu);
  t.add("Celu", celu);
  t.add("ThresholdedRelu", thresholded_relu);
  t.add("Shrink", shrink);
  t.add("HardSigmoid", hard_sigmoid);
  t.add("Gelu", gelu_op);
  t.add("PRelu", prelu).inputs(2, 2);
  t.add("Clip", clip).inputs(1, 3).settings_from(1);  // min, max
  // Two tensors, broadcast.
  t.add("Add", binary([](T a, T b) { return core::add(a, b); })).inputs(2, 2);
  t.add("Sub", binary([](T a, T b) { return core::sub(a, b); })).inputs(2, 2);
  t.add("Mul", binary([](T a, T b) { return core::mul(a, b); })).inputs(2, 2);
  t.add("Div", div_op).inputs(2, 2);
  t.add("Pow", pow_op).inputs(2, 2);
  t.add("Mod", mod_op).inputs(2, 2);
  t.add("Equal", binary([](T a, T b) { return core::eq(a, b); })).inputs(2, 2);
  t.add("Less", binary([](T a, T b) { return core::lt(a, b); })).inputs(2, 2);
  t.add("LessOrEqual", binary([](T a, T b) { return core::le(a, b); })).inputs(2, 2);
  t.add("Greater", binary([](T a, T b) { return core::gt(a, b); })).inputs(2, 2);
  t.add("GreaterOrEqual", binary([](T a, T b) { return core::ge(a, b); })).inputs(2, 2);
  t.add("And", logical(0)).inputs(2, 2);
  t.add("Or", logical(1)).inputs(2, 2);
  t.add("Xor", logical(2)).inputs(2, 2);
  t.add("Where", where_op).inputs(3, 3);
  // Any number of tensors, broadcast.
  t.add("Sum", variadic([](T a, T b) { return core::add(a, b); }, false)).inputs(1, kVariadic);
  t.add("Mean", variadic([](T a, T b) { return core::add(a, b); }, true)).inputs(1, kVariadic);
  t.add("Max", variadic([](T a, T b) { return core::maximum(a, b); }, false)).inputs(1, kVariadic);
  t.add("Min", variadic([](T a, T b) { return core::minimum(a, b); }, false)).inputs(1, kVariadic);
  // Products.
  t.add("Gemm", gemm).inputs(2, 3);  // C is optional from opset 11
  t.add("MatMul", binary([](T a, T b) { return core::matmul(a, b); })).inputs(2, 2);
  // Reductions: the axes are an input (a setting) from opset 13 (ReduceSum) or 18.
  t.add("ReduceSum", reduce(Reduction::Sum, 13)).inputs(1, 2).settings_from(1);
  t.add("ReduceMean", reduce(Reduction::Mean, 18)).inputs(1, 2).settings_from(1);
  t.add("ReduceMax", reduce(Reduction::Max, 18)).inputs(1, 2).settings_from(1);
  t.add("ReduceMin", reduce(Reduction::Min, 18)).inputs(1, 2).settings_from(1);
  t.add("ReduceL1", reduce(Reduction::L1, 18)).inputs(1, 2).settings_from(1);
  t.add("ReduceL2", reduce(Reduction::L2, 18)).inputs(1, 2).settings_from(1);
  t.add("ReduceSumSquare", reduce(Reduction::SumSquare, 18)).inputs(1, 2).settings_from(1);
  t.add("ReduceLogSum", reduce(Reduction::LogSum, 18)).inputs(1, 2).settings_from(1);
  t.add("ReduceLogSumExp", reduce(Reduction::LogSumExp, 18)).inputs(1, 2).settings_from(1);
  t.add("ArgMax", arg_extremum(true));
  t.add("ArgMin", arg_extremum(false));
  t.add("Softmax", softmax(false));
  t.add("LogSoftmax", softmax(true));
  t.add(kSoftmaxScaleMaskOp, softmax_scale_mask_op).inputs(1, 2);  // x, mask
}

}  // namespace mpigrad::nn::onnx_ops
