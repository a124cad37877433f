// CPU elementwise kernels: unary, unary_backward, binary, where, clamp, copy, fill, arange, and the
// dense 16-bit conversions convert_dense and add_16bit_dense (one thread, one build per ISA).
//
// Layout: a StridedLoop of up to kMaxDims dims with element strides per operand (operand 0 is
// the output). When every operand is dense row-major the loop is one flat, auto-vectorizable
// pass; otherwise dims are coalesced and an odometer walks all but the last dim, with a flat
// inner loop over the last one.
// Threading: the flat element range is split across OpenMP threads (kElementwiseGrain).
// Every kernel writes its output with `=`.
//
// Each op is a functor, so the op switch runs once per call, outside every loop, and each
// (op, dtype) pair gets its own loop that the compiler can vectorize.
#include "mpigrad/kernels/elementwise.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#endif

#include "mpigrad/kernels/cpu/parallel.h"
#include "mpigrad/kernels/cpu/scalar.h"
#include "mpigrad/kernels/cpu/transpose.h"
#include "mpigrad/kernels/cpu/vector_math.h"

namespace mpigrad::kernels::cpu {
namespace {

// ---------------------------------------------------------------------------------------------
// Loop drivers

// __restrict lets the loop vectorize without runtime overlap checks. In-place ops (out == in)
// stay correct because element i is read before element i is written and nothing else
// overlaps; partially overlapping operands are not a valid elementwise call.
template <typename Out, typename Fn, typename... In>
void flat_kernel(int64_t n, Out* __restrict out, Fn fn, const In* __restrict... in) {
  for (int64_t i = 0; i < n; ++i) out[i] = fn(in[i]...);
}

template <typename Out, typename Fn, typename... In, size_t... I>
void strided_kernel(int64_t n, Out* out, int64_t out_stride, const int64_t* in_strides, Fn fn,
                    std::index_sequence<I...>, const In*... in) {
  for (int64_t j = 0; j < n; ++j) out[j * out_stride] = fn(in[j * in_strides[I]]...);
}

// Two operands where one is the same value along the whole row (a broadcast bias or scale,
// inner stride 0): hoisting it out lets the loop vectorize like flat_kernel.
template <typename Out, typename Fn, typename A, typename B>
void row_kernel_b_fixed(int64_t n, Out* __restrict out, Fn fn, const A* __restrict a, B b) {
  for (int64_t i = 0; i < n; ++i) out[i] = fn(a[i], b);
}
template <typename Out, typename Fn, typename A, typename B>
void row_kernel_a_fixed(int64_t n, Out* __restrict out, Fn fn, A a, const B* __restrict b) {
  for (int64_t i = 0; i < n; ++i) out[i] = fn(a, b[i]);
}

// The iteration space with size-1 dims dropped and mergeable neighbours merged
// (kernels::coalesced), so that, e.g., a dense slice of a larger tensor is one long inner loop.
using Walk = StridedLoop;
// Elements [begin, end) of the walk in row-major order, as row pieces along the last dim.
template <typename Out, typename Fn, typename... In, size_t... I>
void strided_range(const Walk& walk, int64_t begin, int64_t end, Fn fn,
                   std::index_sequence<I...> seq, Out* out, const In*... in) {
  constexpr int kOps = 1 + int(sizeof...(In));
  const int last = walk.ndim - 1;
  int64_t index[kMaxDims] = {};
  int64_t offset[kOps] = {};
  int64_t rest = begin;
  for (int d = last; d >= 0; --d) {
    index[d] = rest % walk.size[d];
    rest /= walk.size[d];
    for (int op = 0; op < kOps; ++op) offset[op] += index[d] * walk.stride[op][d];
  }
  const int64_t in_strides[sizeof...(In)] = {walk.stride[I + 1][last]...};
  bool unit_stride = walk.stride[0][last] == 1;
  for (int64_t s : in_strides) unit_stride = unit_stride && s == 1;
  // Binary ops whose second (or first) operand is fixed along the row: 1 = b fixed, 2 = a fixed.
  int fixed = 0;
  if constexpr (sizeof...(In) == 2) {
    if (walk.stride[0][last] == 1 && in_strides[0] == 1 && in_strides[1] == 0) fixed = 1;
    if (walk.stride[0][last] == 1 && in_strides[0] == 0 && in_strides[1] == 1) fixed = 2;
  }

  int64_t position = begin;
  while (position < end) {
    const int64_t count = std::min(walk.size[last] - index[last], end - position);
    if (unit_stride) {
      flat_kernel(count, out + offset[0], fn, (in + offset[I + 1])...);
    } else if (fixed != 0) {
      if constexpr (sizeof...(In) == 2) {
        const auto operands = std::tuple{(in + offset[I + 1])...};
        const auto* a = std::get<0>(operands);
        const auto* b = std::get<1>(operands);
        if (fixed == 1) {
          row_kernel_b_fixed(count, out + offset[0], fn, a, *b);
        } else {
          row_kernel_a_fixed(count, out + offset[0], fn, *a, b);
        }
      }
    } else {
      strided_kernel(count, out + offset[0], walk.stride[0][last], in_strides, fn, seq,
                     (in + offset[I + 1])...);
    }
    position += count;
    if (position >= end) break;
    // The piece ran to the end of its row: rewind the last dim and carry into the outer ones.
    for (int op = 0; op < kOps; ++op) offset[op] -= index[last] * walk.stride[op][last];
    index[last] = 0;
    for (int d = last - 1; d >= 0; --d) {
      ++index[d];
      for (int op = 0; op < kOps; ++op) offset[op] += walk.stride[op][d];
      if (index[d] < walk.size[d]) break;
      for (int op = 0; op < kOps; ++op) offset[op] -= walk.size[d] * walk.stride[op][d];
      index[d] = 0;
    }
  }
}

// out = fn(in...) over the loop; operand k of the loop is in[k - 1].
template <typename Out, typename Fn, typename... In>
void for_each_element(const StridedLoop& loop, Out* out, Fn fn, const In*... in) {
  constexpr int kOps = 1 + int(sizeof...(In));
  const int64_t n = loop.numel();
  if (n <= 0) return;
  if (loop.contiguous(kOps)) {
    parallel_for(0, n, kElementwiseGrain,
                 [&](int64_t b, int64_t e) { flat_kernel(e - b, out + b, fn, (in + b)...); });
    return;
  }
  const Walk walk = coalesced(loop, kOps);
  parallel_for(0, n, kElementwiseGrain, [&](int64_t b, int64_t e) {
    strided_range(walk, b, e, fn, std::index_sequence_for<In...>{}, out, in...);
  });
}

// ---------------------------------------------------------------------------------------------
// Scalar math, in the compute type C (float for the 16-bit floats); sign_of, int_div, int_pow,
// gelu_tanh_inner and the formulas' constants are kernels/scalar.h's, shared with CUDA.

template <typename C>
inline C sigmoid(C x) {
  // Never exponentiate a large positive number: exp(-|x|) stays in (0, 1].
  if (x >= C(0)) return C(1) / (C(1) + std::exp(-x));
  const C e = std::exp(x);
  return e / (C(1) + e);
}

// ---------------------------------------------------------------------------------------------
// ReLU (a CNN's), GELU, softplus, sigmoid and SiLU on dense Float32 in AVX2
// (kernels/cpu/vector_math.h): the others' scalar erf/tanh/exp/log1p cost as much as the GEMMs
// around them in small models (a transformer's MLP, SchNet's filters on every edge). `g` null:
// the forward op into out; otherwise g times its derivative at x. False when this call is not
// one it handles (then the scalar loops below run).

bool activation_dense_float(UnaryOp op, const StridedLoop& loop, int operands, const float* g,
                            const float* x, float* out) {
#if defined(MPIGRAD_HAS_AVX2_MATH)
  using vector_math::Activation;
  void (*piece)(int64_t, const float*, const float*, float*) = nullptr;
  switch (op) {
    case UnaryOp::Relu:  // max(0, x) keeps NaN and -0; g & (x > 0) is +0 where the select is 0
      piece = [](int64_t n, const float* dy, const float* in, float* y) MPIGRAD_AVX2 {
        int64_t i = 0;
        for (const __m256 zero = _mm256_setzero_ps(); i + 8 <= n; i += 8) {
          const __m256 v = _mm256_loadu_ps(in + i), keep = _mm256_cmp_ps(v, zero, _CMP_GT_OQ);
          _mm256_storeu_ps(
              y + i, dy ? _mm256_and_ps(_mm256_loadu_ps(dy + i), keep) : _mm256_max_ps(zero, v));
        }
        for (; i < n; ++i) y[i] = dy ? (in[i] > 0 ? dy[i] : 0.0f) : (in[i] < 0 ? 0.0f : in[i]);
      };
      break;
    case UnaryOp::GeluTanh:
      piece = vector_math::activation<Activation::GeluTanh>;
      break;
    case UnaryOp::GeluErf:
      piece = vector_math::activation<Activation::GeluErf>;
      break;
    case UnaryOp::Softplus:
      piece = vector_math::activation<Activation::Softplus>;
      break;
    case UnaryOp::Silu:
      piece = vector_math::activation<Activation::Silu>;
      break;
    case UnaryOp::Sigmoid:
      // Its backward is g y (1 - y), from the output, which the scalar loop vectorizes.
      if (g == nullptr) piece = vector_math::activation<Activation::Sigmoid>;
      break;
    default:
      break;
  }
  if (piece == nullptr || !loop.contiguous(operands) || !has_avx2_fma()) return false;
  const int64_t grain = kElementwiseGrain / (op == UnaryOp::Relu ? 1 : 8);  // others ~20 flops, exp
  parallel_for(0, loop.numel(), grain, [&](int64_t b, int64_t e) {
    piece(e - b, g == nullptr ? nullptr : g + b, x + b, out + b);
  });
  return true;
#else
  (void)op, (void)loop, (void)operands, (void)g, (void)x, (void)out;
  return false;
#endif
}

// ---------------------------------------------------------------------------------------------
// unary

template <typename T>
void unary_typed(UnaryOp op, DType dtype, const StridedLoop& loop, T* out, const T* in) {
  using C = compute_t<T>;
  if constexpr (std::is_same_v<T, float>) {
    if (activation_dense_float(op, loop, 2, nullptr, in, out)) return;
  }
  auto run = [&](auto f) {
    for_each_element(
        loop, out, [f](T x) { return T(f(C(x))); }, in);
  };
  if constexpr (std::is_same_v<T, bool>) {
    // Abs, Relu and Sign are the identity on {0, 1}; negating a Bool has no meaning.
    if (op == UnaryOp::Neg || !unary_op_allows_integers(op)) {
      throw_unsupported("unary", std::string("op ") + unary_op_name(op), dtype);
    }
    run([](C x) { return x; });
  } else if constexpr (std::is_integral_v<C>) {
    switch (op) {
      case UnaryOp::Neg:
        return run([](C x) { return wrap_sub(C(0), x); });
      case UnaryOp::Abs:
        return run([](C x) { return x < C(0) ? wrap_sub(C(0), x) : x; });
      case UnaryOp::Relu:
        return run([](C x) { return x < C(0) ? C(0) : x; });
      case UnaryOp::Sign:
        return run([](C x) { return sign_of(x); });
      default:
        throw_unsupported("unary", std::string("op ") + unary_op_name(op), dtype);
    }
  } else {
    switch (op) {
      case UnaryOp::Neg:
        return run([](C x) { return -x; });
      case UnaryOp::Exp:
        return run([](C x) { return std::exp(x); });
      case UnaryOp::Log:
        return run([](C x) { return std::log(x); });
      case UnaryOp::Sqrt:
        return run([](C x) { return std::sqrt(x); });
      case UnaryOp::Rsqrt:
        return run([](C x) { return C(1) / std::sqrt(x); });
      case UnaryOp::Abs:
        return run([](C x) { return std::abs(x); });
      // `x < 0 ? 0 : x` lets NaN through, as max(x, 0) does in PyTorch.
      case UnaryOp::Relu:
        return run([](C x) { return x < C(0) ? C(0) : x; });
      case UnaryOp::GeluErf:
        return run([](C x) { return C(0.5) * x * (C(1) + std::erf(x * C(kSqrtHalf))); });
      case UnaryOp::GeluTanh:
        return run([](C x) { return C(0.5) * x * (C(1) + std::tanh(gelu_tanh_inner(x))); });
      case UnaryOp::Silu:
        return run([](C x) { return x * sigmoid(x); });
      case UnaryOp::Sigmoid:
        return run([](C x) { return sigmoid(x); });
      case UnaryOp::Tanh:
        return run([](C x) { return std::tanh(x); });
      case UnaryOp::Sign:
        return run([](C x) { return sign_of(x); });
      case UnaryOp::Erf:
        return run([](C x) { return std::erf(x); });
      case UnaryOp::Sin:
        return run([](C x) { return std::sin(x); });
      case UnaryOp::Cos:
        return run([](C x) { return std::cos(x); });
      case UnaryOp::Softplus:
        return run([](C x) { return (x > C(0) ? x : C(0)) + std::log1p(std::exp(-std::abs(x))); });
    }
    throw_unsupported("unary", std::string("op ") + unary_op_name(op), dtype);
  }
}

// ---------------------------------------------------------------------------------------------
// unary_backward: fn(g, x, y) with g = grad_out, x = in, y = out

template <typename T>
void unary_backward_typed(UnaryOp op, DType dtype, const StridedLoop& loop, T* grad_in,
                          const T* grad_out, const T* in, const T* out) {
  using C = compute_t<T>;
  if constexpr (std::is_same_v<T, float>) {
    if (activation_dense_float(op, loop, 3, grad_out, in, grad_in)) return;
  }
  auto run = [&](auto f) {
    for_each_element(
        loop, grad_in, [f](T g, T x, T y) { return T(f(C(g), C(x), C(y))); }, grad_out, in, out);
  };
  if constexpr (std::is_same_v<T, bool>) {
    throw_unsupported("unary_backward", std::string("op ") + unary_op_name(op), dtype);
  } else if constexpr (std::is_integral_v<C>) {
    switch (op) {
      case UnaryOp::Neg:
        return run([](C g, C, C) { return wrap_sub(C(0), g); });
      case UnaryOp::Abs:
        return run([](C g, C x, C) { return wrap_mul(g, sign_of(x)); });
      case UnaryOp::Relu:
        return run([](C g, C x, C) { return x > C(0) ? g : C(0); });
      case UnaryOp::Sign:
        return run([](C, C, C) { return C(0); });
      default:
        throw_unsupported("unary_backward", std::string("op ") + unary_op_name(op), dtype);
    }
  } else {
    switch (op) {
      case UnaryOp::Neg:
        return run([](C g, C, C) { return -g; });
      case UnaryOp::Exp:
        return run([](C g, C, C y) { return g * y; });
      case UnaryOp::Log:
        return run([](C g, C x, C) { return g / x; });
      case UnaryOp::Sqrt:
        return run([](C g, C, C y) { return g / (C(2) * y); });
      case UnaryOp::Rsqrt:
        return run([](C g, C, C y) { return C(-0.5) * g * y * y * y; });
      case UnaryOp::Abs:
        return run([](C g, C x, C) { return g * sign_of(x); });
      // A select rather than g * (x > 0), so an infinite gradient at x <= 0 gives 0, not NaN.
      case UnaryOp::Relu:
        return run([](C g, C x, C) { return x > C(0) ? g : C(0); });
      case UnaryOp::GeluErf:
        return run([](C g, C x, C) {
          const C cdf = C(0.5) * (C(1) + std::erf(x * C(kSqrtHalf)));
          const C pdf = C(kInvSqrt2Pi) * std::exp(C(-0.5) * x * x);
          return g * (cdf + x * pdf);
        });
      case UnaryOp::GeluTanh:
        return run([](C g, C x, C) {
          const C t = std::tanh(gelu_tanh_inner(x));
          const C inner_grad = C(kSqrt2OverPi) * (C(1) + C(3 * kGeluCubic) * x * x);
          return g * (C(0.5) * (C(1) + t) + C(0.5) * x * (C(1) - t * t) * inner_grad);
        });
      case UnaryOp::Silu:
        return run([](C g, C x, C) {
          const C s = sigmoid(x);
          return g * (s * (C(1) + x * (C(1) - s)));
        });
      case UnaryOp::Sigmoid:
        return run([](C g, C, C y) { return g * y * (C(1) - y); });
      case UnaryOp::Tanh:
        return run([](C g, C, C y) { return g * (C(1) - y * y); });
      case UnaryOp::Sign:
        return run([](C, C, C) { return C(0); });
      case UnaryOp::Erf:
        return run([](C g, C x, C) { return g * C(kTwoOverSqrtPi) * std::exp(-x * x); });
      case UnaryOp::Sin:
        return run([](C g, C x, C) { return g * std::cos(x); });
      case UnaryOp::Cos:
        return run([](C g, C x, C) { return -g * std::sin(x); });
      case UnaryOp::Softplus:
        return run([](C g, C x, C) { return g * sigmoid(x); });
    }
    throw_unsupported("unary_backward", std::string("op ") + unary_op_name(op), dtype);
  }
}

// ---------------------------------------------------------------------------------------------
// binary

template <typename C>
inline C maximum(C a, C b) {
  return (is_nan(a) || a > b) ? a : b;  // b wins when it is NaN, since a > NaN is false
}

template <typename C>
inline C minimum(C a, C b) {
  return (is_nan(a) || a < b) ? a : b;
}

template <typename T>
void binary_typed(BinaryOp op, DType dtype, const StridedLoop& loop, void* out, const T* a,
                  const T* b) {
  using C = compute_t<T>;
  auto run = [&](auto f) {
    for_each_element(
        loop, static_cast<T*>(out), [f](T x, T y) { return T(f(C(x), C(y))); }, a, b);
  };
  auto compare = [&](auto f) {
    for_each_element(
        loop, static_cast<bool*>(out), [f](T x, T y) { return bool(f(C(x), C(y))); }, a, b);
  };
  switch (op) {
    case BinaryOp::Eq:
      return compare([](C x, C y) { return x == y; });
    case BinaryOp::Ne:
      return compare([](C x, C y) { return x != y; });
    case BinaryOp::Lt:
      return compare([](C x, C y) { return x < y; });
    case BinaryOp::Le:
      return compare([](C x, C y) { return x <= y; });
    case BinaryOp::Gt:
      return compare([](C x, C y) { return x > y; });
    case BinaryOp::Ge:
      return compare([](C x, C y) { return x >= y; });
    default:
      break;
  }
  if constexpr (std::is_same_v<T, bool>) {
    // Bool arithmetic is logic: + and max are or, * and min are and.
    switch (op) {
      case BinaryOp::Add:
      case BinaryOp::Maximum:
        return run([](C x, C y) { return x || y; });
      case BinaryOp::Mul:
      case BinaryOp::Minimum:
        return run([](C x, C y) { return x && y; });
      default:
        throw_unsupported("binary", std::string("op ") + binary_op_name(op), dtype);
    }
  } else if constexpr (std::is_integral_v<C>) {
    switch (op) {
      case BinaryOp::Add:
        return run([](C x, C y) { return wrap_add(x, y); });
      case BinaryOp::Sub:
        return run([](C x, C y) { return wrap_sub(x, y); });
      case BinaryOp::Mul:
        return run([](C x, C y) { return wrap_mul(x, y); });
      case BinaryOp::Div:
        return run([](C x, C y) { return int_div(x, y); });
      case BinaryOp::Maximum:
        return run([](C x, C y) { return x > y ? x : y; });
      case BinaryOp::Minimum:
        return run([](C x, C y) { return x < y ? x : y; });
      case BinaryOp::Pow:
        return run([](C x, C y) { return int_pow(x, y); });
      default:
        break;
    }
  } else {
    switch (op) {
      case BinaryOp::Add:
        return run([](C x, C y) { return x + y; });
      case BinaryOp::Sub:
        return run([](C x, C y) { return x - y; });
      case BinaryOp::Mul:
        return run([](C x, C y) { return x * y; });
      case BinaryOp::Div:
        return run([](C x, C y) { return x / y; });
      case BinaryOp::Maximum:
        return run([](C x, C y) { return maximum(x, y); });
      case BinaryOp::Minimum:
        return run([](C x, C y) { return minimum(x, y); });
      case BinaryOp::Pow:
        return run([](C x, C y) { return std::pow(x, y); });
      default:
        break;
    }
  }
  throw_unsupported("binary", std::string("op ") + binary_op_name(op), dtype);
}

// ---------------------------------------------------------------------------------------------
// copy

// Same-dtype copies move bits, never values: a strided Half copy needs no float round trip and
// keeps NaN payloads.
template <typename Word>
void copy_bits(const StridedLoop& loop, void* out, const void* in) {
  for_each_element(
      loop, static_cast<Word*>(out), [](Word x) { return x; }, static_cast<const Word*>(in));
}

// MPIGRAD_CPU_COPY=generic turns the blocked transpose and row paths off, to measure them.
bool blocked_copies() {
  static const bool enabled = [] {
    const char* value = std::getenv("MPIGRAD_CPU_COPY");
    return value == nullptr || std::string(value) != "generic";
  }();
  return enabled;
}

void copy_same_dtype(DType dtype, const StridedLoop& loop, void* out, const void* in,
                     bool blocked) {
  const int size = element_size(dtype);
  if (out == in) return;  // a view copied onto itself; memcpy must not see the overlap
  if (loop.contiguous(2)) {
    auto* out_bytes = static_cast<char*>(out);
    const auto* in_bytes = static_cast<const char*>(in);
    // A single memcpy cannot use more than one core's share of memory bandwidth.
    parallel_for(0, loop.numel() * size, int64_t(1) << 20, [&](int64_t b, int64_t e) {
      std::memcpy(out_bytes + b, in_bytes + b, size_t(e - b));
    });
    return;
  }
  if (blocked && copy_blocked(size, loop, out, in)) return;
  switch (size) {
    case 1:
      return copy_bits<uint8_t>(loop, out, in);
    case 2:
      return copy_bits<uint16_t>(loop, out, in);
    case 4:
      return copy_bits<uint32_t>(loop, out, in);
    default:
      return copy_bits<uint64_t>(loop, out, in);
  }
}

// ---------------------------------------------------------------------------------------------
// Dense 16-bit float conversion

// BFloat16's conversions vectorize as they are, given the instructions: float32 -> bfloat16 ran
// at 0.33-0.47 ns an element built for the baseline x86-64, 0.16-0.19 with AVX2 and 0.10-0.11
// with AVX-512 (1 MiB pieces, this 2-core VM). So each loop is built for all three and the CPU
// picks once. Half's (subnormals, NaN) do not vectorize so (1.2-1.8 ns an element, built for any
// of them): with AVX2 the float16 loops use F16C's conversion instructions instead, below.
template <typename Out, typename In>
[[gnu::always_inline]] inline void convert_loop(int64_t n, Out* __restrict out,
                                                const In* __restrict in) {
  for (int64_t i = 0; i < n; ++i) out[i] = Out(float(in[i]));
}
template <typename T>
[[gnu::always_inline]] inline void add_loop(int64_t n, const T* __restrict in,
                                            T* __restrict inout) {
  for (int64_t i = 0; i < n; ++i) inout[i] = T(float(in[i]) + float(inout[i]));
}

struct Dense16Loops {
  void (*to_bfloat16)(int64_t, BFloat16*, const float*);
  void (*from_bfloat16)(int64_t, float*, const BFloat16*);
  void (*add_bfloat16)(int64_t, const BFloat16*, BFloat16*);
  void (*to_half)(int64_t, Half*, const float*);
  void (*from_half)(int64_t, float*, const Half*);
  void (*add_half)(int64_t, const Half*, Half*);
};

#define MPIGRAD_BFLOAT16_LOOPS(isa, target)                                        \
  target void to_bfloat16_##isa(int64_t n, BFloat16* out, const float* in) {       \
    convert_loop(n, out, in);                                                      \
  }                                                                                \
  target void from_bfloat16_##isa(int64_t n, float* out, const BFloat16* in) {     \
    convert_loop(n, out, in);                                                      \
  }                                                                                \
  target void add_bfloat16_##isa(int64_t n, const BFloat16* in, BFloat16* inout) { \
    add_loop(n, in, inout);                                                        \
  }

