// Gathering and scattering by index tuples and along an axis: ScatterElements, ScatterND and
// GatherND, what graph networks (message passing over an edge list, interatomic potentials) are
// exported to. Each is built from core's differentiable indexing ops (index_select, index_add,
// scatter_add), so its derivatives of every order come from theirs.
//
// A scatter without a reduction writes each update to its position. Where two updates name the
// same position the result depends on their order, and PyTorch's legacy exporter writes
// index_add (a sum) this way, so a model exported so would silently lose all but one addend: a
// repeated position is an error naming the node.
//
// Reductions: add is one index_add or scatter_add. mul, max and min are one core::scatter_reduce
// over each update's flat position in the data (float32, float64, int32, int64: atomics on a
// GPU, no trip to the host); for other dtypes they are planned on the host from the index values,
// then run as differentiable ops: max and min route each position's winner (the data's own
// value, or the first extreme update) with where and index_select, so the gradient reaches the
// winner only; mul multiplies the data by one factor per round, where a round holds at most one
// update per position. Both give the same values and the same winners.
//
// mpigrad.GatherMulScatter is the node onnx_fusion_message.cpp writes for a message-passing
// chain: core::gather_mul_scatter when the shapes it meets fit that op, else the chain itself;
// mpigrad.EdgePairs pairs the reverse edges of a neighbor list for it.
#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/enum_names.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/indexing.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/nn/atomistic.h"
#include "mpigrad/nn/onnx/onnx_fusion.h"
#include "mpigrad/nn/onnx/onnx_op_table.h"

