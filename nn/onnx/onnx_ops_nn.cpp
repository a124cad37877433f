// ONNX's convolution, pooling, normalization and dropout, on nn::functional and core ops.
// Conv and pooling run 1-d and 2-d input through the 2-d kernels (1-d as height 1), with the
// node's attributes read once at load; pads the 2-d kernels cannot express (asymmetric ones,
// auto_pad SAME_*, ceil_mode) are applied by pad_tensor first.
#include <cmath>
#include <limits>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/error.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/indexing.h"
#include "mpigrad/core/ops/join.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/core/rng.h"
#include "mpigrad/nn/functional/conv.h"
#include "mpigrad/nn/functional/dropout.h"
#include "mpigrad/nn/functional/normalization.h"
#include "mpigrad/nn/functional/pooling.h"
#include "mpigrad/nn/onnx/onnx_op_table.h"

namespace mpigrad::nn::onnx_ops {

namespace {

using core::Tensor;

// The spatial geometry of a Conv or pooling node, resolved per input shape.
struct Window {
  std::vector<int64_t> kernel, strides, dilations, pads;  // pads: begins then ends
  std::string auto_pad = "NOTSET";
  bool ceil_mode = false;
};

Window read_window(const NodeView& node, int64_t spatial_hint) {
  Window w;
  w.kernel = node.get_ints("kernel_shape").value_or(std::vector<int64_t>{});
  int64_t n = w.kernel.empty() ? spatial_hint : int64_t(w.kernel.size());
  w.strides = node.get_ints("strides").value_or(std::vector<int64_t>{});
  w.dilations = node.get_ints("dilations").value_or(std::vector<int64_t>{});
  w.pads = node.get_ints("pads").value_or(std::vector<int64_t>{});
  w.auto_pad = node.get_string("auto_pad", "NOTSET");
  w.ceil_mode = node.get_int("ceil_mode", 0) != 0;
  if (n > 2) node.fail("only 1-d and 2-d windows are supported, got " + std::to_string(n) + "-d");
  if (w.auto_pad != "NOTSET" && w.auto_pad != "VALID" && w.auto_pad != "SAME_UPPER" &&
      w.auto_pad != "SAME_LOWER")
    node.fail("unknown auto_pad '" + w.auto_pad + "'");
  return w;
}

// Spatial pads (begin, end) for input extents `in` and kernel `k`.
void resolve_pads(const Window& w, const std::vector<int64_t>& in, const std::vector<int64_t>& k,
                  const std::vector<int64_t>& s, const std::vector<int64_t>& d,
                  std::vector<int64_t>& begin, std::vector<int64_t>& end,
                  const std::string& where) {
  const size_t n = in.size();
  begin.assign(n, 0);
  end.assign(n, 0);
  if (w.auto_pad == "SAME_UPPER" || w.auto_pad == "SAME_LOWER") {
    for (size_t i = 0; i < n; ++i) {
      const int64_t out = (in[i] + s[i] - 1) / s[i];
      const int64_t total = std::max<int64_t>(0, (out - 1) * s[i] + (k[i] - 1) * d[i] + 1 - in[i]);
      begin[i] = w.auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
      end[i] = total - begin[i];
    }
  } else if (w.auto_pad == "NOTSET" && !w.pads.empty()) {
    MPIGRAD_CHECK(w.pads.size() == 2 * n, where, ": pads has ", w.pads.size(), " values, expected ",
                  2 * n);
    for (size_t i = 0; i < n; ++i) {
      begin[i] = w.pads[i];
      end[i] = w.pads[i + n];
      MPIGRAD_CHECK(begin[i] >= 0 && end[i] >= 0, where, ": negative pads");
    }
  }
  if (w.ceil_mode) {
    for (size_t i = 0; i < n; ++i) {
      const int64_t span = in[i] + begin[i] + end[i] - ((k[i] - 1) * d[i] + 1);
      if (span < 0) continue;
      int64_t out = (span + s[i] - 1) / s[i] + 1;
      // The last window must start inside the input or the begin pad (as in PyTorch).
      if ((out - 1) * s[i] >= in[i] + begin[i]) --out;
      end[i] += std::max<int64_t>(
          0, (out - 1) * s[i] + (k[i] - 1) * d[i] + 1 - (in[i] + begin[i] + end[i]));
    }
  }
}

std::vector<int64_t> spatial_of(const Tensor& x) {
  return std::vector<int64_t>(x.shape().begin() + 2, x.shape().end());
}

std::vector<int64_t> or_ones(const std::vector<int64_t>& v, size_t n) {
  return v.empty() ? std::vector<int64_t>(n, 1) : v;
}

// [N, C, L] as [N, C, 1, L]; 2-d input unchanged.
Tensor as_2d(const Tensor& x) {
  return x.dim() == 3 ? x.unsqueeze(2) : x;
}
std::array<int64_t, 2> pair_of(const std::vector<int64_t>& v, int64_t fill) {
  return v.size() == 1 ? std::array<int64_t, 2>{fill, v[0]} : std::array<int64_t, 2>{v[0], v[1]};
}

// Pads the spatial dims of x (all other dims 0).
Tensor pad_spatial(const Tensor& x, const std::vector<int64_t>& begin,
                   const std::vector<int64_t>& end, double value, const std::string& where) {
  std::vector<int64_t> b(2, 0), e(2, 0);
  b.insert(b.end(), begin.begin(), begin.end());
  e.insert(e.end(), end.begin(), end.end());
  return pad_tensor(x, b, e, "constant", value, where);
}

OpFunction conv(const NodeView& node) {
  const Window w = read_window(node, 2);
  const int64_t groups = node.get_int("group", 1);
  const std::string where = node.where();
  return [w, groups, where](const std::vector<Tensor>& in, RunContext&) {
    const Tensor& x = in[0];
    const Tensor weight = on_device_of(in[1], x);
    MPIGRAD_CHECK(x.dim() == 3 || x.dim() == 4, where, ": input must be 3-d or 4-d, got ",
                  x.shape());
    MPIGRAD_CHECK(weight.dim() == x.dim(), where, ": weight ", weight.shape(),
                  " does not fit input ", x.shape());
    const size_t n = size_t(x.dim() - 2);
    const std::vector<int64_t> k(weight.shape().begin() + 2, weight.shape().end());
    const auto s = or_ones(w.strides, n), d = or_ones(w.dilations, n);
    std::vector<int64_t> begin, end;
    resolve_pads(w, spatial_of(x), k, s, d, begin, end, where);
    Tensor input = as_2d(x);
    functional::Conv2dOptions options;
    options.stride = pair_of(s, 1);
    options.dilation = pair_of(d, 1);
    options.groups = groups;
    if (begin == end) {
      options.padding = pair_of(begin, 0);
    } else {
      input = as_2d(pad_spatial(x, begin, end, 0.0, where));
    }
    const Tensor bias = in.size() > 2 ? on_device_of(in[2], x) : Tensor();
    Tensor y = functional::conv2d(input, as_2d(weight), bias, options);
    return std::vector<Tensor>{x.dim() == 3 ? y.squeeze(2) : y};
  };
}

// ConvTranspose as a convolution: the input with (stride - 1) zeros between elements, padded by
// dilation * (k - 1) - pad on each side, convolved with the flipped kernel whose in/out channel
// axes are swapped within each group.
OpFunction conv_transpose(const NodeView& node) {
  const Window w = read_window(node, 2);
  const int64_t groups = node.get_int("group", 1);
  const auto output_padding = node.get_ints("output_padding").value_or(std::vector<int64_t>{});
  const auto output_shape = node.get_ints("output_shape").value_or(std::vector<int64_t>{});
  const std::string where = node.where();
  return [=](const std::vector<Tensor>& in, RunContext&) {
    const Tensor& x = in[0];
    const Tensor weight = on_device_of(in[1], x);
    MPIGRAD_CHECK(x.dim() == 3 || x.dim() == 4, where, ": input must be 3-d or 4-d, got ",
                  x.shape());
    const size_t n = size_t(x.dim() - 2);
    const std::vector<int64_t> k(weight.shape().begin() + 2, weight.shape().end());
    const auto s = or_ones(w.strides, n), d = or_ones(w.dilations, n);
    std::vector<int64_t> out_pad =
        output_padding.empty() ? std::vector<int64_t>(n, 0) : output_padding;
    std::vector<int64_t> begin(n, 0), end(n, 0);
    const auto in_sp = spatial_of(x);
    if (!output_shape.empty() || w.auto_pad == "SAME_UPPER" || w.auto_pad == "SAME_LOWER") {
      for (size_t i = 0; i < n; ++i) {
        const int64_t want =
            !output_shape.empty() ? output_shape[output_shape.size() - n + i] : in_sp[i] * s[i];
        const int64_t total = s[i] * (in_sp[i] - 1) + out_pad[i] + (k[i] - 1) * d[i] + 1 - want;
        const bool upper = w.auto_pad != "SAME_LOWER";
        begin[i] = upper ? total / 2 : total - total / 2;
        end[i] = total - begin[i];
      }
    } else if (!w.pads.empty()) {
      for (size_t i = 0; i < n; ++i) {
        begin[i] = w.pads[i];
        end[i] = w.pads[i + n];
      }
    }
    // Zeros between the elements: [.., L] -> [.., L, s] -> [.., L * s] -> first (L-1)*s+1.
    Tensor y = x;
    for (size_t i = 0; i < n; ++i) {
      if (s[i] == 1) continue;
      const int64_t dim = int64_t(2 + i);
      Tensor expanded = y.unsqueeze(dim + 1);
      core::Shape pad_shape = expanded.shape();
      pad_shape[int(dim + 1)] = s[i] - 1;
      Tensor zeros = core::zeros(pad_shape, core::TensorOptions(y.dtype()).device(y.device()));
      Tensor joined = core::cat({expanded, zeros}, dim + 1);
      core::Shape merged = y.shape();
      merged[int(dim)] = y.shape()[int(dim)] * s[i];
      y = joined.reshape(merged).narrow(dim, 0, (in_sp[i] - 1) * s[i] + 1);
    }
    std::vector<int64_t> pb(n), pe(n);
    for (size_t i = 0; i < n; ++i) {
      pb[i] = d[i] * (k[i] - 1) - begin[i];
      pe[i] = d[i] * (k[i] - 1) - end[i] + out_pad[i];
    }
    y = pad_spatial(y, pb, pe, 0.0, where);
    // weight [C_in, C_out/g, k...] -> [C_out, C_in/g, k...], flipped in space.
    const int64_t c_in = weight.shape()[0], c_out_g = weight.shape()[1];
    core::Shape grouped{groups, c_in / groups, c_out_g};
    for (int64_t e : k) grouped.push_back(e);
    Tensor wt = weight.reshape(grouped).transpose(1, 2);
    core::Shape flat{groups * c_out_g, c_in / groups};
    for (int64_t e : k) flat.push_back(e);
    wt = wt.reshape(flat);
    for (size_t i = 0; i < n; ++i) {
      std::vector<int64_t> reversed(static_cast<size_t>(k[i]), 0);
      for (int64_t j = 0; j < k[i]; ++j) reversed[size_t(j)] = k[i] - 1 - j;
      wt = core::index_select(wt, int64_t(2 + i), on_device_of(int64_vector(reversed), wt));
    }
    functional::Conv2dOptions options;
    options.dilation = pair_of(d, 1);
    options.groups = groups;
    const Tensor bias = in.size() > 2 ? on_device_of(in[2], x) : Tensor();
    Tensor out = functional::conv2d(as_2d(y), as_2d(wt), bias, options);
    return std::vector<Tensor>{x.dim() == 3 ? out.squeeze(2) : out};
  };
}

OpBuilder pool(bool max) {
  return [max](const NodeView& node) -> OpFunction {
    const Window w = read_window(node, 2);
    if (w.kernel.empty()) node.fail("kernel_shape is required");
    if (max && node.num_outputs() > 1 && !node.proto().output(1).empty())
      node.fail("the Indices output of MaxPool is not supported");
    const bool include_pad = node.get_int("count_include_pad", 0) != 0;
    const std::string where = node.where();
    return [=](const std::vector<Tensor>& in, RunContext&) {
      const Tensor& x = in[0];
      MPIGRAD_CHECK(size_t(x.dim()) == w.kernel.size() + 2, where, ": input ", x.shape(),
                    " does not fit a ", w.kernel.size(), "-d window");
      const size_t n = w.kernel.size();
      const auto s = or_ones(w.strides, n), d = or_ones(w.dilations, n);
      std::vector<int64_t> begin, end;
      resolve_pads(w, spatial_of(x), w.kernel, s, d, begin, end, where);
      functional::Pool2dOptions options;
      options.kernel_size = pair_of(w.kernel, 1);
      options.stride = pair_of(s, 1);
      options.dilation = pair_of(d, 1);
      options.count_include_pad = include_pad;
      bool symmetric = begin == end && !w.ceil_mode;
      // The 2-d kernels take at most half the window as padding.
      for (size_t i = 0; i < n && symmetric; ++i) symmetric = 2 * begin[i] <= w.kernel[i];
      Tensor y;
      if (max) {
        // Integer input pools exactly in float64 (the kernels are floating only).
        const bool integer = !core::is_floating(x.dtype());
        Tensor input = integer ? x.to(core::kFloat64) : x;
        if (symmetric) {
          options.padding = pair_of(begin, 0);
        } else {
          input = pad_spatial(input, begin, end, -std::numeric_limits<double>::infinity(), where);
        }
        y = functional::max_pool2d(as_2d(input), options);
        if (integer) y = y.to(x.dtype());
      } else if (symmetric) {
        options.padding = pair_of(begin, 0);
        y = functional::avg_pool2d(as_2d(x), options);
      } else {
        // Sums over the zero-padded input divided by the count of the cells that count.
        Tensor counted;
        {
          core::NoGradGuard no_grad;
          std::vector<int64_t> ceil_begin(n, 0), ceil_end(n, 0);
          Window plain = w;
          plain.ceil_mode = false;
          std::vector<int64_t> b0, e0;
          resolve_pads(plain, spatial_of(x), w.kernel, s, d, b0, e0, where);
          for (size_t i = 0; i < n; ++i) ceil_end[i] = end[i] - e0[i];
          Tensor ones = core::ones(x.shape(), core::TensorOptions(x.dtype()).device(x.device()));
          Tensor mask = pad_spatial(ones, b0, e0, include_pad ? 1.0 : 0.0, where);
          mask = pad_spatial(mask, ceil_begin, ceil_end, 0.0, where);
          counted = functional::avg_pool2d(as_2d(mask), options);
        }
        Tensor sums =
            functional::avg_pool2d(as_2d(pad_spatial(x, begin, end, 0.0, where)), options);
        y = sums / counted;
      }
      return std::vector<Tensor>{x.dim() == 3 ? y.squeeze(2) : y};
    };
  };
}

OpBuilder global_pool(bool max) {
  return [max](const NodeView&) -> OpFunction {
    return [max](const std::vector<Tensor>& in, RunContext&) {
      const Tensor& x = in[0];
      std::vector<int64_t> dims;
      for (int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);
      if (!max) return std::vector<Tensor>{core::mean(x, dims, true)};
      Tensor y = x;
      for (auto it = dims.rbegin(); it != dims.rend(); ++it) y = core::max(y, *it, true).values;
      return std::vector<Tensor>{y};
    };
  };
}

// (x - mean) / sqrt(var + eps) over `dims`, the biased variance, as ONNX's normalizations.
Tensor normalize(const Tensor& x, const std::vector<int64_t>& dims, double eps) {
  const Tensor centered = x - core::mean(x, dims, true);
  const Tensor var = core::mean(centered * centered, dims, true);
  return centered * core::rsqrt(var + eps);
}

OpFunction layer_norm(const NodeView& node) {
  const int64_t axis = node.get_int("axis", -1);
  const double eps = node.get_float("epsilon", 1e-5);
  const std::string where = node.where();
  const bool wants_statistics = node.num_outputs() > 1;
  return [=](const std::vector<Tensor>& in, RunContext&) {
    const Tensor& x = in[0];
    const int64_t a = wrap_axis(axis, x.dim(), where);
    std::vector<int64_t> normalized(x.shape().begin() + a, x.shape().end());
    const Tensor scale = on_device_of(in[1], x);
    const Tensor bias = in.size() > 2 ? on_device_of(in[2], x) : Tensor();
    const bool fused = scale.shape().vec() == normalized &&
                       (!bias.defined() || bias.shape().vec() == normalized) &&
                       (x.dtype() == core::kFloat32 || x.dtype() == core::kFloat64);
    if (fused && !wants_statistics)
      return std::vector<Tensor>{functional::layer_norm(x, normalized, scale, bias, eps)};
    std::vector<int64_t> dims;
    for (int64_t d = a; d < x.dim(); ++d) dims.push_back(d);
    const Tensor mean = core::mean(x, dims, true);
    const Tensor centered = x - mean;
    const Tensor inv_std = core::rsqrt(core::mean(centered * centered, dims, true) + eps);
    Tensor y = centered * inv_std * scale;
    if (bias.defined()) y = y + bias;
    return std::vector<Tensor>{y, mean, inv_std};
  };
}

// [C] as [C, 1, ..., 1] against an [N, C, ...] input.
Tensor per_channel(const Tensor& t, const Tensor& x) {
  core::Shape shape{t.numel()};
  for (int64_t d = 2; d < x.dim(); ++d) shape.push_back(1);
  return on_device_of(t, x).reshape(shape);
}

OpFunction instance_norm(const NodeView& node) {
  const double eps = node.get_float("epsilon", 1e-5);
  return [eps](const std::vector<Tensor>& in, RunContext&) {
    const Tensor& x = in[0];
    std::vector<int64_t> dims;
    for (int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);
    return std::vector<Tensor>{normalize(x, dims, eps) * per_channel(in[1], x) +
                               per_channel(in[2], x)};
  };
}

OpFunction group_norm(const NodeView& node) {
  const double eps = node.get_float("epsilon", 1e-5);
  const int64_t groups = node.get_int("num_groups", 0);
  if (groups < 1) node.fail("num_groups must be >= 1");
  const std::string where = node.where();
  return [=](const std::vector<Tensor>& in, RunContext&) {
    const Tensor& x = in[0];
    const int64_t channels = x.shape()[1];
    MPIGRAD_CHECK(channels % groups == 0, where, ": ", channels, " channels do not split into ",
                  groups, " groups");
    Tensor grouped = normalize(x.reshape({x.shape()[0], groups, -1}), {2}, eps);
    const Tensor scale = on_device_of(in[1], x), bias = on_device_of(in[2], x);
    if (scale.numel() == groups) {  // opset 18: one scale and bias per group
      grouped = grouped * scale.reshape({1, groups, 1}) + bias.reshape({1, groups, 1});
      return std::vector<Tensor>{grouped.reshape(x.shape())};
    }
    Tensor y = grouped.reshape(x.shape());
    return std::vector<Tensor>{y * per_channel(scale, x) + per_channel(bias, x)};
  };
}

// A BatchNormalization whose statistics are not a layer's (graph inputs, or names that do not
// match P.weight...): runs functionally; in training its mean and var are updated in place.
OpFunction batch_norm(const NodeView& node) {
  const double eps = node.get_float("epsilon", 1e-5);
  const double momentum = node.get_float("momentum", 0.9);
  return [=](const std::vector<Tensor>& in, RunContext& context) {
    const Tensor& x = in[0];
    const Tensor mean = on_device_of(in[3], x), var = on_device_of(in[4], x);
    Tensor y = functional::batch_norm(x, mean, var, on_device_of(in[1], x), on_device_of(in[2], x),
                                      context.training, 1.0 - momentum, eps);
    return std::vector<Tensor>{y, mean, var};
  };
}

OpFunction dropout(const NodeView& node) {
  const bool legacy = node.opset() < 12;
  const double ratio_attr = node.get_float("ratio", 0.5);
  const bool wants_mask = node.num_outputs() > 1 && !node.proto().output(1).empty();
  const std::string where = node.where();
  return [=](const std::vector<Tensor>& in, RunContext& context) {
    const Tensor& x = in[0];
    double ratio = ratio_attr;
    if (!legacy && in.size() > 1 && in[1].defined()) ratio = host_doubles(in[1]).at(0);
    MPIGRAD_CHECK(ratio >= 0.0 && ratio < 1.0, where, ": ratio ", ratio, " is outside [0, 1)");
    MPIGRAD_CHECK(context.generator != nullptr, where, ": no dropout generator");
    const bool active = context.training && ratio > 0.0;
    if (!wants_mask)
      return std::vector<Tensor>{functional::dropout(x, ratio, active, *context.generator)};
    const auto options = core::TensorOptions(x.dtype()).device(x.device());
    Tensor keep;
    {
      core::NoGradGuard no_grad;
      keep = active ? core::bernoulli(x.shape(), 1.0 - ratio, *context.generator, options)
                    : core::ones(x.shape(), options);
    }
    Tensor y = active ? x * keep * (1.0 / (1.0 - ratio)) : x;
    return std::vector<Tensor>{y, core::ne(keep, core::scalar_like(0.0, keep))};
  };
}

}  // namespace

void add_nn_ops(OpTable& t) {
  t.add("Conv", conv).inputs(2, 3);  // x, weight, optional bias
  t.add("ConvTranspose", conv_transpose).inputs(2, 3);
  t.add("MaxPool", pool(true));
  t.add("AveragePool", pool(false));
  t.add("GlobalAveragePool", global_pool(false));
  t.add("GlobalMaxPool", global_pool(true));
  // Normalization and dropout follow train()/eval(), so they never run at load.
  t.add("BatchNormalization", batch_norm).inputs(5, 5).not_foldable();
  t.add("LayerNormalization", layer_norm).inputs(2, 3);
  t.add("InstanceNormalization", instance_norm).inputs(3, 3);
  t.add("GroupNormalization", group_norm).inputs(3, 3);
  // ratio and training_mode are inputs from opset 12.
  t.add("Dropout", dropout).inputs(1, 3).settings_from(1).not_foldable();
}

}  // namespace mpigrad::nn::onnx_ops