MPIGRAD_BFLOAT16_LOOPS(baseline, )
void to_half_baseline(int64_t n, Half* out, const float* in) {
  convert_loop(n, out, in);
}
void from_half_baseline(int64_t n, float* out, const Half* in) {
  convert_loop(n, out, in);
}
void add_half_baseline(int64_t n, const Half* in, Half* inout) {
  add_loop(n, in, inout);
}
constexpr Dense16Loops kBaselineLoops{to_bfloat16_baseline,  from_bfloat16_baseline,
                                      add_bfloat16_baseline, to_half_baseline,
                                      from_half_baseline,    add_half_baseline};

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define MPIGRAD_HAS_ISA_LOOPS 1
MPIGRAD_BFLOAT16_LOOPS(avx2, __attribute__((target("avx2,fma"))))
MPIGRAD_BFLOAT16_LOOPS(avx512, __attribute__((target("avx512f,avx512bw,avx512vl"))))

// float16 through F16C, which every AVX2 and AVX-512 CPU has: the hardware rounds to nearest
// even through the subnormals as Half does; only NaNs differ (it keeps their payloads and makes
// them quiet, where Half gives sign | 0x7e00 narrowing and keeps a signalling NaN signalling
// widening), so those lanes are set to Half's bits after.
#define MPIGRAD_F16C __attribute__((target("avx2,fma,f16c")))

