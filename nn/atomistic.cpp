#include "mpigrad/nn/atomistic.h"

#include <functional>
#include <unordered_map>
#include <vector>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/error.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/indexing.h"
#include "mpigrad/core/tensor.h"

namespace mpigrad::nn {

namespace {
void check_field(const Tensor& tensor, const char* name, core::DType dtype,
                 const core::Shape& shape, core::Device device, const std::string& where) {
  MPIGRAD_CHECK(tensor.defined(), where, ": the graph has no '", name, "'");
  MPIGRAD_CHECK(tensor.dtype() == dtype && tensor.shape() == shape, where, ": '", name, "' is ",
                tensor.dtype(), " ", tensor.shape(), "; expected ", dtype, " ", shape);
  MPIGRAD_CHECK(tensor.device() == device, where, ": '", name, "' is on ", tensor.device(),
                " but the positions are on ", device);
}
}  // namespace

void check_atomic_graph(const AtomicGraph& graph, const std::string& where) {
  MPIGRAD_CHECK(
      graph.positions.defined() && graph.positions.dim() == 2 && graph.positions.size(1) == 3,
      where, ": 'positions' must be [atoms, 3], got ",
      graph.positions.defined() ? graph.positions.shape() : core::Shape{});
  const int64_t atoms = graph.positions.size(0);
  const core::Device device = graph.positions.device();
  MPIGRAD_CHECK(
      graph.edge_index.defined() && graph.edge_index.dim() == 2 && graph.edge_index.size(0) == 2,
      where, ": 'edge_index' must be [2, edges], got ",
      graph.edge_index.defined() ? graph.edge_index.shape() : core::Shape{},
      " (no neighbor list: set [graph] cutoff, or give the store one)");
  const int64_t edges = graph.edge_index.size(1);
  const int64_t structures = graph.num_structures;
  // float32 in training; float64 for the finite-difference checks of a model.
  const core::DType real = graph.positions.dtype();
  MPIGRAD_CHECK(real == core::kFloat32 || real == core::kFloat64, where, ": 'positions' is ", real,
                "; expected float32");
  check_field(graph.positions, "positions", real, {atoms, 3}, device, where);
  check_field(graph.atomic_numbers, "atomic_numbers", core::kInt64, {atoms}, device, where);
  check_field(graph.edge_index, "edge_index", core::kInt64, {2, edges}, device, where);
  check_field(graph.edge_shifts, "edge_shifts", real, {edges, 3}, device, where);
  check_field(graph.batch, "batch", core::kInt64, {atoms}, device, where);
  check_field(graph.cell, "cell", real, {structures, 3, 3}, device, where);
}

Tensor edge_vectors(const AtomicGraph& graph) {
  const Tensor source = graph.edge_index.select(0, 0);
  const Tensor target = graph.edge_index.select(0, 1);
  return core::index_select(graph.positions, 0, target) -
         core::index_select(graph.positions, 0, source) + graph.edge_shifts;
}

Tensor edge_vectors(const AtomicGraph& graph, const Tensor& edges) {
  Tensor source, target;
  {
    core::NoGradGuard no_grad;
    source = core::index_select(graph.edge_index.select(0, 0), 0, edges);
    target = core::index_select(graph.edge_index.select(0, 1), 0, edges);
  }
  return core::index_select(graph.positions, 0, target) -
         core::index_select(graph.positions, 0, source) +
         core::index_select(graph.edge_shifts, 0, edges);
}

namespace {

// An edge as the pairing sees it: its ends, and its shift by value (-0 and 0 alike).
struct EdgeKey {
  int64_t source, target;
  double shift[3];
  bool operator==(const EdgeKey& other) const {
    return source == other.source && target == other.target && shift[0] == other.shift[0] &&
           shift[1] == other.shift[1] && shift[2] == other.shift[2];
  }
};

struct EdgeKeyHash {
  size_t operator()(const EdgeKey& key) const {
    size_t h = std::hash<int64_t>()(key.source) * 0x9E3779B97F4A7C15ull;
    h ^= std::hash<int64_t>()(key.target) + 0x7F4A7C15ull + (h << 6) + (h >> 2);
    for (double v : key.shift) h ^= std::hash<double>()(v + 0.0) + (h << 6) + (h >> 2);
    return h;
  }
};

}  // namespace

EdgePairs pair_reverse_edges(const AtomicGraph& graph) {
  const int64_t edges = graph.edge_index.size(1);
  const Tensor index = graph.edge_index.detach().to(core::kCPU).contiguous();
  const std::vector<double> shifts =
      graph.edge_shifts.detach().to(core::kCPU).contiguous().to_vector<double>();
  const int64_t* source = index.data<int64_t>();
  const int64_t* target = source + edges;
  const auto key = [&](int64_t e, bool reversed) {
    const double sign = reversed ? -1.0 : 1.0;
    EdgeKey k{reversed ? target[e] : source[e], reversed ? source[e] : target[e], {}};
    // + 0.0 turns -0 into 0, so that the hash agrees with ==.
    for (int c = 0; c < 3; ++c) k.shift[c] = sign * shifts[size_t(3 * e + c)] + 0.0;
    return k;
  };
  // Edges still waiting for their partner, by key. An edge pairs with the first such edge that
  // is itself reversed; a repeated edge whose key is taken stands alone.
  std::unordered_map<EdgeKey, int64_t, EdgeKeyHash> waiting;
  waiting.reserve(size_t(edges));
  std::vector<int64_t> first, pair(static_cast<size_t>(edges));
  for (int64_t e = 0; e < edges; ++e) {
    const auto partner = waiting.find(key(e, true));
    if (partner != waiting.end()) {
      pair[size_t(e)] = pair[size_t(partner->second)];
      waiting.erase(partner);
      continue;
    }
    pair[size_t(e)] = int64_t(first.size());
    first.push_back(e);
    waiting.emplace(key(e, false), e);
  }
  const core::Device device = graph.edge_index.device();
  EdgePairs out;
  out.count = int64_t(first.size());
  out.first = Tensor::from_vector<int64_t>(first, {out.count}).to(device);
  out.pair = Tensor::from_vector<int64_t>(pair, {edges}).to(device);
  return out;
}

Tensor sum_over_structures(const Tensor& per_atom, const AtomicGraph& graph) {
  const Tensor values = per_atom.reshape({graph.batch.size(0)});
  const Tensor zeros = core::zeros(
      {graph.num_structures}, core::TensorOptions().dtype(values.dtype()).device(values.device()));
  return core::index_add(zeros, 0, graph.batch, values);
}

Tensor AtomisticModel::forward(const Tensor&) {
  core::fail(type_name(),
             ": an interatomic potential takes a whole graph (positions, atomic numbers, edges, "
             "batch, cell); call energy(AtomicGraph) instead of forward(tensor)");
}

}  // namespace mpigrad::nn
