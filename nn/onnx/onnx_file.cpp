#include "mpigrad/nn/onnx/onnx_file.h"

#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <vector>

#include "mpigrad/core/error.h"

namespace mpigrad::nn {

namespace {

namespace fs = std::filesystem;

// Files beyond this are refused before reading: protobuf itself stops at 2 GiB, and the weights
// of bigger models belong in external data.
constexpr int64_t kMaxModelBytes = int64_t(2) << 30;

std::string read_whole_file(const fs::path& file, const std::string& what) {
  std::error_code error;
  const auto size = fs::file_size(file, error);
  MPIGRAD_CHECK(!error, what, " ", file.string(), ": cannot read it (", error.message(), ")");
  MPIGRAD_CHECK(int64_t(size) <= kMaxModelBytes, what, " ", file.string(), " is ", size,
                " bytes, more than the 2 GiB a protobuf message may hold");
  std::ifstream in(file, std::ios::binary);
  MPIGRAD_CHECK(in.good(), what, " ", file.string(), ": cannot open it");
  std::string bytes(size, '\0');
  in.read(bytes.data(), std::streamsize(size));
  MPIGRAD_CHECK(in.gcount() == std::streamsize(size), what, " ", file.string(),
                ": read fewer bytes than its size");
  return bytes;
}

// Reads the external data of `tensor` (ONNX's external-data convention: location, offset,
// length) into raw_data. The location must stay inside the model's folder.
void load_external_data(onnx::TensorProto& tensor, const std::string& name,
                        const fs::path& folder) {
  std::string location;
  int64_t offset = 0, length = -1;
  for (const auto& entry : tensor.external_data()) {
    try {
      if (entry.key() == "location") location = entry.value();
      if (entry.key() == "offset") offset = std::stoll(entry.value());
      if (entry.key() == "length") length = std::stoll(entry.value());
    } catch (const std::exception&) {
      core::fail(name, ": tensor '", tensor.name(), "' has a bad external-data ", entry.key(), " '",
                 entry.value(), "'");
    }
  }
  MPIGRAD_CHECK(!location.empty(), name, ": tensor '", tensor.name(),
                "' is stored externally but names no location");
  const fs::path relative(location);
  MPIGRAD_CHECK(relative.is_relative() && location.find("..") == std::string::npos, name,
                ": tensor '", tensor.name(), "' names external data '", location,
                "' outside the model's folder");
  const fs::path path = folder / relative;
  std::error_code error;
  const auto size = fs::file_size(path, error);
  MPIGRAD_CHECK(!error, name, ": the external data file ", path.string(), " of tensor '",
                tensor.name(), "' is missing (", error.message(), "); keep it beside the model");
  if (length < 0) length = int64_t(size) - offset;
  MPIGRAD_CHECK(offset >= 0 && length >= 0 && uint64_t(offset) + uint64_t(length) <= size, name,
                ": tensor '", tensor.name(), "' wants bytes [", offset, ", ", offset + length,
                ") of ", path.string(), ", which holds ", size, " (truncated?)");
  std::ifstream in(path, std::ios::binary);
  MPIGRAD_CHECK(in.good(), name, ": cannot open external data ", path.string());
  in.seekg(offset);
  std::string bytes(size_t(length), '\0');
  in.read(bytes.data(), std::streamsize(length));
  MPIGRAD_CHECK(in.gcount() == std::streamsize(length), name, ": short read of ", path.string());
  tensor.set_raw_data(std::move(bytes));
  tensor.clear_external_data();
  tensor.set_data_location(onnx::TensorProto::DEFAULT);
}

void load_graph_external_data(onnx::GraphProto& graph, const std::string& name,
                              const fs::path& folder) {
  for (auto& tensor : *graph.mutable_initializer()) {
    if (tensor.data_location() == onnx::TensorProto::EXTERNAL)
      load_external_data(tensor, name, folder);
  }
  for (auto& node : *graph.mutable_node()) {
    for (auto& attribute : *node.mutable_attribute()) {
      if (attribute.has_t() && attribute.t().data_location() == onnx::TensorProto::EXTERNAL)
        load_external_data(*attribute.mutable_t(), name, folder);
    }
  }
}

template <typename T>
void widen_into(const std::string& raw, std::vector<int64_t>& out) {
  for (size_t i = 0; i < out.size(); ++i) {
    T value;
    std::memcpy(&value, raw.data() + i * sizeof(T), sizeof(T));
    out[i] = int64_t(value);
  }
}

}  // namespace

onnx::ModelProto parse_onnx_model(const std::string& bytes, const std::string& name,
                                  const fs::path& folder) {
  onnx::ModelProto model;
  MPIGRAD_CHECK(!bytes.empty(), name, ": the file is empty, not an ONNX model");
  MPIGRAD_CHECK(model.ParseFromString(bytes), name,
                ": not a valid ONNX model (the protobuf does not parse: truncated or corrupt?)");
  MPIGRAD_CHECK(model.has_graph() && model.graph().node_size() > 0, name,
                ": the model holds no graph nodes (truncated, or not an ONNX model?)");
  MPIGRAD_CHECK(model.ir_version() >= 3 && model.ir_version() <= kOnnxMaxIrVersion, name,
                ": IR version ", model.ir_version(), " is outside the supported 3..",
                kOnnxMaxIrVersion);
  const int64_t opset = onnx_default_opset(model);
  MPIGRAD_CHECK(opset >= kOnnxMinOpset && opset <= kOnnxMaxOpset, name, ": opset ", opset,
                " of the default domain is outside the supported ", kOnnxMinOpset, "..",
                kOnnxMaxOpset, "; export with opset_version between them");
  load_graph_external_data(*model.mutable_graph(), name, folder);
  return model;
}

onnx::ModelProto read_onnx_model(const fs::path& file) {
  const std::string bytes = read_whole_file(file, "ONNX model");
  return parse_onnx_model(bytes, file.string(), file.parent_path());
}

int64_t onnx_default_opset(const onnx::ModelProto& model) {
  int64_t opset = -1;
  for (const auto& import : model.opset_import()) {
    if (import.domain().empty() || import.domain() == "ai.onnx") opset = import.version();
  }
  // IR 3 files without an opset_import meant opset 1; we do not run those.
  return opset;
}

std::string onnx_dtype_name(int32_t data_type) {
  if (onnx::TensorProto::DataType_IsValid(data_type))
    return onnx::TensorProto::DataType_Name(onnx::TensorProto::DataType(data_type));
  return "type " + std::to_string(data_type);
}

core::DType dtype_from_onnx(int32_t data_type, const std::string& where) {
  switch (data_type) {
    case onnx::TensorProto::FLOAT:
      return core::kFloat32;
    case onnx::TensorProto::DOUBLE:
      return core::kFloat64;
    case onnx::TensorProto::FLOAT16:
      return core::kFloat16;
    case onnx::TensorProto::BFLOAT16:
      return core::kBFloat16;
    case onnx::TensorProto::INT32:
      return core::kInt32;
    case onnx::TensorProto::INT64:
    case onnx::TensorProto::INT8:
    case onnx::TensorProto::INT16:
    case onnx::TensorProto::UINT16:
    case onnx::TensorProto::UINT32:
      return core::kInt64;
    case onnx::TensorProto::UINT8:
      return core::kUInt8;
    case onnx::TensorProto::BOOL:
      return core::kBool;
    default:
      core::fail(where, ": ONNX data type ", onnx_dtype_name(data_type), " is not supported");
  }
}

int32_t dtype_to_onnx(core::DType dtype) {
  switch (dtype) {
    case core::kFloat32:
      return onnx::TensorProto::FLOAT;
    case core::kFloat64:
      return onnx::TensorProto::DOUBLE;
    case core::kFloat16:
      return onnx::TensorProto::FLOAT16;
    case core::kBFloat16:
      return onnx::TensorProto::BFLOAT16;
    case core::kInt32:
      return onnx::TensorProto::INT32;
    case core::kInt64:
      return onnx::TensorProto::INT64;
    case core::kUInt8:
      return onnx::TensorProto::UINT8;
    case core::kBool:
      return onnx::TensorProto::BOOL;
  }
  return onnx::TensorProto::UNDEFINED;
}

core::Tensor tensor_from_proto(const onnx::TensorProto& proto, const std::string& where) {
  MPIGRAD_CHECK(proto.data_location() != onnx::TensorProto::EXTERNAL, where,
                ": external data was not loaded");
  const core::DType dtype = dtype_from_onnx(proto.data_type(), where);
  core::Shape shape;
  int64_t numel = 1;
  for (int64_t dim : proto.dims()) {
    constexpr int64_t kMaxElements = int64_t(1) << 40;
    MPIGRAD_CHECK(dim >= 0 && dim <= kMaxElements, where, ": bad dimension ", dim);
    MPIGRAD_CHECK(dim == 0 || numel <= kMaxElements / dim, where, ": too many elements");
    shape.push_back(dim);
    numel *= dim;
  }
  const int32_t type = proto.data_type();
  // Widened types are read element by element; the rest copy straight from raw_data.
  const bool widened = type == onnx::TensorProto::INT8 || type == onnx::TensorProto::INT16 ||
                       type == onnx::TensorProto::UINT16 || type == onnx::TensorProto::UINT32;
  if (proto.has_raw_data()) {
    const std::string& raw = proto.raw_data();
    if (widened) {
      const size_t width = type == onnx::TensorProto::INT8     ? 1
                           : type == onnx::TensorProto::UINT32 ? 4
                                                               : 2;
      MPIGRAD_CHECK(raw.size() == size_t(numel) * width, where, ": raw_data holds ", raw.size(),
                    " bytes, the shape ", shape, " needs ", numel * int64_t(width));
      std::vector<int64_t> values(static_cast<size_t>(numel), 0);
      if (type == onnx::TensorProto::INT8) widen_into<int8_t>(raw, values);
      if (type == onnx::TensorProto::INT16) widen_into<int16_t>(raw, values);
      if (type == onnx::TensorProto::UINT16) widen_into<uint16_t>(raw, values);
      if (type == onnx::TensorProto::UINT32) widen_into<uint32_t>(raw, values);
      return core::Tensor::from_vector(values, shape);
    }
    const int64_t bytes = numel * core::element_size(dtype);
    MPIGRAD_CHECK(int64_t(raw.size()) == bytes, where, ": raw_data holds ", raw.size(),
                  " bytes, the shape ", shape, " of ", core::dtype_name(dtype), " needs ", bytes);
    core::Tensor out = core::Tensor::empty(shape, dtype);
    if (bytes > 0) std::memcpy(out.data_ptr(), raw.data(), size_t(bytes));
    return out;
  }
  auto check_count = [&](int64_t count) {
    MPIGRAD_CHECK(count == numel, where, ": holds ", count, " values, the shape ", shape, " needs ",
                  numel);
  };
  switch (type) {
    case onnx::TensorProto::FLOAT: {
      check_count(proto.float_data_size());
      return core::Tensor::from_vector(
          std::vector<float>(proto.float_data().begin(), proto.float_data().end()), shape);
    }
    case onnx::TensorProto::DOUBLE: {
      check_count(proto.double_data_size());
      return core::Tensor::from_vector(
          std::vector<double>(proto.double_data().begin(), proto.double_data().end()), shape);
    }
    case onnx::TensorProto::INT64: {
      check_count(proto.int64_data_size());
      return core::Tensor::from_vector(
          std::vector<int64_t>(proto.int64_data().begin(), proto.int64_data().end()), shape);
    }
    case onnx::TensorProto::FLOAT16:
    case onnx::TensorProto::BFLOAT16: {
      // Stored as the 16-bit patterns in int32_data.
      check_count(proto.int32_data_size());
      core::Tensor out = core::Tensor::empty(shape, dtype);
      auto* bits = static_cast<uint16_t*>(out.data_ptr());
      for (int64_t i = 0; i < numel; ++i) bits[i] = uint16_t(proto.int32_data(int(i)));
      return out;
    }
    default: {
      check_count(proto.int32_data_size());
      std::vector<int64_t> values(proto.int32_data().begin(), proto.int32_data().end());
      return core::Tensor::from_vector(values, shape).to(dtype);
    }
  }
}

void tensor_to_proto(const core::Tensor& tensor, onnx::TensorProto& proto) {
  proto.clear_dims();
  for (int64_t dim : tensor.shape()) proto.add_dims(dim);
  proto.set_data_type(dtype_to_onnx(tensor.dtype()));
  proto.clear_float_data();
  proto.clear_double_data();
  proto.clear_int32_data();
  proto.clear_int64_data();
  proto.clear_uint64_data();
  proto.clear_string_data();
  proto.clear_external_data();
  proto.set_data_location(onnx::TensorProto::DEFAULT);
  const core::Tensor host = tensor.detach().to(core::kCPU).contiguous();
  proto.set_raw_data(std::string(static_cast<const char*>(host.data_ptr()), size_t(host.nbytes())));
}

}  // namespace mpigrad::nn