MPIGRAD_F16C inline __m128i narrow_8(__m256 x) {
  const __m128i h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m128i exponent = _mm_set1_epi16(0x7c00);
  const __m128i mantissa_zero =
      _mm_cmpeq_epi16(_mm_and_si128(h, _mm_set1_epi16(0x03ff)), _mm_setzero_si128());
  const __m128i nan =
      _mm_andnot_si128(mantissa_zero, _mm_cmpeq_epi16(_mm_and_si128(h, exponent), exponent));
  const __m128i canonical =
      _mm_or_si128(_mm_and_si128(h, _mm_set1_epi16(int16_t(-32768))), _mm_set1_epi16(0x7e00));
  return _mm_blendv_epi8(h, canonical, nan);
}

MPIGRAD_F16C inline __m256 widen_8(__m128i h) {
  const __m256 x = _mm256_cvtph_ps(h);
  const __m256i w = _mm256_cvtepu16_epi32(h);
  const __m256i exponent = _mm256_set1_epi32(0x7c00);
  const __m256i special_lane = _mm256_cmpeq_epi32(_mm256_and_si256(w, exponent), exponent);
  // inf and NaN as Half::to_float writes them: sign | 0x7f800000 | mantissa << 13.
  const __m256i special = _mm256_or_si256(
      _mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(w, _mm256_set1_epi32(0x8000)), 16),
                      _mm256_set1_epi32(0x7f800000)),
      _mm256_slli_epi32(_mm256_and_si256(w, _mm256_set1_epi32(0x03ff)), 13));
  return _mm256_blendv_ps(x, _mm256_castsi256_ps(special), _mm256_castsi256_ps(special_lane));
}

