// fuzz target fuzz_onnx: the input is the bytes of one ONNX model. It goes through what
// `OnnxModel::load` runs (the protobuf parse, the version checks, the op table, the parameter
// tree, constant folding), and, when every graph input is small, one forward pass on zeros of
// the declared shapes (free dims as 1) in eval and in train mode. core::Error is the expected
// outcome for a bad model; anything else (a crash, a hang, undefined behaviour, a leak, another
// exception) is a finding. External data is looked for in the working directory, where the
// corpus has none, so a model that names some fails cleanly.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "mpigrad/core/error.h"
#include "mpigrad/nn/onnx/onnx_model.h"

namespace {

using namespace mpigrad;

// A forward pass only on small inputs: a valid graph may declare big ones, and running them
// would measure the kernels, not the loader.
constexpr int64_t kMaxInputElements = 4096;

void run(const std::string& bytes) {
  auto model = nn::OnnxModel::load_from_bytes(bytes, "fuzz.onnx");
  std::vector<core::Tensor> inputs;
  for (const auto& info : model->graph_inputs()) {
    core::Shape shape;
    int64_t numel = 1;
    for (int64_t dim : info.shape) {
      const int64_t extent = dim < 0 ? 1 : dim;
      if (extent > kMaxInputElements || shape.size() >= 8) return;
      numel *= extent;
      if (numel > kMaxInputElements) return;
      shape.push_back(extent);
    }
    inputs.push_back(core::zeros(shape, info.dtype));
  }
  for (bool training : {false, true}) {
    model->train(training);
    model->forward_all(inputs);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    run(std::string(reinterpret_cast<const char*>(data), size));
  } catch (const core::Error&) {
    // The expected outcome for a bad model.
  }
  return 0;
}
