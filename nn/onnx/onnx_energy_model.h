// An interatomic potential exported from PyTorch to ONNX, trained as an nn::AtomisticModel: the
// graph's inputs are bound by name to the batch's tensors, and its output is the energy of each
// structure.
//
// Inputs: each graph input must be named one of
//   positions [V, 3] float32, atomic_numbers [V] int64, edge_index [2, E] int64 (row 0 sources,
//   row 1 targets), edge_shifts [E, 3] float32, batch [V] int64, cell [B, 3, 3] float32
// (nn/atomistic.h); a graph takes any subset, in any order (a cluster model needs no cell).
// Output: the one named `energy`, else the first, [B] or [B, 1].
//
// Export with torch.onnx.export(model, (positions, atomic_numbers, edge_index, ...),
// input_names=[...], output_names=["energy"], dynamic_axes for V, E and B) and aggregate with
// scatter_add / index_add. PyTorch's legacy exporter writes index_add as a ScatterElements
// without a reduction, which loses all but one of the messages to an atom; such a graph fails at
// its first batch, naming the node, and says to export with scatter_add or the default (dynamo)
// exporter (nn/onnx/onnx_ops_scatter.cpp).
//
// Parameter names stay the file's (PyTorch's): the graph's submodules (and its Dropout
// generator) become this model's. A graph with initializers at its root (no dotted name) is kept
// whole as the child "graph", whose parameters are then named graph.<name>.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "mpigrad/nn/atomistic.h"
#include "mpigrad/nn/onnx/onnx_model.h"

namespace mpigrad::nn {

class OnnxEnergyModel : public AtomisticModel {
 public:
  // The input names a potential's graph may have.
  static const std::vector<std::string>& input_names();
  // Whether every input of `graph` is named from input_names() (and it has at least one).
  static bool is_energy_model(const OnnxModel& graph);

  // core::Error, naming the file, for a graph that is not an energy model (the inputs it has and
  // those it may have), or without outputs.
  explicit OnnxEnergyModel(std::shared_ptr<OnnxModel> graph);
  Tensor energy(const AtomicGraph& graph) override;
  std::string type_name() const override { return "OnnxEnergyModel"; }
  std::string extra_repr() const override;
  const OnnxModel& graph() const { return *graph_; }

 private:
  std::shared_ptr<OnnxModel> graph_;
  size_t output_ = 0;  // which graph output is the energy
};

}  // namespace mpigrad::nn