MPIGRAD_F16C void to_half_f16c(int64_t n, Half* out, const float* in) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), narrow_8(_mm256_loadu_ps(in + i)));
  }
  for (; i < n; ++i) out[i] = Half(in[i]);
}
MPIGRAD_F16C void from_half_f16c(int64_t n, float* out, const Half* in) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i, widen_8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  }
  for (; i < n; ++i) out[i] = float(in[i]);
}
MPIGRAD_F16C void add_half_f16c(int64_t n, const Half* in, Half* inout) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    auto* target = reinterpret_cast<__m128i*>(inout + i);
    const __m256 a = widen_8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)));
    const __m256 b = widen_8(_mm_loadu_si128(target));
    _mm_storeu_si128(target, narrow_8(_mm256_add_ps(a, b)));
  }
  for (; i < n; ++i) inout[i] = Half(float(in[i]) + float(inout[i]));
}
#undef MPIGRAD_F16C

constexpr Dense16Loops kAvx2Loops{to_bfloat16_avx2, from_bfloat16_avx2, add_bfloat16_avx2,
                                  to_half_f16c,     from_half_f16c,     add_half_f16c};
constexpr Dense16Loops kAvx512Loops{to_bfloat16_avx512, from_bfloat16_avx512, add_bfloat16_avx512,
                                    to_half_f16c,       from_half_f16c,       add_half_f16c};
