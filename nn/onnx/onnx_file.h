// Reading and writing ONNX files with ONNX's own protobuf classes (Debian's libonnx-dev): the
// parse with our version checks, external weights pulled in beside the model, and the
// conversions between onnx::TensorProto and core::Tensor.
//
// Internal to the library (it includes protobuf-generated headers, which the public API must
// not): OnnxModel builds on it, and so do `mpigrad onnx inspect|export`. ONNX 1.12's checker
// knows only IR <= 8 and opset <= 17 while PyTorch's default exporter writes IR 10 and opset
// 18-20, so we never call it: read_onnx_model checks what the loader relies on itself.
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <filesystem>
#include <string>

#include "mpigrad/core/tensor.h"

namespace mpigrad::nn {

// The range of files accepted: the legacy exporter (IR 8, opset 17) up to the dynamo exporter
// (IR 10, opset 18-20).
inline constexpr int64_t kOnnxMaxIrVersion = 10;
inline constexpr int64_t kOnnxMinOpset = 7;
inline constexpr int64_t kOnnxMaxOpset = 20;

// Parses `file`, checks the IR version and the default domain's opset, and loads every
// initializer stored as external data (`location` relative to the model's folder) into its
// raw_data. core::Error naming the file (and the tensor) on a missing, truncated or corrupt file.
onnx::ModelProto read_onnx_model(const std::filesystem::path& file);
// The same for bytes already in memory (the fuzz target); `name` stands for the file in
// messages and `folder` is where external data would be looked for.
onnx::ModelProto parse_onnx_model(const std::string& bytes, const std::string& name,
                                  const std::filesystem::path& folder);

// The default domain's opset the model imports.
int64_t onnx_default_opset(const onnx::ModelProto& model);

// A host tensor holding the proto's values. `where` names it in messages ("initializer
// 'fc.weight' in m.onnx"). Supports float32/64, float16, bfloat16, int32/64, uint8 and bool;
// int8, int16, uint16 and uint32 are widened to int64 (there is no such core dtype).
core::Tensor tensor_from_proto(const onnx::TensorProto& proto, const std::string& where);
// Fills dims, data_type and raw_data (little-endian), and clears every other data field.
void tensor_to_proto(const core::Tensor& tensor, onnx::TensorProto& proto);

// The core dtype for an ONNX TensorProto data type; core::Error naming `where` if none.
core::DType dtype_from_onnx(int32_t data_type, const std::string& where);
int32_t dtype_to_onnx(core::DType dtype);
// ONNX's name for a TensorProto data type ("FLOAT", "INT64").
std::string onnx_dtype_name(int32_t data_type);

// Whether OnnxModel can run `op_type` (default domain) as defined at `opset`.
bool onnx_op_supported(const std::string& op_type, int64_t opset);

}  // namespace mpigrad::nn
