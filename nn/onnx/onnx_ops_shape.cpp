// ONNX's shape arithmetic, data movement and plumbing. Shapes, axes and indices read from
// tensors are small integer tensors, read on the host (host_ints); the data they move keeps its
// autograd history through core's view, index and cat ops.
#include <cmath>
#include <numeric>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/error.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/indexing.h"
#include "mpigrad/core/ops/join.h"
#include "mpigrad/nn/onnx/onnx_file.h"
#include "mpigrad/nn/onnx/onnx_op_table.h"

namespace mpigrad::nn::onnx_ops {

Tensor pad_tensor(const Tensor& x, const std::vector<int64_t>& begin,
                  const std::vector<int64_t>& end, const std::string& mode, double value,
                  const std::string& where) {
  MPIGRAD_CHECK(int64_t(begin.size()) == x.dim() && int64_t(end.size()) == x.dim(), where,
                ": pads for ", begin.size(), " dims on a tensor of rank ", x.dim());
  Tensor y = x;
  for (int64_t d = 0; d < x.dim(); ++d) {
    int64_t b = begin[size_t(d)], e = end[size_t(d)];
    if (b < 0 || e < 0) {  // negative pads crop
      const int64_t start = std::max<int64_t>(0, -b),
                    stop = y.shape()[int(d)] - std::max<int64_t>(0, -e);
      MPIGRAD_CHECK(stop >= start, where, ": pads crop away all of dim ", d);
      y = y.narrow(d, start, stop - start);
      b = std::max<int64_t>(0, b);
      e = std::max<int64_t>(0, e);
    }
    if (b == 0 && e == 0) continue;
    const int64_t length = y.shape()[int(d)];
    if (mode == "constant") {
      std::vector<Tensor> parts;
      auto options = core::TensorOptions(y.dtype()).device(y.device());
      core::Shape shape = y.shape();
      if (b > 0) {
        shape[int(d)] = b;
        parts.push_back(core::full(shape, value, options));
      }
      parts.push_back(y);
      if (e > 0) {
        shape[int(d)] = e;
        parts.push_back(core::full(shape, value, options));
      }
      y = core::cat(parts, d);
      continue;
    }
    MPIGRAD_CHECK(mode == "reflect" || mode == "edge", where, ": unknown pad mode '", mode,
                  "' (constant, reflect or edge)");
    MPIGRAD_CHECK(length >= 1, where, ": cannot ", mode, "-pad an empty dim");
    MPIGRAD_CHECK(mode == "edge" || (b < length && e < length), where,
                  ": reflect pads must be smaller than the dim (", length, ")");
    std::vector<int64_t> index;
    for (int64_t i = -b; i < length + e; ++i) {
      int64_t j = i;
      if (mode == "edge") {
        j = std::clamp<int64_t>(i, 0, length - 1);
      } else {
        if (j < 0) j = -j;
        if (j >= length) j = 2 * (length - 1) - j;
      }
      index.push_back(j);
    }
    y = core::index_select(y, d, on_device_of(int64_vector(index), y));
  }
  return y;
}

namespace {

using core::Tensor;

std::vector<Tensor> one(Tensor t) {
  return {std::move(t)};
}

// Axes from the attribute (before `input_opset`) or the given input.
std::vector<int64_t> axes_of(const std::optional<std::vector<int64_t>>& attribute, bool from_input,
                             const std::vector<Tensor>& in, size_t input) {
  if (from_input)
    return input < in.size() && in[input].defined() ? host_ints(in[input]) : std::vector<int64_t>{};
  return attribute.value_or(std::vector<int64_t>{});
}

OpFunction reshape(const NodeView& node) {
  const bool allow_zero = node.get_int("allowzero", 0) != 0;
  const std::string where = node.where();
  return [=](const std::vector<Tensor>& in, RunContext&) {
    const Tensor& x = in[0];
    std::vector<int64_t> shape = host_ints(in[1]);
    int64_t known = 1, infer = -1;
    for (size_t i = 0; i < shape.size(); ++i) {
      if (shape[i] == 0 && !allow_zero) {
        MPIGRAD_CHECK(int64_t(i) < x.dim(), where, ": 0 in the shape copies a dim the input lacks");
        shape[i] = x.shape()[int(i)];
      }
      if (shape[i] == -1) {
        MPIGRAD_CHECK(infer < 0, where, ": more than one -1 in the shape");
        infer = int64_t(i);
      } else {
        MPIGRAD_CHECK(shape[i] >= 0, where, ": bad target dim ", shape[i]);
        known *= shape[i];
      }
    }
    if (infer >= 0) {
      MPIGRAD_CHECK(known > 0 && x.numel() % known == 0, where, ": cannot reshape ", x.shape(),
                    " with a -1 into ", core::Shape(shape));
      shape[size_t(infer)] = x.numel() / known;
    }
    MPIGRAD_CHECK(core::Shape(shape).numel() == x.numel(), where, ": cannot reshape ", x.shape(),
                  " (", x.numel(), " elements) into ", core::Shape(shape));
    return one(x.reshape(core::Shape(shape)));
  };
}

OpFunction flatten(const NodeView& node) {
  const int64_t axis = node.get_int("axis", 1);
  const std::string where = node.where();
  return [=](const std::vector<Tensor>& in, RunContext&) {
    const Tensor& x = in[0];
    const int64_t a = axis < 0 ? axis + x.dim() : axis;
    MPIGRAD_CHECK(a >= 0 && a <= x.dim(), where, ": axis ", axis, " out of range for ", x.shape());
    int64_t rows = 1;
    for (int64_t d = 0; d < a; ++d) rows *= x.shape()[int(d)];
    const int64_t cols = rows == 0 ? 0 : x.numel() / rows;
    return one(x.reshape({rows, cols}));
  };
}

OpFunction transpose(const NodeView& node) {
  const auto perm = node.get_ints("perm");
  return [perm](const std::vector<Tensor>& in, RunContext&) {
    const Tensor& x = in[0];
    std::vector<int64_t> p = perm.value_or(std::vector<int64_t>{});
    if (p.empty())
      for (int64_t d = x.dim() - 1; d >= 0; --d) p.push_back(d);
    return one(x.permute(p));
  };
}

OpFunction squeeze(const NodeView& node) {
  const bool from_input = node.opset() >= 13;
  const auto attribute = node.get_ints("axes");
  const std::string where = node.where();
  return [=](const std::vector<Tensor>& in, RunContext&) {
    const Tensor& x = in[0];
    std::vector<int64_t> axes = axes_of(attribute, from_input, in, 1);
    if (axes.empty()) return one(x.squeeze());
    for (auto& a : axes) a = wrap_axis(a, x.dim(), where);
    std::sort(axes.rbegin(), axes.rend());
    Tensor y = x;
    for (int64_t a : axes) {
      MPIGRAD_CHECK(y.shape()[int(a)] == 1, where, ": cannot squeeze dim ", a, " of ", x.shape());
      y = y.squeeze(a);
    }
    return one(y);
  };
}

OpFunction unsqueeze(const NodeView& node) {
  const bool from_input = node.opset() >= 13;
  const auto attribute = node.get_ints("axes");
  const std::string where = node.where();
  return [=](const std::vector<Tensor>& in, RunContext&) {
    const Tensor& x = in[0];
    std::vector<int64_t> axes = axes_of(attribute, from_input, in, 1);
    const int64_t rank = x.dim() + int64_t(axes.size());
    for (auto& a : axes) a = wrap_axis(a, rank, where);
    std::sort(axes.begin(), axes.end());
    Tensor y = x;
    for (int64_t a : axes) y = y.unsqueeze(a);
    return one(y);
  };
}

OpFunction concat(const NodeView& node) {
  const int64_t axis = node.get_int("axis", 0);
  const std::string where = node.where();
  return [=](const std::vector<Tensor>& in, RunContext&) {
    std::vector<Tensor> parts;
    for (const Tensor& t : in)
      if (t.defined()) parts.push_back(on_device_of(t, in[0]));
    const int64_t a = wrap_axis(axis, parts.at(0).dim(), where);
    return one(core::cat(parts, a));
  };
}

OpFunction split(const NodeView& node) {
  const int64_t axis = node.get_int("axis", 0);
  const bool from_input = node.opset() >= 13;
  const auto attribute = node.get_ints("split");
  const int64_t outputs = node.num_outputs();
  const int64_t num_outputs = node.get_int("num_outputs", 0);
  const std::string where = node.where();
  return [=](const std::vector<Tensor>& in, RunContext&) {
    const Tensor& x = in[0];
    const int64_t a = wrap_axis(axis, x.dim(), where);
    const int64_t length = x.shape()[int(a)];
    std::vector<int64_t> sizes = axes_of(attribute, from_input, in, 1);
    if (sizes.empty()) {
      const int64_t parts = num_outputs > 0 ? num_outputs : outputs;
      const int64_t chunk = (length + parts - 1) / parts;
      for (int64_t i = 0, left = length; i < parts; ++i, left -= chunk)
        sizes.push_back(std::max<int64_t>(0, std::min(chunk, left)));
    }
    MPIGRAD_CHECK(std::accumulate(sizes.begin(), sizes.end(), int64_t(0)) == length, where,
                  ": split sizes do not add up to ", length);
    std::vector<Tensor> out;
    int64_t start = 0;
    for (int64_t size : sizes) {
      out.push_back(x.narrow(a, start, size));
      start += size;
    }
    return out;
  };
}

OpFunction slice(const NodeView& node) {
  const bool legacy = node.opset() < 10;
  const auto starts_attr = node.get_ints("starts"), ends_attr = node.get_ints("ends"),
             axes_attr = node.get_ints("axes");
  const std::string where = node.where();
  return [=](const std::vector<Tensor>& in, RunContext&) {
    const Tensor& x = in[0];
    std::vector<int64_t> starts, ends, axes, steps;
    if (legacy) {
      starts = starts_attr.value_or(std::vector<int64_t>{});
      ends = ends_attr.value_or(std::vector<int64_t>{});
      axes = axes_attr.value_or(std::vector<int64_t>{});
    } else {
      starts = host_ints(in.at(1));
      ends = host_ints(in.at(2));
      if (in.size() > 3 && in[3].defined()) axes = host_ints(in[3]);
      if (in.size() > 4 && in[4].defined()) steps = host_ints(in[4]);
    }
    MPIGRAD_CHECK(starts.size() == ends.size(), where, ": starts and ends differ in length");
    if (axes.empty())
      for (size_t i = 0; i < starts.size(); ++i) axes.push_back(int64_t(i));
    if (steps.empty()) steps.assign(starts.size(), 1);
    MPIGRAD_CHECK(axes.size() == starts.size() && steps.size() == starts.size(), where,
                  ": starts, ends, axes and steps differ in length");
    Tensor y = x;
    for (size_t i = 0; i < axes.size(); ++i) {
      const int64_t a = wrap_axis(axes[i], x.dim(), where);
      const int64_t length = y.shape()[int(a)], step = steps[i];
      MPIGRAD_CHECK(step != 0, where, ": step 0");
      int64_t start = starts[i], end = ends[i];
      if (start < 0) start += length;
      if (end < 0) end += length;
      if (step > 0) {
        start = std::clamp<int64_t>(start, 0, length);
        end = std::clamp<int64_t>(end, 0, length);
        y = y.slice(a, start, std::max(start, end), step);
      } else {
        start = std::clamp<int64_t>(start, -1, length - 1);
        end = std::clamp<int64_t>(end, -1, length - 1);
        std::vector<int64_t> index;
        for (int64_t j = start; j > end; j += step) index.push_back(j);
        y = core::index_select(y, a, on_device_of(int64_vector(index), y));
      }
    }
    return one(y);
  };
}

OpFunction gather(const NodeView& node) {
  const int64_t axis = node.get_int("axis", 0);
  const std::string where = node.where();
  return [=](const std::vector<Tensor>& in, RunContext&) {
    const Tensor& x = in[0];
    const int64_t a = wrap_axis(axis, x.dim(), where);
    const int64_t length = x.shape()[int(a)];
    Tensor index = on_device_of(in[1], x);
    if (index.dtype() != core::kInt64) index = index.to(core::kInt64);
    // Negative indices count from the end.
    if (index.device() == core::kCPU) {
      std::vector<int64_t> values = host_ints(index);
      for (auto& v : values) {
        if (v < 0) v += length;
        MPIGRAD_CHECK(v >= 0 && v < length, where, ": index out of range for dim of ", length);
      }
      index = Tensor::from_vector(values, index.shape());
    } else {
      const Tensor zero = core::scalar_like(0.0, index);
      index = core::where(core::lt(index, zero), index + double(length), index);
    }
    Tensor y = core::index_select(x, a, index.reshape({index.numel()}));
    core::Shape shape;
    for (int64_t d = 0; d < a; ++d) shape.push_back(x.shape()[int(d)]);
    for (int64_t e : index.shape()) shape.push_back(e);
    for (int64_t d = a + 1; d < x.dim(); ++d) shape.push_back(x.shape()[int(d)]);
    return one(y.reshape(shape));
  };
}

OpFunction gather_elements(const NodeView& node) {
  const int64_t axis = node.get_int("axis", 0);
  const std::string where = node.where();
  return [=](const std::vector<Tensor>& in, RunContext&) {
    const Tensor& x = in[0];
    const int64_t a = wrap_axis(axis, x.dim(), where);
    Tensor index = on_device_of(in[1], x).to(core::kInt64);
    const Tensor zero = core::scalar_like(0.0, index);
    index = core::where(core::lt(index, zero), index + double(x.shape()[int(a)]), index);
    return one(core::gather(x, a, index));
  };
}

OpFunction expand(const NodeView& node) {
  const std::string where = node.where();
  return [where](const std::vector<Tensor>& in, RunContext&) {
    Tensor x = in[0];
    const core::Shape target(host_ints(in[1]));
    const core::Shape shape = core::broadcast_shapes(x.shape(), target, "Expand");
    while (x.dim() < shape.size()) x = x.unsqueeze(0);
    return one(x.expand(shape));
  };
}

OpFunction trilu(const NodeView& node) {
  const bool upper = node.get_int("upper", 1) != 0;
  const std::string where = node.where();
  return [=](const std::vector<Tensor>& in, RunContext&) {
    const Tensor& x = in[0];
    MPIGRAD_CHECK(x.dim() >= 2, where, ": input must be at least 2-d, got ", x.shape());
    const int64_t k = in.size() > 1 && in[1].defined() ? host_ints(in[1]).at(0) : 0;
    const int64_t rows = x.shape()[x.dim() - 2], cols = x.shape()[x.dim() - 1];
    std::vector<bool> keep(size_t(rows * cols));
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j)
        keep[size_t(i * cols + j)] = upper ? j - i >= k : j - i <= k;
    const Tensor mask = on_device_of(Tensor::from_vector(keep, {rows, cols}), x);
    return one(core::where(mask, x, core::scalar_like(0.0, x)));
  };
}

OpFunction range(const NodeView&) {
  return [](const std::vector<Tensor>& in, RunContext&) {
    const double start = host_doubles(in[0]).at(0), limit = host_doubles(in[1]).at(0),
                 delta = host_doubles(in[2]).at(0);
    MPIGRAD_CHECK(delta != 0.0, "Range: delta 0");
    const int64_t n = std::max<int64_t>(0, int64_t(std::ceil((limit - start) / delta)));
    std::vector<double> values(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) values[size_t(i)] = start + double(i) * delta;
    return one(Tensor::from_vector(values, {n}).to(in[0].dtype()));
  };
}

OpFunction tile(const NodeView& node) {
  const std::string where = node.where();
  return [where](const std::vector<Tensor>& in, RunContext&) {
    const Tensor& x = in[0];
    const std::vector<int64_t> repeats = host_ints(in[1]);
    MPIGRAD_CHECK(int64_t(repeats.size()) == x.dim(), where, ": repeats has ", repeats.size(),
                  " values for a tensor of rank ", x.dim());
    // [d0, d1] -> [1, d0, 1, d1] -> expand [r0, d0, r1, d1] -> [r0 * d0, r1 * d1].
    core::Shape interleaved, expanded, out;
    for (int64_t d = 0; d < x.dim(); ++d) {
      interleaved.push_back(1);
      interleaved.push_back(x.shape()[int(d)]);
      expanded.push_back(repeats[size_t(d)]);
      expanded.push_back(x.shape()[int(d)]);
      out.push_back(repeats[size_t(d)] * x.shape()[int(d)]);
    }
    return one(x.reshape(interleaved).expand(expanded).reshape(out));
  };
}

OpFunction pad(const NodeView& node) {
  const bool legacy = node.opset() < 11;
  const std::string mode = node.get_string("mode", "constant");
  const auto pads_attr = node.get_ints(legacy ? "paddings" : "pads");
  const auto pads_attr2 = node.get_ints("pads");
  const double value_attr = node.get_float("value", 0.0);
  const std::string where = node.where();
  if (mode != "constant" && mode != "reflect" && mode != "edge")
    node.fail("pad mode '" + mode + "' is not supported (constant, reflect, edge)");
  return [=](const std::vector<Tensor>& in, RunContext&) {
    const Tensor& x = in[0];
    std::vector<int64_t> pads;
    double value = value_attr;
    std::vector<int64_t> axes;
    if (legacy) {
      pads = pads_attr2.value_or(pads_attr.value_or(std::vector<int64_t>{}));
    } else {
      pads = host_ints(in.at(1));
      if (in.size() > 2 && in[2].defined() && in[2].numel() > 0) value = host_doubles(in[2]).at(0);
      if (in.size() > 3 && in[3].defined()) axes = host_ints(in[3]);
    }
    if (axes.empty())
      for (int64_t d = 0; d < x.dim(); ++d) axes.push_back(d);
    MPIGRAD_CHECK(pads.size() == 2 * axes.size(), where, ": pads has ", pads.size(),
                  " values, expected ", 2 * axes.size());
    std::vector<int64_t> begin(size_t(x.dim()), 0), end(size_t(x.dim()), 0);
    for (size_t i = 0; i < axes.size(); ++i) {
      const int64_t a = wrap_axis(axes[i], x.dim(), where);
      begin[size_t(a)] = pads[i];
      end[size_t(a)] = pads[i + axes.size()];
    }
    return one(pad_tensor(x, begin, end, mode, value, where));
  };
}

// Where each of `out` resized positions along an axis of `length` reads from, in source
// coordinates, under ONNX's coordinate_transformation_mode `transform`.
std::vector<double> source_coordinates(const std::string& transform, int64_t out, int64_t length,
                                       double scale, const std::string& where) {
  std::vector<double> source(static_cast<size_t>(out));
  for (int64_t o = 0; o < out; ++o) {
    double s;
    if (transform == "half_pixel") {
      s = (double(o) + 0.5) / scale - 0.5;
    } else if (transform == "pytorch_half_pixel") {
      s = out > 1 ? (double(o) + 0.5) / scale - 0.5 : 0.0;
    } else if (transform == "align_corners") {
      // ONNX divides by the unrounded output length, length * scale.
      const double resized = double(length) * scale;
      s = out == 1 || resized <= 1.0 ? 0.0 : double(o) * double(length - 1) / (resized - 1.0);
    } else if (transform == "asymmetric") {
      s = double(o) / scale;
    } else if (transform == "tf_half_pixel_for_nn") {
      s = (double(o) + 0.5) / scale;
    } else {
      core::fail(where, ": coordinate_transformation_mode '", transform, "' is not supported");
    }
    source[size_t(o)] = s;
  }
  return source;
}

// Nearest: each output position copies the source index `nearest_mode` rounds to.
Tensor resize_nearest(const Tensor& y, int64_t axis, const std::vector<double>& source,
                      int64_t length, const std::string& nearest_mode) {
  std::vector<int64_t> index(source.size());
  for (size_t o = 0; o < source.size(); ++o) {
    const double s = source[o];
    double r;
    if (nearest_mode == "floor") {
      r = std::floor(s);
    } else if (nearest_mode == "ceil") {
      r = std::ceil(s);
    } else if (nearest_mode == "round_prefer_ceil") {
      r = std::floor(s + 0.5);
    } else {
      r = s - std::floor(s) == 0.5 ? std::floor(s) : std::round(s);
    }
    index[o] = std::clamp<int64_t>(int64_t(r), 0, length - 1);
  }
  return core::index_select(y, axis, on_device_of(int64_vector(index), y));
}

// Linear: each output position blends its two source neighbours.
Tensor resize_linear(const Tensor& y, int64_t axis, const std::vector<double>& source,
                     int64_t length) {
  const size_t out = source.size();
  std::vector<int64_t> lo(out), hi(out);
  std::vector<double> weight(out);
  for (size_t o = 0; o < out; ++o) {
    const double s = std::clamp(source[o], 0.0, double(length - 1));
    lo[o] = int64_t(std::floor(s));
    hi[o] = std::min(lo[o] + 1, length - 1);
    weight[o] = s - double(lo[o]);
  }
  core::Shape wshape;
  for (int64_t d = 0; d < y.dim(); ++d) wshape.push_back(d == axis ? int64_t(out) : 1);
  const Tensor w = on_device_of(Tensor::from_vector(weight, wshape).to(y.dtype()), y);
  const Tensor low = core::index_select(y, axis, on_device_of(int64_vector(lo), y));
  const Tensor high = core::index_select(y, axis, on_device_of(int64_vector(hi), y));
  return low + (high - low) * w;
}

// Resize (and the older Upsample), separably per axis: nearest picks a source index, linear
// blends the two neighbours. Both are index_selects and products, so gradients flow to x.
OpFunction resize(const NodeView& node) {
  const bool upsample = node.proto().op_type() == "Upsample";
  const std::string mode = node.get_string("mode", "nearest");
  const std::string transform =
      node.get_string("coordinate_transformation_mode",
                      upsample || node.opset() < 11 ? "asymmetric" : "half_pixel");
  // Upsample and Resize-10 pick the floor of the source coordinate.
  const std::string nearest_mode = node.get_string(
      "nearest_mode", upsample || node.opset() < 11 ? "floor" : "round_prefer_floor");
  const auto scales_attr = node.get_floats("scales");
  const auto axes_attr = node.get_ints("axes");
  const bool scales_only = upsample || node.opset() < 11;
  const std::string where = node.where();
  if (mode != "nearest" && mode != "linear" && mode != "bilinear")
    node.fail("mode '" + mode + "' is not supported (nearest, linear)");
  if (node.get_int("antialias", 0) != 0) node.fail("antialias is not supported");
  if (node.get_string("keep_aspect_ratio_policy", "stretch") != "stretch")
    node.fail("keep_aspect_ratio_policy other than stretch is not supported");
  if (transform == "tf_crop_and_resize") node.fail("tf_crop_and_resize is not supported");
  return [=](const std::vector<Tensor>& in, RunContext&) {
    const Tensor& x = in[0];
    std::vector<double> scales;
    std::vector<int64_t> sizes;
    if (scales_attr) {
      scales.assign(scales_attr->begin(), scales_attr->end());
    } else if (scales_only) {
      scales = host_doubles(in.at(1));
    } else {
      if (in.size() > 2 && in[2].defined() && in[2].numel() > 0) scales = host_doubles(in[2]);
      if (in.size() > 3 && in[3].defined() && in[3].numel() > 0) sizes = host_ints(in[3]);
    }
    std::vector<int64_t> axes = axes_attr.value_or(std::vector<int64_t>{});
    const size_t count = axes.empty() ? size_t(x.dim()) : axes.size();
    if (axes.empty())
      for (int64_t d = 0; d < x.dim(); ++d) axes.push_back(d);
    MPIGRAD_CHECK(scales.size() == count || sizes.size() == count, where,
                  ": needs one scale or size per axis (", count, ")");
    Tensor y = x;
    for (size_t i = 0; i < count; ++i) {
      const int64_t a = wrap_axis(axes[i], x.dim(), where);
      const int64_t length = x.shape()[int(a)];
      const int64_t out =
          sizes.empty() ? int64_t(std::floor(double(length) * scales[i] + 1e-9)) : sizes[i];
      const double scale = sizes.empty() ? scales[i] : double(out) / double(length);
      if (out == length && scale == 1.0) continue;
      MPIGRAD_CHECK(out >= 1 && length >= 1, where, ": resize to ", out, " along axis ", a);
      const std::vector<double> source = source_coordinates(transform, out, length, scale, where);
      y = mode == "nearest" ? resize_nearest(y, a, source, length, nearest_mode)
                            : resize_linear(y, a, source, length);
    }
    return one(y);
  };
}

OpFunction cast(const NodeView& node) {
  const core::DType to = dtype_from_onnx(int32_t(node.get_int("to", 1)), node.where());
  return [to](const std::vector<Tensor>& in, RunContext&) { return one(in[0].to(to)); };
}

OpFunction shape_op(const NodeView& node) {
  const int64_t start_attr = node.get_int("start", 0);
  const std::optional<int64_t> end_attr =
      node.has("end") ? std::optional<int64_t>(node.get_int("end", 0)) : std::nullopt;
  return [=](const std::vector<Tensor>& in, RunContext&) {
    const std::vector<int64_t> dims = in[0].shape().vec();
    const int64_t rank = int64_t(dims.size());
    int64_t start = start_attr < 0 ? start_attr + rank : start_attr;
    int64_t end = end_attr ? (*end_attr < 0 ? *end_attr + rank : *end_attr) : rank;
    start = std::clamp<int64_t>(start, 0, rank);
    end = std::clamp<int64_t>(end, start, rank);
    return one(int64_vector(std::vector<int64_t>(dims.begin() + start, dims.begin() + end)));
  };
}

OpFunction constant_of_shape(const NodeView& node) {
  const std::optional<Tensor> value = node.get_tensor("value");
  return [value](const std::vector<Tensor>& in, RunContext&) {
    const core::Shape shape(host_ints(in[0]));
    if (!value) return one(core::zeros(shape, core::kFloat32));
    return one(value->reshape({1}).expand(shape).contiguous());
  };
}

OpFunction constant(const NodeView& node) {
  Tensor value;
  if (auto t = node.get_tensor("value")) {
    value = *t;
  } else if (node.has("value_float")) {
    value = Tensor::scalar(node.get_float("value_float", 0.0), core::kFloat32);
  } else if (auto fs = node.get_floats("value_floats")) {
    value = Tensor::from_vector(*fs, {int64_t(fs->size())});
  } else if (node.has("value_int")) {
    value = Tensor::from_vector(std::vector<int64_t>{node.get_int("value_int", 0)}, core::Shape{});
  } else if (auto is = node.get_ints("value_ints")) {
    value = int64_vector(*is);
  } else {
    node.fail("Constant needs a value, value_float(s) or value_int(s) attribute");
  }
  return [value](const std::vector<Tensor>&, RunContext&) { return one(value); };
}

OpFunction cast_like(const NodeView&) {
  return [](const std::vector<Tensor>& in, RunContext&) { return one(in[0].to(in[1].dtype())); };
}

OpFunction size_op(const NodeView&) {
  return [](const std::vector<Tensor>& in, RunContext&) {
    return one(Tensor::from_vector(std::vector<int64_t>{in[0].numel()}, core::Shape{}));
  };
}

OpFunction identity(const NodeView&) {
  return [](const std::vector<Tensor>& in, RunContext&) { return one(in[0]); };
}

}  // namespace