#endif
#undef MPIGRAD_BFLOAT16_LOOPS

const Dense16Loops& dense16_loops() {
  static const Dense16Loops chosen = [] {
#if defined(MPIGRAD_HAS_ISA_LOOPS)
    const bool f16c = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                      __builtin_cpu_supports("f16c");
    if (f16c && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl")) {
      return kAvx512Loops;
    }
    if (f16c) return kAvx2Loops;
#endif
    return kBaselineLoops;
  }();
  return chosen;
}
#undef MPIGRAD_HAS_ISA_LOOPS

bool is_16bit_float(DType dtype) {
  return dtype == DType::BFloat16 || dtype == DType::Float16;
}

// The pairs convert_dense takes.
bool dense_convertible(DType out_dtype, DType in_dtype) {
  return (out_dtype == DType::Float32 && is_16bit_float(in_dtype)) ||
         (in_dtype == DType::Float32 && is_16bit_float(out_dtype));
}

}  // namespace

void convert_dense(DType out_dtype, DType in_dtype, int64_t n, void* out, const void* in) {
  const Dense16Loops& loops = dense16_loops();
  if (out_dtype == DType::Float32 && in_dtype == DType::BFloat16) {
    return loops.from_bfloat16(n, static_cast<float*>(out), static_cast<const BFloat16*>(in));
  }
  if (out_dtype == DType::BFloat16 && in_dtype == DType::Float32) {
    return loops.to_bfloat16(n, static_cast<BFloat16*>(out), static_cast<const float*>(in));
  }
  if (out_dtype == DType::Float32 && in_dtype == DType::Float16) {
    return loops.from_half(n, static_cast<float*>(out), static_cast<const Half*>(in));
  }
  if (out_dtype == DType::Float16 && in_dtype == DType::Float32) {
    return loops.to_half(n, static_cast<Half*>(out), static_cast<const float*>(in));
  }
  throw std::invalid_argument(std::string("cpu convert_dense: no conversion from ") +
                              dtype_name(in_dtype) + " to " + dtype_name(out_dtype) +
                              " (float32 to or from bfloat16 or float16 only)");
}

