// Derivatives of derivatives through ONNX graphs exported from PyTorch, against PyTorch itself
// (tests/data/double_backward, written by benchmarks/double_backward/make_reference.py; CI has no
// torch). For an MLP and a SchNet-like graph network (Gather of positions by an edge list,
// ScatterElements with reduction add onto the atoms), with E the summed energy: E, its input
// gradient g = dE/dx (with create_graph), and for L = sum(g * g) the gradients of L with respect
// to the input and to every parameter, which take a double backward through the graph.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/hdf5.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/nn/onnx/onnx_model.h"

using namespace mpigrad;
using core::Tensor;

namespace {

const std::string kDataDir = MPIGRAD_SOURCE_DIR "/tests/data/double_backward/";

// "" when `actual` (float32) matches PyTorch's float64 `expected` within `rtol` of the largest
// expected magnitude; otherwise the first element that does not.
std::string mismatch(const Tensor& actual, const Tensor& expected, double rtol) {
  const std::vector<double> a = actual.to(core::kFloat64).contiguous().to_vector<double>();
  const std::vector<double> e = expected.to(core::kFloat64).contiguous().to_vector<double>();
  if (a.size() != e.size())
    return "sizes differ: " + std::to_string(a.size()) + " vs " + std::to_string(e.size());
  double scale = 0;
  for (double v : e) scale = std::max(scale, std::abs(v));
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::abs(a[i] - e[i]) > rtol * std::max(scale, 1e-6)) {
      std::ostringstream text;
      text.precision(9);
      text << "element " << i << ": mpigrad " << a[i] << ", PyTorch " << e[i] << " (scale " << scale
           << ")";
      return text.str();
    }
  }
  return "";
}

void check_against_pytorch(const std::string& model_name, const std::vector<std::string>& extra) {
  const core::hdf5::File file = core::hdf5::File::open(kDataDir + "reference.h5");
  const std::string group = model_name + "/";
  auto model = nn::OnnxModel::load(kDataDir + model_name + ".legacy.onnx");
  model->eval();
  Tensor x = file.read_tensor(group + "x").to(core::kFloat32);
  x.set_requires_grad(true);
  std::vector<Tensor> inputs = {x};
  for (const std::string& name : extra) inputs.push_back(file.read_tensor(group + name));

  const Tensor energy = core::sum(model->forward_all(inputs)[0]);
  CHECK(mismatch(energy.reshape({1}), file.read_tensor(group + "energy"), 1e-5) == "");
  const Tensor g = core::grad({energy}, {x}, {}, {.create_graph = true})[0];
  CHECK(mismatch(g, file.read_tensor(group + "input_grad"), 1e-5) == "");
  const Tensor loss = core::sum(g * g);

  std::vector<Tensor> wrt = {x};
  std::vector<std::string> names = {"input"};
  for (auto& [name, parameter] : model->named_parameters()) {
    wrt.push_back(parameter);
    names.push_back(name);
  }
  const std::vector<Tensor> grads = core::grad({loss}, wrt, {}, {.allow_unused = true});
  for (size_t i = 0; i < wrt.size(); ++i) {
    CAPTURE(names[i]);
    const Tensor expected = i == 0 ? file.read_tensor(group + "input_grad_of_loss")
                                   : file.read_tensor(group + "param_grads/" + names[i]);
    const Tensor actual = grads[i].defined() ? grads[i] : core::zeros_like(wrt[i]);
    CHECK(mismatch(actual, expected, 2e-4) == "");
  }
  CHECK(wrt.size() == 7);  // the input and six parameters, every one compared
}

}  // namespace

TEST_CASE("double backward through an exported MLP matches PyTorch") {
  check_against_pytorch("mlp", {});
}

TEST_CASE(
    "double backward through an exported graph network (Gather, ScatterElements add) matches "
    "PyTorch") {
  check_against_pytorch("graph", {"edge_index"});
}
