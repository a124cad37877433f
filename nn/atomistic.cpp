#include "mpigrad/nn/atomistic.h"

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
