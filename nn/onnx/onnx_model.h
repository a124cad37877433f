// OnnxModel: a graph exported to ONNX (from PyTorch, by either exporter) as a trainable
// nn::Module. Its forward walks the graph's nodes in order on core ops, so autograd, DDP,
// checkpoints and hooks treat it like any other module.
//
// - Every floating-point initializer is a parameter under the name the exporter gave it
//   ("0.weight", "enc.layers.1.linear1.bias"): dotted prefixes become child modules, so
//   named_parameters() and checkpoints use PyTorch's names.
// - A BatchNormalization whose scale, bias, mean and variance are initializers "P.weight",
//   "P.bias", "P.running_mean", "P.running_var" is run by an nn::BatchNorm child at P (with
//   num_batches_tracked, as torch), looked up at every forward, so convert_sync_batchnorm can
//   replace it. BatchNormalization and Dropout follow train()/eval(), not the file's
//   training_mode; Dropout draws from the module's generator "dropout".
// - Integer initializers, Constant nodes and shape arithmetic stay host constants without
//   autograd. Inputs are taken in the dtype the graph declares; the batch dimension is free.
// - Any op the loader cannot run (type, opset) is an error at load, naming the op type, the
//   node, the opset and the file: a graph never runs partially.
// Protobuf types stay out of this header; nn/onnx/onnx_file.h is the file-level interface.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mpigrad/core/dtype.h"
#include "mpigrad/nn/module.h"

namespace mpigrad::nn {

// A graph input or output as the file declares it; -1 marks a free (symbolic or unknown) dim.
// The batch dim (the first) is always free, whatever the exporter wrote there.
struct OnnxValueInfo {
  std::string name;
  core::DType dtype = core::kFloat32;
  std::vector<int64_t> shape;
};

// "[?, 1, 28, 28]": an OnnxValueInfo shape as messages print it, "?" for a free extent.
std::string onnx_shape_text(const std::vector<int64_t>& shape);

class OnnxModel : public Module {
 public:
  // Reads and checks `path` (external weights beside it). core::Error naming the file and the
  // node, the tensor or the field on any problem.
  static std::shared_ptr<OnnxModel> load(const std::string& path);
  // The same from the bytes of a file already in memory (`name` stands for it in messages).
  static std::shared_ptr<OnnxModel> load_from_bytes(const std::string& bytes,
                                                    const std::string& name);
  ~OnnxModel() override;

  // The real inputs (initializers listed as inputs by old exporters are left out).
  const std::vector<OnnxValueInfo>& graph_inputs() const;
  const std::vector<OnnxValueInfo>& graph_outputs() const;
  int64_t opset() const;
  const std::string& file() const;

  // One tensor per graph input, in order; each is checked against the declared rank and fixed
  // dims and converted to the declared dtype. Returns every graph output.
  std::vector<Tensor> forward_all(const std::vector<Tensor>& inputs);
  // Exactly one graph input; returns the first output.
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "OnnxModel"; }
  std::string extra_repr() const override;

  struct Graph;  // the compiled nodes (nn/onnx/onnx_model.cpp)

 private:
  OnnxModel();
  std::unique_ptr<Graph> graph_;
};

}  // namespace mpigrad::nn