void add_16bit_dense(DType dtype, int64_t n, const void* in, void* inout) {
  const Dense16Loops& loops = dense16_loops();
  if (dtype == DType::BFloat16) {
    return loops.add_bfloat16(n, static_cast<const BFloat16*>(in), static_cast<BFloat16*>(inout));
  }
  if (dtype == DType::Float16) {
    return loops.add_half(n, static_cast<const Half*>(in), static_cast<Half*>(inout));
  }
  throw_unsupported("add_16bit_dense", "a 16-bit float", dtype);
}

void unary(UnaryOp op, DType dtype, const StridedLoop& loop, void* out, const void* in) {
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    unary_typed<T>(op, dtype, loop, static_cast<T*>(out), static_cast<const T*>(in));
  });
}

void unary_backward(UnaryOp op, DType dtype, const StridedLoop& loop, void* grad_in,
                    const void* grad_out, const void* in, const void* out) {
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    unary_backward_typed<T>(op, dtype, loop, static_cast<T*>(grad_in),
                            static_cast<const T*>(grad_out), static_cast<const T*>(in),
                            static_cast<const T*>(out));
  });
}

void binary(BinaryOp op, DType dtype, const StridedLoop& loop, void* out, const void* a,
            const void* b) {
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    binary_typed<T>(op, dtype, loop, out, static_cast<const T*>(a), static_cast<const T*>(b));
  });
}