void add_shape_ops(OpTable& t) {
  // The second input (and any after it) of most shape ops is a setting: a shape, axes, sizes.
  t.add("Reshape", reshape).inputs(2, 2).settings_from(1);
  t.add("Flatten", flatten);
  t.add("Transpose", transpose);
  t.add("Squeeze", squeeze).inputs(1, 2).settings_from(1);  // axes from 13
  t.add("Unsqueeze", unsqueeze).inputs(1, 2).settings_from(1);
  t.add("Expand", expand).inputs(2, 2).settings_from(1);
  t.add("Tile", tile).inputs(2, 2).settings_from(1);
  t.add("Trilu", trilu).inputs(1, 2).settings_from(1);  // k
  // Data movement.
  t.add("Concat", concat).inputs(1, kVariadic);
  t.add("Split", split).inputs(1, 2).settings_from(1);  // sizes from 13
  t.add("Slice", slice).inputs(1, 5).settings_from(1);  // inputs from 10
  t.add("Gather", gather).inputs(2, 2);
  t.add("GatherElements", gather_elements).inputs(2, 2);
  t.add("Pad", pad).inputs(1, 4).settings_from(1);          // pads, value, axes
  t.add("Resize", resize).inputs(1, 4).settings_from(1);    // roi, scales, sizes
  t.add("Upsample", resize).inputs(1, 2).settings_from(1);  // scales from 9
  // Dtypes and plumbing.
  t.add("Cast", cast);
  t.add("CastLike", cast_like).inputs(2, 2);
  t.add("Identity", identity);
  t.add("Size", size_op);
  // Values made from shapes and numbers alone: every input is a setting.
  t.add("Shape", shape_op).settings_from(0);
  t.add("ConstantOfShape", constant_of_shape).settings_from(0);
  t.add("Range", range).inputs(3, 3).settings_from(0);
  t.add("Constant", constant).inputs(0, 0);
}

}  // namespace mpigrad::nn::onnx_ops
