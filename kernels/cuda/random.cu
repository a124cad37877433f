// CUDA random fills from the Philox stream: uniform, normal, bernoulli.
//
// Layout: dense [n] outputs written with `=`. Element i reads stream word offset + i (uniform,
// bernoulli) or words offset + 2i and offset + 2i + 1 (normal), exactly as kernels/philox.h and
// kernels/random.h fix it for every device.
// Thread mapping: one thread per element; it computes the Philox block(s) holding its words.
// Bit-exactness: the words and the 24-bit uniforms are identical to the CPU's. The affine maps
// use round-to-nearest intrinsics (__fmul_rn, __fadd_rn, ...) so nvcc cannot contract them into
// a fused multiply-add, which would round differently from the CPU: uniform and bernoulli match
// the CPU bit for bit. normal's log, sqrt and cos come from the CUDA math library, whose last
// bit may differ from glibc's, so normal values agree to about 1 ulp, not always bitwise.
#include <type_traits>

#include "mpigrad/kernels/cuda/common.cuh"
#include "mpigrad/kernels/philox.h"
#include "mpigrad/kernels/random.h"

namespace mpigrad::kernels::cuda {
namespace {

using detail::as_stream;
using detail::kThreads;

constexpr double kTwoPi = 6.28318530717958647692;

__device__ __forceinline__ float mul_rn(float a, float b) {
  return __fmul_rn(a, b);
}
__device__ __forceinline__ double mul_rn(double a, double b) {
  return __dmul_rn(a, b);
}
__device__ __forceinline__ float add_rn(float a, float b) {
  return __fadd_rn(a, b);
}
__device__ __forceinline__ double add_rn(double a, double b) {
  return __dadd_rn(a, b);
}

template <typename T>
__global__ void uniform_kernel(int64_t n, T* out, uint64_t seed, uint64_t offset, acc_t<T> low,
                               acc_t<T> range) {
  using R = acc_t<T>;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const uint32_t word = philox_word(seed, offset + uint64_t(i));
    out[i] = T(add_rn(low, mul_rn(range, R(uniform_from_bits(word)))));
  }
}

template <typename T>
__global__ void normal_kernel(int64_t n, T* out, uint64_t seed, uint64_t offset, acc_t<T> mean,
                              acc_t<T> std) {
  using R = acc_t<T>;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t w0 = offset + 2 * uint64_t(i), w1 = w0 + 1;
    const PhiloxBlock first = philox_block(seed, w0 / 4);
    const uint32_t bits0 = first.word[w0 % 4];
    const uint32_t bits1 =
        (w1 / 4 == w0 / 4) ? first.word[w1 % 4] : philox_block(seed, w1 / 4).word[w1 % 4];
    // Box-Muller on 1 - u1, which lies in (0, 1], so the log never sees 0.
    const R u1 = R(1) - R(uniform_from_bits(bits0));
    const R u2 = R(uniform_from_bits(bits1));
    const R radius = detail::m_sqrt(mul_rn(R(-2), detail::m_log(u1)));
    const R z = mul_rn(radius, detail::m_cos(mul_rn(R(kTwoPi), u2)));
    out[i] = T(add_rn(mean, mul_rn(std, z)));
  }
}

template <typename T>
__global__ void bernoulli_kernel(int64_t n, T* out, uint64_t seed, uint64_t offset, double p, T one,
                                 T zero) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const uint32_t word = philox_word(seed, offset + uint64_t(i));
    // The compare is in double, as on the CPU: rounding p to float could move it across a u.
    out[i] = double(uniform_from_bits(word)) < p ? one : zero;
  }
}

void check_count(const char* kernel, int64_t n) {
  if (n < 0) detail::throw_invalid(kernel, "negative element count");
}

}  // namespace

void uniform(DType dtype, int64_t n, void* out, uint64_t seed, uint64_t offset, double lo,
             double hi, void* stream) {
  check_count("uniform", n);
  detail::visit(dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!is_floating_v<T>) {
      detail::throw_unsupported("uniform", "", dtype);
    } else {
      using R = acc_t<T>;
      if (n == 0) return;
      uniform_kernel<T><<<detail::grid_for(n), kThreads, 0, as_stream(stream)>>>(
          n, static_cast<T*>(out), seed, offset, R(lo), R(hi - lo));
    }
  });
  detail::check_launch("uniform", stream);
}

void normal(DType dtype, int64_t n, void* out, uint64_t seed, uint64_t offset, double mean,
            double std, void* stream) {
  check_count("normal", n);
  detail::visit(dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!is_floating_v<T>) {
      detail::throw_unsupported("normal", "", dtype);
    } else {
      using R = acc_t<T>;
      if (n == 0) return;
      normal_kernel<T><<<detail::grid_for(n), kThreads, 0, as_stream(stream)>>>(
          n, static_cast<T*>(out), seed, offset, R(mean), R(std));
    }
  });
  detail::check_launch("normal", stream);
}

void bernoulli(DType dtype, int64_t n, void* out, uint64_t seed, uint64_t offset, double p,
               void* stream) {
  check_count("bernoulli", n);
  if (n == 0) return;
  detail::visit(dtype, [&](auto tag) {
    using T = decltype(tag);
    // Bool is written as a byte of 0 or 1.
    using Stored = std::conditional_t<std::is_same_v<T, bool>, uint8_t, T>;
    const Stored one = Stored(cast_to<T>(1.0));
    const Stored zero = Stored(cast_to<T>(0.0));
    bernoulli_kernel<Stored><<<detail::grid_for(n), kThreads, 0, as_stream(stream)>>>(
        n, static_cast<Stored*>(out), seed, offset, p, one, zero);
  });
  detail::check_launch("bernoulli", stream);
}

}  // namespace mpigrad::kernels::cuda