void where(DType dtype, const StridedLoop& loop, void* out, const void* cond, const void* a,
           const void* b) {
  // cond is read as bytes: a Bool buffer filled from outside (a file, a cast) may hold values
  // other than 0 and 1, and reading those as C++ bool is undefined.
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    for_each_element(
        loop, static_cast<T*>(out), [](uint8_t c, T x, T y) { return c != 0 ? x : y; },
        static_cast<const uint8_t*>(cond), static_cast<const T*>(a), static_cast<const T*>(b));
  });
}

void clamp(DType dtype, const StridedLoop& loop, void* out, const void* in, double lo, double hi) {
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    const C low = saturate_bound<T>(lo);
    const C high = saturate_bound<T>(hi);
    // Applied as max then min, so lo > hi gives hi everywhere and NaN inputs pass through.
    for_each_element(
        loop, static_cast<T*>(out),
        [low, high](T x) {
          C y = C(x) < low ? low : C(x);
          return T(y > high ? high : y);
        },
        static_cast<const T*>(in));
  });
}

void copy(DType out_dtype, DType in_dtype, const StridedLoop& loop, void* out, const void* in) {
  if (out_dtype == in_dtype) return copy_same_dtype(out_dtype, loop, out, in, blocked_copies());
  if (loop.contiguous(2) && dense_convertible(out_dtype, in_dtype)) {
    auto* out_bytes = static_cast<char*>(out);
    const auto* in_bytes = static_cast<const char*>(in);
    const int out_size = element_size(out_dtype), in_size = element_size(in_dtype);
    parallel_for(0, loop.numel(), kElementwiseGrain, [&](int64_t b, int64_t e) {
      convert_dense(out_dtype, in_dtype, e - b, out_bytes + b * out_size, in_bytes + b * in_size);
    });
    return;
  }
  visit_dtype(out_dtype, [&](auto out_tag) {
    using To = decltype(out_tag);
    visit_dtype(in_dtype, [&](auto in_tag) {
      using From = decltype(in_tag);
      for_each_element(
          loop, static_cast<To*>(out), [](From x) { return cast_to<To>(x); },
          static_cast<const From*>(in));
    });
  });
}

