// Element types of a Tensor: the kernels' DType, with names, sizes and the C++ type mapping.
#pragma once

#include <cstdint>
#include <ostream>
#include <string_view>

#include "mpigrad/kernels/dtype.h"

namespace mpigrad::core {

using kernels::BFloat16;
using kernels::DType;
using kernels::Half;

inline constexpr DType kFloat32 = DType::Float32;
inline constexpr DType kFloat64 = DType::Float64;
inline constexpr DType kBFloat16 = DType::BFloat16;
inline constexpr DType kFloat16 = DType::Float16;
inline constexpr DType kInt32 = DType::Int32;
inline constexpr DType kInt64 = DType::Int64;
inline constexpr DType kUInt8 = DType::UInt8;
inline constexpr DType kBool = DType::Bool;

using kernels::dtype_name;  // PyTorch's names: "float32", "bfloat16", "int64", "bool", ...

using kernels::element_size;  // bytes per element
inline bool is_floating(DType dtype) {
  return dtype == kFloat32 || dtype == kFloat64 || dtype == kBFloat16 || dtype == kFloat16;
}

// The DType of a C++ element type, for typed access such as Tensor::data<float>().
template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return kFloat32;
}
template <>
constexpr DType dtype_of<double>() {
  return kFloat64;
}
template <>
constexpr DType dtype_of<BFloat16>() {
  return kBFloat16;
}
template <>
constexpr DType dtype_of<Half>() {
  return kFloat16;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return kInt32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return kInt64;
}
template <>
constexpr DType dtype_of<uint8_t>() {
  return kUInt8;
}
template <>
constexpr DType dtype_of<bool>() {
  return kBool;
}

// The dtype two operands are computed in (NumPy-style promotion: bool < integers < floats, wider
// wins; bfloat16 with float16 gives float32).
DType promote_types(DType a, DType b);

}  // namespace mpigrad::core

namespace mpigrad::kernels {
// Declared beside DType (which lives in kernels/) so argument-dependent lookup finds it from any
// namespace: std::cout << tensor.dtype() works in user code.
std::ostream& operator<<(std::ostream& out, DType dtype);
}  // namespace mpigrad::kernels
