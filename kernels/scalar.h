// Internal to kernels/: the scalar semantics the CPU and the CUDA kernels share, written once so
// that a tensor op gives the same answer on either device.
//
// Conversions between element types that are defined for every input (float -> integer never
// hits undefined behaviour), wrapping integer arithmetic (signed overflow is UB in C++, and a
// tensor op must not become a trap under a sanitizer), NaN tests that compile away for integers,
// and the types the floating kernels compute in. Everything here compiles with g++ and, under
// nvcc, on the host and the device alike (std::numeric_limits needs --expt-relaxed-constexpr,
// which cmake/mpigrad_cuda.cmake passes).
#pragma once

#include <cstdint>
#include <limits>
#include <type_traits>

#include "mpigrad/kernels/dtype.h"

namespace mpigrad::kernels {

// True for the storage types whose arithmetic is floating point (float, double, Half, BFloat16).
template <typename T>
constexpr bool is_floating_v = std::is_floating_point_v<compute_t<T>>;

// The type a floating kernel (softmax, cross-entropy, layer norm, random transforms) computes
// and accumulates in: double for Float64, float for Float32 and the 16-bit floats.
template <typename T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <typename C>
MPIGRAD_HOST_DEVICE inline bool is_nan(C value) {
  if constexpr (std::is_floating_point_v<C>) {
    return value != value;
  } else {
    return false;
  }
}

// Integer + - * that wrap instead of overflowing into undefined behaviour.
template <typename C>
MPIGRAD_HOST_DEVICE inline C wrap_add(C a, C b) {
  using U = std::make_unsigned_t<C>;
  return C(U(a) + U(b));
}
template <typename C>
MPIGRAD_HOST_DEVICE inline C wrap_sub(C a, C b) {
  using U = std::make_unsigned_t<C>;
  return C(U(a) - U(b));
}
template <typename C>
MPIGRAD_HOST_DEVICE inline C wrap_mul(C a, C b) {
  using U = std::make_unsigned_t<C>;
  if constexpr (sizeof(C) < sizeof(unsigned)) {
    return C(unsigned(U(a)) * unsigned(U(b)));  // avoid promotion to signed int overflowing
  } else {
    return C(U(a) * U(b));
  }
}

// Float -> signed integer like a C cast (truncation toward zero), except that NaN gives 0 and
// values outside the range saturate, where the C cast would be undefined.
template <typename I, typename F>
MPIGRAD_HOST_DEVICE inline I float_to_int(F value) {
  constexpr F kLow = F(std::numeric_limits<I>::min());  // -2^k: exact in float and double
  if (!(value == value)) return I(0);
  if (value >= -kLow) return std::numeric_limits<I>::max();
  if (value < kLow) return std::numeric_limits<I>::min();
  return I(value);
}

// Any element type to any other, as copy() defines it: Bool is (value != 0); floats go to
// UInt8 through int64 so -1.0 becomes 255 as in a C cast chain; otherwise the usual conversion.
template <typename To, typename From>
MPIGRAD_HOST_DEVICE inline To cast_to(From value) {
  using FromC = compute_t<From>;
  using ToC = compute_t<To>;
  if constexpr (std::is_same_v<To, From>) {
    return value;
  } else if constexpr (std::is_same_v<To, bool>) {
    return FromC(value) != FromC(0);
  } else if constexpr (std::is_floating_point_v<FromC> && std::is_integral_v<To>) {
    if constexpr (std::is_same_v<To, uint8_t>) {
      return uint8_t(float_to_int<int64_t>(FromC(value)));
    } else {
      return float_to_int<To>(FromC(value));
    }
  } else {
    return To(ToC(FromC(value)));
  }
}

// Integer division defined for every input: by 0 it gives 0 (rather than SIGFPE), and
// MIN / -1, which would trap too, wraps.
template <typename C>
MPIGRAD_HOST_DEVICE inline C int_div(C a, C b) {
  if (b == C(0)) return C(0);
  if constexpr (std::is_signed_v<C>) {
    if (b == C(-1)) return wrap_sub(C(0), a);
  }
  return C(a / b);
}

// Integer power by squaring, wrapping; a negative exponent truncates as a real power would
// (|base| >= 2 gives 0, and 0 to a negative power is defined as 0 too).
template <typename C>
MPIGRAD_HOST_DEVICE inline C int_pow(C base, C exponent) {
  if constexpr (std::is_signed_v<C>) {
    if (exponent < C(0)) {
      if (base == C(1)) return C(1);
      if (base == C(-1)) return (exponent & C(1)) ? C(-1) : C(1);
      return C(0);
    }
  }
  C result = C(1);
  while (exponent != C(0)) {
    if (exponent & C(1)) result = wrap_mul(result, base);
    base = wrap_mul(base, base);
    exponent = C(exponent >> 1);
  }
  return result;
}

// x < 0, written so that unsigned types do not compare with zero at all.
template <typename C>
MPIGRAD_HOST_DEVICE inline bool is_negative(C x) {
  if constexpr (std::is_signed_v<C> || std::is_floating_point_v<C>) {
    return x < C(0);
  } else {
    return false;
  }
}

// -1, 0 or 1; NaN gives 0, as torch.sign does, so the result is always one of the three.
template <typename C>
MPIGRAD_HOST_DEVICE inline C sign_of(C x) {
  return C(int(C(0) < x) - int(is_negative(x)));
}

// The constants of the element-wise ops' formulas (GELU, its tanh form, erf's derivative).
inline constexpr double kSqrtHalf = 0.70710678118654752440;       // 1/sqrt(2)
inline constexpr double kSqrt2OverPi = 0.79788456080286535588;    // sqrt(2/pi)
inline constexpr double kInvSqrt2Pi = 0.39894228040143267794;     // 1/sqrt(2*pi)
inline constexpr double kTwoOverSqrtPi = 1.12837916709551257390;  // d/dx erf(x) at 0
inline constexpr double kGeluCubic = 0.044715;

// The argument of tanh in GELU's tanh approximation.
template <typename C>
MPIGRAD_HOST_DEVICE inline C gelu_tanh_inner(C x) {
  return C(kSqrt2OverPi) * (x + C(kGeluCubic) * x * x * x);
}

// A double bound brought into T's range, for clamp limits such as +inf on an integer tensor.
// Host only: the launchers convert their arguments before the kernels run.
template <typename T>
inline compute_t<T> saturate_bound(double bound) {
  using C = compute_t<T>;
  if constexpr (std::is_floating_point_v<C>) {
    return C(bound);
  } else if constexpr (std::is_same_v<C, bool>) {
    return bound > 0.0;
  } else {
    if (bound != bound) return C(0);
    if (bound <= double(std::numeric_limits<C>::min())) return std::numeric_limits<C>::min();
    if (bound >= double(std::numeric_limits<C>::max())) return std::numeric_limits<C>::max();
    return C(bound);
  }
}

}  // namespace mpigrad::kernels
