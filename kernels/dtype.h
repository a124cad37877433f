// Element types shared by every kernel, CPU and CUDA alike.
//
// kernels/ includes nothing of ours, so the scalar types live here and core/ re-exports them.
// Half and BFloat16 are plain 16-bit storage types with round-to-nearest-even conversion; the
// arithmetic is always done in float. They compile on the host and, under nvcc, on the device.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__CUDACC__)
#define MPIGRAD_HOST_DEVICE __host__ __device__
#else
#define MPIGRAD_HOST_DEVICE
#endif

namespace mpigrad::kernels {

enum class DType : uint8_t { Float32, Float64, BFloat16, Float16, Int32, Int64, UInt8, Bool };

constexpr int kNumDTypes = 8;

MPIGRAD_HOST_DEVICE inline uint32_t float_bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

MPIGRAD_HOST_DEVICE inline float bits_float(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// bfloat16: the top 16 bits of an IEEE float32.
struct BFloat16 {
  uint16_t bits = 0;

  BFloat16() = default;
  MPIGRAD_HOST_DEVICE BFloat16(float value)
      : bits(from_float(value)) {}  // NOLINT: implicit like float
  MPIGRAD_HOST_DEVICE operator float() const { return bits_float(uint32_t(bits) << 16); }

  MPIGRAD_HOST_DEVICE static uint16_t from_float(float value) {
    uint32_t f = float_bits(value);
    if ((f & 0x7fffffffu) > 0x7f800000u) return uint16_t((f >> 16) | 0x40u);  // quiet NaN
    uint32_t rounding_bias = 0x7fffu + ((f >> 16) & 1u);                      // nearest even
    return uint16_t((f + rounding_bias) >> 16);
  }
};

// IEEE binary16.
struct Half {
  uint16_t bits = 0;

  Half() = default;
  MPIGRAD_HOST_DEVICE Half(float value) : bits(from_float(value)) {}  // NOLINT: implicit like float
  MPIGRAD_HOST_DEVICE operator float() const { return to_float(bits); }

  MPIGRAD_HOST_DEVICE static uint16_t from_float(float value) {
    uint32_t f = float_bits(value);
    uint32_t sign = (f >> 16) & 0x8000u;
    uint32_t abs = f & 0x7fffffffu;
    if (abs > 0x7f800000u) return uint16_t(sign | 0x7e00u);   // NaN
    if (abs >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // overflow rounds to inf
    if (abs < 0x38800000u) {                                  // subnormal or zero
      // Let the FPU do the rounding: adding 0.5 aligns the half subnormal grid to float's ulp.
      float shifted = bits_float(abs) + 0.5f;
      return uint16_t(sign | (float_bits(shifted) - 0x3f000000u));
    }
    uint32_t mantissa_odd = (abs >> 13) & 1u;
    abs += 0xc8000fffu + mantissa_odd;  // rebias exponent (-112 << 23) and round to nearest even
    return uint16_t(sign | (abs >> 13));
  }

  MPIGRAD_HOST_DEVICE static float to_float(uint16_t h) {
    uint32_t sign = uint32_t(h & 0x8000u) << 16;
    uint32_t exponent = (h >> 10) & 0x1fu;
    uint32_t mantissa = h & 0x3ffu;
    if (exponent == 0x1f) return bits_float(sign | 0x7f800000u | (mantissa << 13));  // inf/NaN
    if (exponent == 0) {                                                             // subnormal
      float magnitude = float(mantissa) * (1.0f / 16777216.0f);                      // 2^-24
      return sign ? -magnitude : magnitude;
    }
    return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  }
};

// PyTorch's names ("float32", "bfloat16", "int64", "bool"), for messages on every layer.
constexpr const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::Float32:
      return "float32";
    case DType::Float64:
      return "float64";
    case DType::BFloat16:
      return "bfloat16";
    case DType::Float16:
      return "float16";
    case DType::Int32:
      return "int32";
    case DType::Int64:
      return "int64";
    case DType::UInt8:
      return "uint8";
    case DType::Bool:
      return "bool";
  }
  return "unknown";
}

constexpr int element_size(DType dtype) {
  switch (dtype) {
    case DType::Float64:
    case DType::Int64:
      return 8;
    case DType::Float32:
    case DType::Int32:
      return 4;
    case DType::BFloat16:
    case DType::Float16:
      return 2;
    case DType::UInt8:
    case DType::Bool:
      return 1;
  }
  return 0;
}

// Calls fn(T{}) with the C++ type of dtype, so a kernel is written once as a template.
template <typename Fn>
decltype(auto) visit_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::Float32:
      return fn(float{});
    case DType::Float64:
      return fn(double{});
    case DType::BFloat16:
      return fn(BFloat16{});
    case DType::Float16:
      return fn(Half{});
    case DType::Int32:
      return fn(int32_t{});
    case DType::Int64:
      return fn(int64_t{});
    case DType::UInt8:
      return fn(uint8_t{});
    case DType::Bool:
      return fn(bool{});
  }
  return fn(float{});
}

// Calls fn(T{}) for the floating dtypes (float, double, bfloat16, half) and nothing else.
template <typename Fn>
void visit_floating(DType dtype, Fn&& fn) {
  visit_dtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    if constexpr (std::is_floating_point_v<T> || std::is_same_v<T, BFloat16> ||
                  std::is_same_v<T, Half>) {
      fn(zero);
    }
  });
}

// The type arithmetic is carried out in: float for the 16-bit floats, otherwise the type itself.
template <typename T>
struct ComputeType {
  using type = T;
};
template <>
struct ComputeType<BFloat16> {
  using type = float;
};
template <>
struct ComputeType<Half> {
  using type = float;
};
template <typename T>
using compute_t = typename ComputeType<T>::type;

}  // namespace mpigrad::kernels
