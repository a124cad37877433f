// Element types (core/hdf5/types.h): the HDF5 type of each DType, as h5py writes it, and the
// DType (if any) of a type found in a file.
#include "mpigrad/core/hdf5/types.h"

#include <algorithm>
#include <array>
#include <mutex>
#include <string>

#include "mpigrad/core/error.h"
#include "mpigrad/core/hdf5/internal.h"

namespace mpigrad::core::hdf5 {

namespace {

hid_t make_16bit_float(size_t exponent_bits, size_t mantissa_bits, size_t bias) {
  // As h5py builds its float16: start from IEEE float32 and narrow the fields.
  hid_t type = H5Tcopy(H5T_IEEE_F32LE);
  if (type < 0) return type;
  if (H5Tset_fields(type, 15, mantissa_bits, exponent_bits, 0, mantissa_bits) < 0 ||
      H5Tset_size(type, 2) < 0 || H5Tset_precision(type, 16) < 0 || H5Tset_ebias(type, bias) < 0) {
    H5Tclose(type);
    return -1;
  }
  return type;
}

hid_t make_type(DType dtype) {
  switch (dtype) {
    case DType::Float32:
      return H5Tcopy(H5T_NATIVE_FLOAT);
    case DType::Float64:
      return H5Tcopy(H5T_NATIVE_DOUBLE);
    case DType::Int32:
      return H5Tcopy(H5T_NATIVE_INT32);
    case DType::Int64:
      return H5Tcopy(H5T_NATIVE_INT64);
    case DType::UInt8:
      return H5Tcopy(H5T_NATIVE_UINT8);
    case DType::Float16:
      return make_16bit_float(5, 10, 15);
    case DType::BFloat16:
      return make_16bit_float(8, 7, 127);
    case DType::Bool: {
      hid_t type = H5Tenum_create(H5T_NATIVE_INT8);
      if (type < 0) return type;
      int8_t no = 0, yes = 1;
      if (H5Tenum_insert(type, "FALSE", &no) < 0 || H5Tenum_insert(type, "TRUE", &yes) < 0) {
        H5Tclose(type);
        return -1;
      }
      return type;
    }
  }
  return -1;
}

}  // namespace

namespace detail {

// In-memory types are built once per process and shared: reads are hot and a type is immutable.
hid_t memory_type(DType dtype) {
  static std::once_flag once;
  static std::array<hid_t, kernels::kNumDTypes> types{};
  std::call_once(once, [] {
    silence_errors();
    for (int d = 0; d < kernels::kNumDTypes; ++d) types[size_t(d)] = make_type(DType(d));
  });
  hid_t type = types[size_t(dtype)];
  if (type < 0)
    fail("HDF5: could not build the in-memory type for ", dtype, ": ", take_error_stack());
  return type;
}

}  // namespace detail

using namespace detail;

Datatype Datatype::of(DType dtype) {
  silence_errors();
  return Datatype(
      owned(make_type(dtype), "H5Tcopy", std::string("type ") + std::string(dtype_name(dtype))));
}

Datatype Datatype::fixed_string(size_t length) {
  silence_errors();
  Handle type = owned(H5Tcopy(H5T_C_S1), "H5Tcopy", "string type");
  check(H5Tset_size(type.id(), std::max<size_t>(length, 1)), "H5Tset_size", "string type");
  check(H5Tset_strpad(type.id(), H5T_STR_NULLTERM), "H5Tset_strpad", "string type");
  check(H5Tset_cset(type.id(), H5T_CSET_UTF8), "H5Tset_cset", "string type");
  return Datatype(std::move(type));
}

std::optional<DType> Datatype::to_dtype() const {
  silence_errors();
  hid_t type = id();
  size_t size = H5Tget_size(type);
  switch (H5Tget_class(type)) {
    case H5T_INTEGER: {
      bool is_signed = H5Tget_sign(type) == H5T_SGN_2;
      if (size == 1 && !is_signed) return DType::UInt8;
      if (size == 4 && is_signed) return DType::Int32;
      if (size == 8 && is_signed) return DType::Int64;
      return std::nullopt;
    }
    case H5T_FLOAT: {
      if (size == 4) return DType::Float32;
      if (size == 8) return DType::Float64;
      if (size == 2) {
        size_t bias = H5Tget_ebias(type);
        if (bias == 15) return DType::Float16;
        if (bias == 127) return DType::BFloat16;
      }
      return std::nullopt;
    }
    case H5T_ENUM: {
      // h5py's bool: an enum over a 1-byte integer with the two members FALSE and TRUE.
      if (size == 1 && H5Tget_nmembers(type) == 2) return DType::Bool;
      return std::nullopt;
    }
    default:
      return std::nullopt;
  }
}

std::optional<DType> Datatype::read_as() const {
  if (std::optional<DType> exact = to_dtype()) return exact;
  silence_errors();
  hid_t type = id();
  if (H5Tget_class(type) != H5T_INTEGER) return std::nullopt;
  size_t size = H5Tget_size(type);
  // int8, int16 and uint16 fit in int32; uint32 and uint64 go to int64.
  if (size < 4) return DType::Int32;
  if (size <= 8) return DType::Int64;
  return std::nullopt;
}

std::string Datatype::describe() const {
  silence_errors();
  hid_t type = id();
  size_t size = H5Tget_size(type);
  std::string text;
  switch (H5Tget_class(type)) {
    case H5T_INTEGER:
      text = (H5Tget_sign(type) == H5T_SGN_2 ? "int" : "uint") + std::to_string(size * 8);
      break;
    case H5T_FLOAT:
      text = "float" + std::to_string(size * 8);
      break;
    case H5T_STRING:
      return "string";
    case H5T_COMPOUND:
      return "compound";
    case H5T_ENUM:
      return "enum of " + std::to_string(H5Tget_nmembers(type)) + " members";
    case H5T_ARRAY:
      return "array";
    case H5T_VLEN:
      return "variable-length sequence";
    case H5T_OPAQUE:
      return "opaque";
    case H5T_REFERENCE:
      return "reference";
    case H5T_BITFIELD:
      return "bitfield" + std::to_string(size * 8);
    default:
      return "unknown HDF5 type";
  }
  if (H5Tget_order(type) == H5T_ORDER_BE) text += " (big-endian)";
  return text;
}
}  // namespace mpigrad::core::hdf5