void copy_generic(DType out_dtype, DType in_dtype, const StridedLoop& loop, void* out,
                  const void* in) {
  if (out_dtype == in_dtype) return copy_same_dtype(out_dtype, loop, out, in, false);
  copy(out_dtype, in_dtype, loop, out, in);
}

void fill(DType dtype, int64_t n, void* out, double value) {
  if (value == 0.0 && !std::signbit(value)) {
    // +0 is all zero bits in every dtype: memset uses the widest stores the CPU has (zero_grad
    // of 36 MiB of gradients: 2-3.5 ms against 3.5-6 ms for the compiler's baseline loop).
    const int64_t bytes = n * element_size(dtype);
    char* dst = static_cast<char*>(out);
    parallel_for(0, bytes, kElementwiseGrain * 4,
                 [&](int64_t b, int64_t e) { std::memset(dst + b, 0, size_t(e - b)); });
    return;
  }
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T v = cast_to<T>(value);
    T* dst = static_cast<T*>(out);
    parallel_for(0, n, kElementwiseGrain,
                 [&](int64_t b, int64_t e) { std::fill(dst + b, dst + e, v); });
  });
}

void arange(DType dtype, int64_t n, void* out, double start, double step) {
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* dst = static_cast<T*>(out);
    parallel_for(0, n, kElementwiseGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) dst[i] = cast_to<T>(start + double(i) * step);
    });
  });
}

}  // namespace mpigrad::kernels::cpu