namespace mpigrad::nn::onnx_ops {

namespace {

enum class Reduction { None, Add, Mul, Max, Min };
inline constexpr core::EnumName<Reduction> kReductionNames[] = {{Reduction::None, "none"},
                                                                {Reduction::Add, "add"},
                                                                {Reduction::Mul, "mul"},
                                                                {Reduction::Max, "max"},
                                                                {Reduction::Min, "min"}};

Reduction reduction_of(const NodeView& node) {
  return core::parse_enum(node.get_string("reduction", "none"), kReductionNames,
                          node.where() + ": reduction");
}

// `index` as int64 on `like`'s device, negative entries counted from the end of `extent`.
Tensor wrapped(const Tensor& index_in, const Tensor& like, const Tensor& extent) {
  core::NoGradGuard no_grad;
  Tensor index = on_device_of(index_in, like).to(core::kInt64);
  const Tensor zero = core::scalar_like(0.0, index);
  return core::where(core::lt(index, zero), index + extent, index);
}

// Fails naming the node when a position in `positions` (int64, any shape) repeats: a scatter
// without a reduction would keep only one of the updates written there.
void check_unique(const Tensor& positions, const std::string& where) {
  std::vector<int64_t> values = host_ints(positions);
  std::sort(values.begin(), values.end());
  const auto repeated = std::adjacent_find(values.begin(), values.end());
  if (repeated == values.end()) return;
  core::fail(where, ": reduction 'none' with a repeated index (flat position ", *repeated,
             " is written more than once), so all but one update would be lost. PyTorch's legacy "
             "exporter writes index_add this way; export with scatter_add (reduction 'add') or "
             "the default (dynamo) exporter");
}

// base with `updates` written where `scatter(zeros, updates)` puts them: base where nothing is
// written, the update where one is (positions unique). Differentiable in both.
Tensor overwrite(const Tensor& base, const Tensor& written, const Tensor& counts) {
  const Tensor kept = core::sub(core::scalar_like(1.0, counts), counts);
  return core::add(core::mul(base, kept), written);
}

// data (flattened) with `updates` (flattened) reduced into the positions `targets` (int64, one
// per update) by mul, max or min; see the top of the file.
Tensor reduce_into(const Tensor& data, const Tensor& updates, const Tensor& targets,
                   Reduction reduction) {
  const core::DType dtype = core::promote_types(data.dtype(), updates.dtype());
  if (dtype == core::kFloat32 || dtype == core::kFloat64 || dtype == core::kInt32 ||
      dtype == core::kInt64) {
    const core::ScatterReduceOp op = reduction == Reduction::Mul   ? core::ScatterReduceOp::Mul
                                     : reduction == Reduction::Max ? core::ScatterReduceOp::Max
                                                                   : core::ScatterReduceOp::Min;
    return core::scatter_reduce(data, 0, targets, updates, op);
  }
  const std::vector<int64_t> where_to = host_ints(targets);
  if (reduction == Reduction::Mul) {
    // Round r takes the r-th update of each position: its factor is the update there, 1 elsewhere.
    std::vector<std::vector<int64_t>> rounds;  // per round: update index, or -1
    std::vector<int64_t> seen(size_t(data.numel()), 0);
    for (size_t i = 0; i < where_to.size(); ++i) {
      const size_t round = size_t(seen[size_t(where_to[i])]++);
      if (rounds.size() <= round) rounds.emplace_back();
      rounds[round].push_back(int64_t(i));
    }
    Tensor result = data;
    const Tensor ones = core::ones_like(data).detach();
    for (const std::vector<int64_t>& round : rounds) {
      std::vector<int64_t> positions;
      for (int64_t i : round) positions.push_back(where_to[size_t(i)]);
      const Tensor chosen = core::index_select(updates, 0, int64_vector(round).to(data.device()));
      const Tensor at = int64_vector(positions).to(data.device());
      const Tensor counts =
          core::index_add(core::zeros_like(data).detach(), 0, at, core::ones_like(chosen).detach());
      const Tensor factor =
          overwrite(ones, core::index_add(core::zeros_like(data), 0, at, chosen), counts);
      result = core::mul(result, factor);
    }
    return result;
  }
  // max, min: each position's winner, the data's value unless an update beats it (the first
  // extreme one on ties).
  const std::vector<double> data_values = host_doubles(data);
  const std::vector<double> update_values = host_doubles(updates);
  std::vector<double> best = data_values;
  std::vector<int64_t> winner(size_t(data.numel()), -1);
  for (size_t i = 0; i < where_to.size(); ++i) {
    const size_t p = size_t(where_to[i]);
    const double v = update_values[i];
    if (reduction == Reduction::Max ? v > best[p] : v < best[p]) {
      best[p] = v;
      winner[p] = int64_t(i);
    }
  }
  std::vector<int64_t> picked;
  std::vector<uint8_t> won;
  for (int64_t w : winner) {
    picked.push_back(std::max<int64_t>(w, 0));
    won.push_back(w >= 0 ? 1 : 0);
  }
  const Tensor from_updates =
      core::index_select(updates, 0, int64_vector(picked).to(data.device()));
  const Tensor mask =
      core::Tensor::from_vector(won, data.shape()).to(data.device()).to(core::kBool);
  return core::where(mask, from_updates, data);
}

OpFunction scatter_elements(const NodeView& node) {
  const int64_t axis = node.get_int("axis", 0);
  const Reduction reduction = reduction_of(node);
  const std::string where = node.where();
  return [=](const std::vector<Tensor>& in, RunContext&) {
    const Tensor& data = in[0];
    const Tensor& updates = in[2];
    const int64_t a = wrap_axis(axis, data.dim(), where);
    const Tensor extent = core::scalar_like(double(data.shape()[int(a)]), in[1]);
    const Tensor index = wrapped(in[1], data, extent.to(data.device()));
    if (reduction == Reduction::Add)
      return std::vector<Tensor>{core::scatter_add(data, a, index, updates)};
    // Each update's flat position in data: its own position with the axis coordinate replaced.
    Tensor flat;
    {
      core::NoGradGuard no_grad;
      const Tensor positions =
          core::arange(data.numel(), core::TensorOptions(core::kInt64).device(data.device()))
              .reshape(data.shape());
      flat = core::gather(positions, a, index);
    }
    if (reduction != Reduction::None) {
      const Tensor reduced =
          reduce_into(data.reshape({-1}), updates.reshape({-1}), flat.reshape({-1}), reduction);
      return std::vector<Tensor>{reduced.reshape(data.shape())};
    }
    check_unique(flat, where);
    const Tensor zeros = core::zeros_like(data);
    const Tensor counts =
        core::scatter_add(zeros.detach(), a, index, core::ones_like(updates).detach());
    return std::vector<Tensor>{
        overwrite(data, core::scatter_add(zeros, a, index, updates), counts)};
  };
}

// The rows of `data` viewed as [prod(shape[:first + k]) ... ]: for each index tuple of the last
// dim of `indices` (addressing dims first .. first + k - 1 of data, below `first` batch dims
// that indices shares), its row in data.reshape([-1, prod(shape[first + k:])]).
Tensor flat_rows(const Tensor& data, const Tensor& indices_in, int64_t batch_dims,
                 const std::string& where) {
  core::NoGradGuard no_grad;
  MPIGRAD_CHECK(indices_in.dim() >= 1, where, ": indices must have at least one dim");
  const int64_t k = indices_in.shape()[indices_in.dim() - 1];
  MPIGRAD_CHECK(k >= 1 && batch_dims + k <= data.dim(), where, ": index tuples of ", k,
                " entries (after ", batch_dims, " batch dims) do not fit data of shape ",
                data.shape());
  MPIGRAD_CHECK(indices_in.dim() - 1 >= batch_dims, where, ": indices of shape ",
                indices_in.shape(), " have fewer than batch_dims = ", batch_dims, " leading dims");
  for (int64_t d = 0; d < batch_dims; ++d) {
    MPIGRAD_CHECK(indices_in.shape()[int(d)] == data.shape()[int(d)], where, ": batch dim ", d,
                  " of indices ", indices_in.shape(), " differs from data ", data.shape());
  }
  const core::TensorOptions longs = core::TensorOptions(core::kInt64).device(data.device());
  Tensor indices = on_device_of(indices_in, data).to(core::kInt64);
  // Each coordinate wrapped against its dim, then weighted by that dim's stride in the block.
  std::vector<int64_t> extents, strides(size_t(k), 1);
  for (int64_t j = 0; j < k; ++j) extents.push_back(data.shape()[int(batch_dims + j)]);
  for (int64_t j = k - 2; j >= 0; --j)
    strides[size_t(j)] = strides[size_t(j + 1)] * extents[size_t(j + 1)];
  const Tensor extent = int64_vector(extents).to(data.device());
  indices =
      core::where(core::lt(indices, core::scalar_like(0.0, indices)), indices + extent, indices);
  const Tensor bad = core::lt(indices, core::scalar_like(0.0, indices)).to(core::kInt64) +
                     core::ge(indices, extent).to(core::kInt64);
  MPIGRAD_CHECK(core::sum(bad).item<int64_t>() == 0, where,
                ": an index tuple is out of range for data of shape ", data.shape());
  Tensor rows = core::sum(indices * int64_vector(strides).to(data.device()), {-1});
  int64_t block = 1;
  for (int64_t e : extents) block *= e;
  int64_t batches = 1;
  for (int64_t d = 0; d < batch_dims; ++d) batches *= data.shape()[int(d)];
  if (batch_dims > 0) {
    // Each tuple's batch, from its position among the indices' leading dims.
    core::Shape batch_shape(indices.shape().data(), int(batch_dims));
    Tensor batch = core::arange(batches, longs).reshape(batch_shape);
    core::Shape broadcast = batch_shape;
    for (int64_t d = batch_dims; d < indices.dim() - 1; ++d) broadcast.push_back(1);
    rows = rows + batch.reshape(broadcast) * double(block);
  }
  return rows;
}

// data.reshape([rows, rest]) for flat_rows' numbering.
Tensor as_rows(const Tensor& data, int64_t batch_dims, int64_t k) {
  int64_t rows = 1;
  for (int64_t d = 0; d < batch_dims + k; ++d) rows *= data.shape()[int(d)];
  return data.reshape({rows, rows == 0 ? 0 : data.numel() / rows});
}

OpFunction gather_nd(const NodeView& node) {
  const int64_t batch_dims = node.get_int("batch_dims", 0);
  const std::string where = node.where();
  if (batch_dims < 0) node.fail("batch_dims must be >= 0");
  return [=](const std::vector<Tensor>& in, RunContext&) {
    const Tensor& data = in[0];
    const Tensor rows = flat_rows(data, in[1], batch_dims, where);
    const int64_t k = in[1].shape()[in[1].dim() - 1];
    core::Shape shape(rows.shape());
    for (int64_t d = batch_dims + k; d < data.dim(); ++d) shape.push_back(data.shape()[int(d)]);
    const Tensor picked = core::index_select(as_rows(data, batch_dims, k), 0, rows.reshape({-1}));
    return std::vector<Tensor>{picked.reshape(shape)};
  };
}

OpFunction scatter_nd(const NodeView& node) {
  const Reduction reduction = reduction_of(node);
  const std::string where = node.where();
  return [=](const std::vector<Tensor>& in, RunContext&) {
    const Tensor& data = in[0];
    const Tensor& updates = in[2];
    const Tensor rows = flat_rows(data, in[1], 0, where).reshape({-1});
    const int64_t k = in[1].shape()[in[1].dim() - 1];
    const Tensor base = as_rows(data, 0, k);
    const Tensor flat_updates = updates.reshape({rows.numel(), base.shape()[1]});
    if (reduction == Reduction::Add) {
      return std::vector<Tensor>{
          core::index_add(base, 0, rows, flat_updates).reshape(data.shape())};
    }
    if (reduction != Reduction::None) {
      // Each update element's flat position: its row's start plus its column.
      const int64_t width = base.shape()[1];
      Tensor targets;
      {
        core::NoGradGuard no_grad;
        const core::TensorOptions longs = core::TensorOptions(core::kInt64).device(data.device());
        targets =
            rows.reshape({-1, 1}) * double(width) + core::arange(width, longs).reshape({1, width});
      }
      return std::vector<Tensor>{reduce_into(base.reshape({-1}), flat_updates.reshape({-1}),
                                             targets.reshape({-1}), reduction)
                                     .reshape(data.shape())};
    }
    check_unique(rows, where);
    const Tensor zeros = core::zeros_like(base);
    const Tensor counts =
        core::index_add(zeros.detach(), 0, rows, core::ones_like(flat_updates).detach());
    const Tensor written = core::index_add(zeros, 0, rows, flat_updates);
    return std::vector<Tensor>{overwrite(base, written, counts).reshape(data.shape())};
  };
}

// The inputs of mpigrad.GatherMulScatter, in the order fuse_message_passing writes them.
enum MessageInput {
  kData,
  kX,
  kSource,
  kWeight,
  kColumn,
  kIndex,
  kSliceStarts,
  kWeightIndex = kSliceStarts + 4  // row of the weight for each edge, where pairs share one
};

bool is_index_dtype(const Tensor& t) {
  return t.dtype() == core::kInt64 || t.dtype() == core::kInt32;
}

// Whether Slice(starts, ends, axes, steps) of a tensor of `shape` keeps all of it.
bool slice_keeps_all(const std::vector<Tensor>& in, const core::Shape& shape) {
  const int64_t rank = int64_t(shape.size());
  const std::vector<int64_t> starts = host_ints(in[kSliceStarts]);
  const std::vector<int64_t> ends = host_ints(in.at(kSliceStarts + 1));
  std::vector<int64_t> axes, steps;
  if (in.size() > kSliceStarts + 2 && in[kSliceStarts + 2].defined())
    axes = host_ints(in[kSliceStarts + 2]);
  if (in.size() > kSliceStarts + 3 && in[kSliceStarts + 3].defined())
    steps = host_ints(in[kSliceStarts + 3]);
  if (axes.empty())
    for (size_t i = 0; i < starts.size(); ++i) axes.push_back(int64_t(i));
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size())
    return false;
  for (size_t i = 0; i < starts.size(); ++i) {
    const int64_t axis = axes[i] < 0 ? axes[i] + rank : axes[i];
    if (axis < 0 || axis >= rank || steps[i] != 1) return false;
    const int64_t length = shape[int(axis)];
    const int64_t start = starts[i] < 0 ? starts[i] + length : starts[i];
    const int64_t end = ends[i] < 0 ? ends[i] + length : ends[i];
    if (start > 0 || end < length) return false;
  }
  return true;
}

// The chain as core::gather_mul_scatter, or nothing when the shapes do not fit it. The scatter
// index is known to be Expand(column) (or the column itself): with the column [E, 1, ..., 1] and
// the index shaped like the gathered rows [E, F...], row e of the index holds column[e]
// throughout, which makes the scatter an index_add over rows to the targets column[:, 0...].
std::optional<Tensor> fused_message(const std::vector<Tensor>& in, bool src_tuple, bool zero_base) {
  const Tensor& data = in[kData];
  const Tensor& x = in[kX];
  const Tensor& weight = in[kWeight];
  Tensor source = in[kSource];
  const core::DType dtype = x.dtype();
  if ((dtype != core::kFloat32 && dtype != core::kFloat64) || weight.dtype() != dtype ||
      data.dtype() != dtype || x.dim() < 1 || !is_index_dtype(source) ||
      !is_index_dtype(in[kColumn]))
    return std::nullopt;
  if (src_tuple) {
    if (source.dim() != 2 || source.shape()[1] != 1) return std::nullopt;
    source = source.reshape({source.shape()[0]});
  }
  if (source.dim() != 1) return std::nullopt;
  core::Shape rows = x.shape();
  rows[0] = source.numel();
  Tensor weight_index;
  if (in.size() > kWeightIndex && in[kWeightIndex].defined()) {
    weight_index = in[kWeightIndex];
    if (!is_index_dtype(weight_index) || weight_index.dim() != 1 ||
        weight_index.numel() != rows[0] || weight.dim() != x.dim())
      return std::nullopt;
    for (int d = 1; d < rows.size(); ++d)
      if (weight.shape()[d] != rows[d]) return std::nullopt;
    weight_index = on_device_of(weight_index, x).to(core::kInt64);
  } else if (weight.shape() != rows) {
    return std::nullopt;
  }
  if (in[kIndex].shape() != rows || data.dim() != x.dim()) return std::nullopt;
  const core::Shape& column = in[kColumn].shape();
  if (column.size() != rows.size() || column[0] != rows[0]) return std::nullopt;
  for (int d = 1; d < rows.size(); ++d)
    if (column[d] != 1 || data.shape()[d] != rows[d]) return std::nullopt;
  if (in.size() > kSliceStarts && in[kSliceStarts].defined() && !slice_keeps_all(in, rows))
    return std::nullopt;
  const int64_t targets = data.shape()[0];
  const Tensor from_in = on_device_of(source, x).to(core::kInt64);
  const Tensor to_in = on_device_of(in[kColumn], x).to(core::kInt64).reshape({rows[0]});
  const Tensor from = wrapped(from_in, x, core::scalar_like(double(x.shape()[0]), from_in));
  const Tensor to = wrapped(to_in, x, core::scalar_like(double(targets), to_in));
  Tensor out = core::gather_mul_scatter(x, from, weight, to, targets, weight_index);
  if (!zero_base) out = core::add(data, out);
  return out;
}

// One node of the replaced chain, compiled as the loader compiles it.
struct ChainStep {
  OpFunction run;
  std::vector<std::string> inputs, outputs;
};

OpFunction gather_mul_scatter(const NodeView& node) {
  const onnx::AttributeProto* chain_attribute = nullptr;
  for (const auto& attribute : node.proto().attribute())
    if (attribute.name() == "chain" && attribute.type() == onnx::AttributeProto::GRAPH)
      chain_attribute = &attribute;
  if (chain_attribute == nullptr || chain_attribute->g().node_size() == 0)
    node.fail("no chain to fall back on");
  std::vector<ChainStep> chain;
  for (const auto& step : chain_attribute->g().node()) {
    const OpInfo* op = op_table().find(step.op_type());
    if (op == nullptr || op->is_sequence_op()) node.fail("cannot run " + step.op_type());
    const NodeView view(step, node.opset(), node.where() + ", from node '" + step.name() + "'");
    chain.push_back({std::get<OpBuilder>(op->build)(view),
                     {step.input().begin(), step.input().end()},
                     {step.output().begin(), step.output().end()}});
  }
  const std::vector<std::string> names(node.proto().input().begin(), node.proto().input().end());
  const bool src_tuple = node.get_int("src_tuple", 0) != 0;
  const bool zero_base = node.get_int("zero_base", 0) != 0;
  return [=](const std::vector<Tensor>& in, RunContext& context) {
    if (auto fused = fused_message(in, src_tuple, zero_base)) return std::vector<Tensor>{*fused};
    std::map<std::string, Tensor> values;
    for (size_t i = 0; i < names.size() && i < in.size() && i < kWeightIndex; ++i)
      if (!names[i].empty()) values[names[i]] = in[i];
    if (in.size() > kWeightIndex && in[kWeightIndex].defined()) {
      const Tensor rows = on_device_of(in[kWeightIndex], in[kWeight]).to(core::kInt64);
      values[names[kWeight]] = core::index_select(in[kWeight], 0, rows.reshape({rows.numel()}));
    }
    for (const ChainStep& step : chain) {
      std::vector<Tensor> args;
      for (const std::string& name : step.inputs)
        args.push_back(name.empty() ? Tensor() : values.at(name));
      std::vector<Tensor> out = step.run(args, context);
      for (size_t k = 0; k < out.size() && k < step.outputs.size(); ++k)
        values[step.outputs[k]] = std::move(out[k]);
    }
    return std::vector<Tensor>{values.at(chain.back().outputs.at(0))};
  };
}

// mpigrad.EdgePairs (onnx_fusion.h): nn::pair_reverse_edges of edge_index and edge_shifts,
// or every edge its own pair where the shapes are not those of a neighbor list.
OpFunction edge_pairs(const NodeView&) {
  return [](const std::vector<Tensor>& in, RunContext&) {
    core::NoGradGuard no_grad;
    const Tensor& edge_index = in[0];
    const Tensor& shifts = in[1];
    const Tensor& rows = in[2];
    const int64_t edges = rows.dim() >= 1 ? rows.shape()[0] : 1;
    bool neighbor_list = rows.dim() >= 2;
    for (int d = 1; d < rows.dim() && neighbor_list; ++d) neighbor_list = rows.shape()[d] == 1;
    neighbor_list = neighbor_list && edge_index.dim() == 2 && edge_index.shape()[0] == 2 &&
                    edge_index.shape()[1] == edges && is_index_dtype(edge_index) &&
                    shifts.dim() == 2 && shifts.shape()[0] == edges && shifts.shape()[1] == 3 &&
                    core::is_floating(shifts.dtype());
    if (!neighbor_list) {
      const Tensor each =
          core::arange(edges, core::TensorOptions(core::kInt64).device(rows.device()));
      return std::vector<Tensor>{each, each};
    }
    nn::AtomicGraph graph;
    graph.edge_index = on_device_of(edge_index, rows).to(core::kInt64);
    graph.edge_shifts = shifts;
    const nn::EdgePairs pairs = nn::pair_reverse_edges(graph);
    return std::vector<Tensor>{pairs.first, pairs.pair};
  };
}

// mpigrad.ProductShape (onnx_fusion.h): Shape(rows(x, src) * weight), with Shape's start and
// end, from the shapes alone.
OpFunction product_shape(const NodeView& node) {
  const bool src_tuple = node.get_int("src_tuple", 0) != 0;
  const int64_t start_attribute = node.get_int("start", 0);
  const std::optional<int64_t> end_attribute =
      node.has("end") ? std::optional<int64_t>(node.get_int("end", 0)) : std::nullopt;
  const std::string where = node.where();
  return [=](const std::vector<Tensor>& in, RunContext&) {
    const Tensor& x = in[0];
    const core::Shape& index = in[1].shape();
    std::vector<int64_t> rows;
    int64_t first_kept = 1;  // Gather on axis 0 replaces x's first dim by the index's dims
    if (src_tuple) {
      MPIGRAD_CHECK(index.size() >= 1, where, ": GatherND indices need a dim");
      first_kept = index[index.size() - 1];
      for (int d = 0; d + 1 < index.size(); ++d) rows.push_back(index[d]);
    } else {
      for (int d = 0; d < index.size(); ++d) rows.push_back(index[d]);
    }
    for (int64_t d = first_kept; d < x.dim(); ++d) rows.push_back(x.shape()[int(d)]);
    const core::Shape shape =
        core::broadcast_shapes(core::Shape(rows), in[2].shape(), "mpigrad.ProductShape");
    const int64_t rank = int64_t(shape.size());
    const auto clamp = [&](int64_t v) {
      return std::clamp<int64_t>(v < 0 ? v + rank : v, 0, rank);
    };
    const int64_t start = clamp(start_attribute), end = clamp(end_attribute.value_or(rank));
    std::vector<int64_t> dims;
    for (int64_t d = start; d < end; ++d) dims.push_back(shape[int(d)]);
    return std::vector<Tensor>{int64_vector(dims)};
  };
}

}  // namespace

void add_scatter_ops(OpTable& t) {
  t.add(kProductShapeOp, product_shape).inputs(3, 3);
  t.add(kEdgePairsOp, edge_pairs).inputs(3, 3);
  t.add(kGatherMulScatterOp, gather_mul_scatter).inputs(6, 11).settings_from(kColumn);
  t.add("ScatterElements", scatter_elements).inputs(3, 3);
  t.add("ScatterND", scatter_nd).inputs(3, 3);
  t.add("GatherND", gather_nd).inputs(2, 2);
}

}  // namespace mpigrad::nn::onnx_ops
