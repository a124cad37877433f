#include "mpigrad/nn/onnx/onnx_energy_model.h"

#include <algorithm>

#include "mpigrad/core/error.h"

namespace mpigrad::nn {

namespace {

std::string joined(const std::vector<std::string>& names) {
  std::string text;
  for (const std::string& name : names) text += (text.empty() ? "" : ", ") + name;
  return text;
}

std::vector<std::string> names_of(const std::vector<OnnxValueInfo>& values) {
  std::vector<std::string> names;
  for (const OnnxValueInfo& value : values) names.push_back(value.name);
  return names;
}

// Whether the graph holds tensors of its own, outside any submodule.
bool has_root_tensors(const OnnxModel& graph) {
  return !graph.named_parameters(false).empty() || !graph.named_buffers(false).empty();
}

}  // namespace

const std::vector<std::string>& OnnxEnergyModel::input_names() {
  static const std::vector<std::string> names = {"positions",   "atomic_numbers", "edge_index",
                                                 "edge_shifts", "batch",          "cell"};
  return names;
}

bool OnnxEnergyModel::is_energy_model(const OnnxModel& graph) {
  const std::vector<OnnxValueInfo>& inputs = graph.graph_inputs();
  return !inputs.empty() && std::all_of(inputs.begin(), inputs.end(), [](const auto& input) {
    const auto& names = input_names();
    return std::find(names.begin(), names.end(), input.name) != names.end();
  });
}

OnnxEnergyModel::OnnxEnergyModel(std::shared_ptr<OnnxModel> graph) : graph_(std::move(graph)) {
  MPIGRAD_CHECK(graph_ != nullptr, "OnnxEnergyModel: no graph given");
  MPIGRAD_CHECK(is_energy_model(*graph_), graph_->file(), ": the graph's inputs (",
                joined(names_of(graph_->graph_inputs())),
                ") are not those of an interatomic potential, which are named from ",
                joined(input_names()), " (export with input_names=[...])");
  const std::vector<OnnxValueInfo>& outputs = graph_->graph_outputs();
  MPIGRAD_CHECK(!outputs.empty(), graph_->file(), ": the graph has no output");
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (outputs[i].name == "energy") output_ = i;
  }
  if (has_root_tensors(*graph_)) {
    add_child("graph", graph_);
  } else {
    // The file's names: its submodules become ours, shared, so to() and train() reach the very
    // slots the graph reads; so do its generators (Dropout's), for checkpoints.
    for (const auto& [name, child] : graph_->named_children()) add_child(name, child);
    for (const auto& [name, generator] : graph_->named_generators()) {
      if (name.find('.') == std::string::npos) register_generator(name, generator);
    }
  }
}

Tensor OnnxEnergyModel::energy(const AtomicGraph& graph) {
  check_atomic_graph(graph, graph_->file());
  if (graph_->is_training() != is_training()) graph_->train(is_training());
  std::vector<Tensor> inputs;
  for (const OnnxValueInfo& input : graph_->graph_inputs()) {
    if (input.name == "positions") inputs.push_back(graph.positions);
    if (input.name == "atomic_numbers") inputs.push_back(graph.atomic_numbers);
    if (input.name == "edge_index") inputs.push_back(graph.edge_index);
    if (input.name == "edge_shifts") inputs.push_back(graph.edge_shifts);
    if (input.name == "batch") inputs.push_back(graph.batch);
    if (input.name == "cell") inputs.push_back(graph.cell);
  }
  std::vector<Tensor> outputs = graph_->forward_all(inputs);
  const Tensor& energy = outputs.at(output_);
  const int64_t structures = graph.num_structures;
  const bool per_structure =
      (energy.dim() == 1 && energy.size(0) == structures) ||
      (energy.dim() == 2 && energy.size(0) == structures && energy.size(1) == 1) ||
      (structures == 1 && energy.numel() == 1);
  MPIGRAD_CHECK(per_structure, graph_->file(), ": output '", graph_->graph_outputs()[output_].name,
                "' has shape ", energy.shape(), " for ", structures,
                " structure(s); an energy model returns one energy per structure, [B] or [B, 1] "
                "(sum the atoms' energies with index_add over the 'batch' input)");
  Tensor result = energy.reshape({structures});
  return result.dtype() == core::kFloat32 ? result : result.to(core::kFloat32);
}

std::string OnnxEnergyModel::extra_repr() const {
  return "file=" + graph_->file() + ", inputs=" + joined(names_of(graph_->graph_inputs()));
}

}  // namespace mpigrad::nn
