// CUDA elementwise kernels: unary, unary_backward, binary, where, clamp, copy (cast), fill, arange.
//
// Layout: a StridedLoop of up to kMaxDims dims with element strides per operand (operand 0 is the
// output), as in kernels/elementwise.h.
// Thread mapping:
//   - every operand dense and 16-byte-aligned: one thread per 16-byte vector of the widest
//     operand (4 floats, 8 halves), loaded and stored as one 16-byte access; the tail that does
//     not fill a vector runs one element per thread;
//   - otherwise: one thread per element, its operand offsets computed from the coalesced walk.
//   Both are grid-stride loops over at most kMaxBlocks blocks of kThreads threads.
// Every kernel writes its output with `=`.
//
// Compile time: the op is a runtime switch inside one kernel per (dtype, arity), not a template
// parameter, so the file instantiates a few dozen kernels rather than one per (op, dtype).
// The switch is uniform across a warp, so it costs no divergence. Semantics (integer wrapping,
// NaN rules, Bool logic, casts) are those of kernels/cpu/elementwise.cpp, element for element.
#include <cstring>
#include <string>
#include <type_traits>

#include "mpigrad/kernels/cuda/common.cuh"
#include "mpigrad/kernels/elementwise.h"

namespace mpigrad::kernels::cuda {
namespace {

using detail::as_stream;
using detail::kThreads;

// ---- Storage: Bool travels as a byte so that any byte value reads as != 0 ---------------------

template <typename T>
using storage_t = std::conditional_t<std::is_same_v<T, bool>, uint8_t, T>;

template <typename T>
__host__ __device__ __forceinline__ T from_storage(storage_t<T> s) {
  if constexpr (std::is_same_v<T, bool>) {
    return s != 0;
  } else {
    return s;
  }
}

template <typename T>
__host__ __device__ __forceinline__ storage_t<T> to_storage(T v) {
  if constexpr (std::is_same_v<T, bool>) {
    return uint8_t(v ? 1 : 0);
  } else {
    return v;
  }
}

template <typename T, int V>
struct alignas(sizeof(T) * V) Vec {
  T v[V];
};

template <typename... T>
constexpr int vector_width() {
  size_t widest = 1;
  ((widest = sizeof(T) > widest ? sizeof(T) : widest), ...);
  return int(16 / widest);
}

inline bool aligned(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// ---- Map kernels: out = fn(in...) for one, two and three inputs -------------------------------

template <typename Out, typename Fn, typename A>
__global__ void map1_flat(int64_t begin, int64_t n, storage_t<Out>* out, Fn fn,
                          const storage_t<A>* a) {
  for (int64_t i = begin + blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    out[i] = to_storage<Out>(fn(from_storage<A>(a[i])));
  }
}

template <int V, typename Out, typename Fn, typename A>
__global__ void map1_vec(int64_t chunks, storage_t<Out>* out, Fn fn, const storage_t<A>* a) {
  using VO = Vec<storage_t<Out>, V>;
  using VA = Vec<storage_t<A>, V>;
  for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < chunks;
       c += int64_t(gridDim.x) * blockDim.x) {
    const VA va = reinterpret_cast<const VA*>(a)[c];
    VO vo;
#pragma unroll
    for (int k = 0; k < V; ++k) vo.v[k] = to_storage<Out>(fn(from_storage<A>(va.v[k])));
    reinterpret_cast<VO*>(out)[c] = vo;
  }
}

template <typename Out, typename Fn, typename A>
__global__ void map1_strided(detail::Walk walk, storage_t<Out>* out, Fn fn, const storage_t<A>* a) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < walk.numel;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t offset[2];
    detail::walk_offsets<2>(walk, i, offset);
    out[offset[0]] = to_storage<Out>(fn(from_storage<A>(a[offset[1]])));
  }
}

template <typename Out, typename Fn, typename A, typename B>
__global__ void map2_flat(int64_t begin, int64_t n, storage_t<Out>* out, Fn fn,
                          const storage_t<A>* a, const storage_t<B>* b) {
  for (int64_t i = begin + blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    out[i] = to_storage<Out>(fn(from_storage<A>(a[i]), from_storage<B>(b[i])));
  }
}

template <int V, typename Out, typename Fn, typename A, typename B>
__global__ void map2_vec(int64_t chunks, storage_t<Out>* out, Fn fn, const storage_t<A>* a,
                         const storage_t<B>* b) {
  using VO = Vec<storage_t<Out>, V>;
  using VA = Vec<storage_t<A>, V>;
  using VB = Vec<storage_t<B>, V>;
  for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < chunks;
       c += int64_t(gridDim.x) * blockDim.x) {
    const VA va = reinterpret_cast<const VA*>(a)[c];
    const VB vb = reinterpret_cast<const VB*>(b)[c];
    VO vo;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      vo.v[k] = to_storage<Out>(fn(from_storage<A>(va.v[k]), from_storage<B>(vb.v[k])));
    }
    reinterpret_cast<VO*>(out)[c] = vo;
  }
}

template <typename Out, typename Fn, typename A, typename B>
__global__ void map2_strided(detail::Walk walk, storage_t<Out>* out, Fn fn, const storage_t<A>* a,
                             const storage_t<B>* b) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < walk.numel;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t offset[3];
    detail::walk_offsets<3>(walk, i, offset);
    out[offset[0]] =
        to_storage<Out>(fn(from_storage<A>(a[offset[1]]), from_storage<B>(b[offset[2]])));
  }
}

template <typename Out, typename Fn, typename A, typename B, typename C>
__global__ void map3_flat(int64_t begin, int64_t n, storage_t<Out>* out, Fn fn,
                          const storage_t<A>* a, const storage_t<B>* b, const storage_t<C>* c) {
  for (int64_t i = begin + blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    out[i] =
        to_storage<Out>(fn(from_storage<A>(a[i]), from_storage<B>(b[i]), from_storage<C>(c[i])));
  }
}

template <int V, typename Out, typename Fn, typename A, typename B, typename C>
__global__ void map3_vec(int64_t chunks, storage_t<Out>* out, Fn fn, const storage_t<A>* a,
                         const storage_t<B>* b, const storage_t<C>* c) {
  using VO = Vec<storage_t<Out>, V>;
  using VA = Vec<storage_t<A>, V>;
  using VB = Vec<storage_t<B>, V>;
  using VC = Vec<storage_t<C>, V>;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < chunks;
       i += int64_t(gridDim.x) * blockDim.x) {
    const VA va = reinterpret_cast<const VA*>(a)[i];
    const VB vb = reinterpret_cast<const VB*>(b)[i];
    const VC vc = reinterpret_cast<const VC*>(c)[i];
    VO vo;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      vo.v[k] = to_storage<Out>(
          fn(from_storage<A>(va.v[k]), from_storage<B>(vb.v[k]), from_storage<C>(vc.v[k])));
    }
    reinterpret_cast<VO*>(out)[i] = vo;
  }
}

template <typename Out, typename Fn, typename A, typename B, typename C>
__global__ void map3_strided(detail::Walk walk, storage_t<Out>* out, Fn fn, const storage_t<A>* a,
                             const storage_t<B>* b, const storage_t<C>* c) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < walk.numel;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t offset[4];
    detail::walk_offsets<4>(walk, i, offset);
    out[offset[0]] =
        to_storage<Out>(fn(from_storage<A>(a[offset[1]]), from_storage<B>(b[offset[2]]),
                           from_storage<C>(c[offset[3]])));
  }
}

// ---- Host drivers: pick vectorized, flat or strided ---------------------------------------

template <typename T>
storage_t<T>* st(void* p) {
  return static_cast<storage_t<T>*>(p);
}
template <typename T>
const storage_t<T>* st(const void* p) {
  return static_cast<const storage_t<T>*>(p);
}

template <typename Out, typename A, typename Fn>
void run_map1(const StridedLoop& loop, void* out, const void* a, Fn fn, void* stream) {
  const int64_t n = loop.numel();
  if (n <= 0) return;
  cudaStream_t s = as_stream(stream);
  if (loop.contiguous(2)) {
    constexpr int V = vector_width<storage_t<Out>, storage_t<A>>();
    int64_t done = 0;
    if (aligned(out, V * sizeof(storage_t<Out>)) && aligned(a, V * sizeof(storage_t<A>))) {
      const int64_t chunks = n / V;
      if (chunks > 0) {
        map1_vec<V, Out, Fn, A>
            <<<detail::grid_for(chunks), kThreads, 0, s>>>(chunks, st<Out>(out), fn, st<A>(a));
      }
      done = chunks * V;
    }
    if (done < n) {
      map1_flat<Out, Fn, A>
          <<<detail::grid_for(n - done), kThreads, 0, s>>>(done, n, st<Out>(out), fn, st<A>(a));
    }
    return;
  }
  const detail::Walk walk = detail::coalesce(loop, 2);
  map1_strided<Out, Fn, A>
      <<<detail::grid_for(n), kThreads, 0, s>>>(walk, st<Out>(out), fn, st<A>(a));
}

template <typename Out, typename A, typename B, typename Fn>
void run_map2(const StridedLoop& loop, void* out, const void* a, const void* b, Fn fn,
              void* stream) {
  const int64_t n = loop.numel();
  if (n <= 0) return;
  cudaStream_t s = as_stream(stream);
  if (loop.contiguous(3)) {
    constexpr int V = vector_width<storage_t<Out>, storage_t<A>, storage_t<B>>();
    int64_t done = 0;
    if (aligned(out, V * sizeof(storage_t<Out>)) && aligned(a, V * sizeof(storage_t<A>)) &&
        aligned(b, V * sizeof(storage_t<B>))) {
      const int64_t chunks = n / V;
      if (chunks > 0) {
        map2_vec<V, Out, Fn, A, B><<<detail::grid_for(chunks), kThreads, 0, s>>>(
            chunks, st<Out>(out), fn, st<A>(a), st<B>(b));
      }
      done = chunks * V;
    }
    if (done < n) {
      map2_flat<Out, Fn, A, B><<<detail::grid_for(n - done), kThreads, 0, s>>>(
          done, n, st<Out>(out), fn, st<A>(a), st<B>(b));
    }
    return;
  }
  const detail::Walk walk = detail::coalesce(loop, 3);
  map2_strided<Out, Fn, A, B>
      <<<detail::grid_for(n), kThreads, 0, s>>>(walk, st<Out>(out), fn, st<A>(a), st<B>(b));
}

template <typename Out, typename A, typename B, typename C, typename Fn>
void run_map3(const StridedLoop& loop, void* out, const void* a, const void* b, const void* c,
              Fn fn, void* stream) {
  const int64_t n = loop.numel();
  if (n <= 0) return;
  cudaStream_t s = as_stream(stream);
  if (loop.contiguous(4)) {
    constexpr int V = vector_width<storage_t<Out>, storage_t<A>, storage_t<B>, storage_t<C>>();
    int64_t done = 0;
    if (aligned(out, V * sizeof(storage_t<Out>)) && aligned(a, V * sizeof(storage_t<A>)) &&
        aligned(b, V * sizeof(storage_t<B>)) && aligned(c, V * sizeof(storage_t<C>))) {
      const int64_t chunks = n / V;
      if (chunks > 0) {
        map3_vec<V, Out, Fn, A, B, C><<<detail::grid_for(chunks), kThreads, 0, s>>>(
            chunks, st<Out>(out), fn, st<A>(a), st<B>(b), st<C>(c));
      }
      done = chunks * V;
    }
    if (done < n) {
      map3_flat<Out, Fn, A, B, C><<<detail::grid_for(n - done), kThreads, 0, s>>>(
          done, n, st<Out>(out), fn, st<A>(a), st<B>(b), st<C>(c));
    }
    return;
  }
  const detail::Walk walk = detail::coalesce(loop, 4);
  map3_strided<Out, Fn, A, B, C><<<detail::grid_for(n), kThreads, 0, s>>>(
      walk, st<Out>(out), fn, st<A>(a), st<B>(b), st<C>(c));
}

// ---- Scalar math in the compute type C (float for the 16-bit floats) -----------------------
// sign_of, int_div, int_pow, gelu_tanh_inner and the formulas' constants are kernels/scalar.h's,
// shared with the CPU.

template <typename C>
__device__ __forceinline__ C sigmoid(C x) {
  if (x >= C(0)) return C(1) / (C(1) + detail::m_exp(-x));
  const C e = detail::m_exp(x);
  return e / (C(1) + e);
}

// ---- Op functors: the op is a member, switched per element ------------------------------------

template <typename T>
struct UnaryFn {
  UnaryOp op;
  __device__ T operator()(T value) const {
    using C = compute_t<T>;
    if constexpr (std::is_same_v<T, bool>) {
      return value;  // Abs, Relu and Sign are the identity on {0, 1}
    } else if constexpr (std::is_integral_v<C>) {
      const C x = C(value);
      switch (op) {
        case UnaryOp::Neg:
          return wrap_sub(C(0), x);
        case UnaryOp::Abs:
          return is_negative(x) ? wrap_sub(C(0), x) : x;
        case UnaryOp::Relu:
          return is_negative(x) ? C(0) : x;
        case UnaryOp::Sign:
          return sign_of(x);
        default:
          return C(0);  // refused on the host
      }
    } else {
      const C x = C(value);
      switch (op) {
        case UnaryOp::Neg:
          return T(-x);
        case UnaryOp::Exp:
          return T(detail::m_exp(x));
        case UnaryOp::Log:
          return T(detail::m_log(x));
        case UnaryOp::Sqrt:
          return T(detail::m_sqrt(x));
        case UnaryOp::Rsqrt:
          return T(C(1) / detail::m_sqrt(x));
        case UnaryOp::Abs:
          return T(detail::m_abs(x));
        case UnaryOp::Relu:
          return T(x < C(0) ? C(0) : x);
        case UnaryOp::GeluErf:
          return T(C(0.5) * x * (C(1) + detail::m_erf(x * C(kSqrtHalf))));
        case UnaryOp::GeluTanh:
          return T(C(0.5) * x * (C(1) + detail::m_tanh(gelu_tanh_inner(x))));
        case UnaryOp::Silu:
          return T(x * sigmoid(x));
        case UnaryOp::Sigmoid:
          return T(sigmoid(x));
        case UnaryOp::Tanh:
          return T(detail::m_tanh(x));
        case UnaryOp::Sign:
          return T(sign_of(x));
        case UnaryOp::Erf:
          return T(detail::m_erf(x));
        case UnaryOp::Sin:
          return T(detail::m_sin(x));
        case UnaryOp::Cos:
          return T(detail::m_cos(x));
        case UnaryOp::Softplus:
          return T((x > C(0) ? x : C(0)) + detail::m_log(C(1) + detail::m_exp(-detail::m_abs(x))));
      }
      return T(C(0));
    }
  }
};

// fn(g, x, y) with g = grad_out, x = in, y = out.
template <typename T>
struct UnaryBackwardFn {
  UnaryOp op;
  __device__ T operator()(T g_value, T x_value, T y_value) const {
    using C = compute_t<T>;
    if constexpr (std::is_same_v<T, bool>) {
      return false;  // refused on the host
    } else if constexpr (std::is_integral_v<C>) {
      const C g = C(g_value), x = C(x_value);
      switch (op) {
        case UnaryOp::Neg:
          return wrap_sub(C(0), g);
        case UnaryOp::Abs:
          return wrap_mul(g, sign_of(x));
        case UnaryOp::Relu:
          return x > C(0) ? g : C(0);
        default:
          return C(0);  // Sign; the rest are refused on the host
      }
    } else {
      const C g = C(g_value), x = C(x_value), y = C(y_value);
      switch (op) {
        case UnaryOp::Neg:
          return T(-g);
        case UnaryOp::Exp:
          return T(g * y);
        case UnaryOp::Log:
          return T(g / x);
        case UnaryOp::Sqrt:
          return T(g / (C(2) * y));
        case UnaryOp::Rsqrt:
          return T(C(-0.5) * g * y * y * y);
        case UnaryOp::Abs:
          return T(g * sign_of(x));
        case UnaryOp::Relu:
          return T(x > C(0) ? g : C(0));
        case UnaryOp::GeluErf: {
          const C cdf = C(0.5) * (C(1) + detail::m_erf(x * C(kSqrtHalf)));
          const C pdf = C(kInvSqrt2Pi) * detail::m_exp(C(-0.5) * x * x);
          return T(g * (cdf + x * pdf));
        }
        case UnaryOp::GeluTanh: {
          const C t = detail::m_tanh(gelu_tanh_inner(x));
          const C inner_grad = C(kSqrt2OverPi) * (C(1) + C(3 * kGeluCubic) * x * x);
          return T(g * (C(0.5) * (C(1) + t) + C(0.5) * x * (C(1) - t * t) * inner_grad));
        }
        case UnaryOp::Silu: {
          const C s = sigmoid(x);
          return T(g * (s * (C(1) + x * (C(1) - s))));
        }
        case UnaryOp::Sigmoid:
          return T(g * y * (C(1) - y));
        case UnaryOp::Tanh:
          return T(g * (C(1) - y * y));
        case UnaryOp::Sign:
          return T(C(0));
        case UnaryOp::Erf:
          return T(g * C(kTwoOverSqrtPi) * detail::m_exp(-x * x));
        case UnaryOp::Sin:
          return T(g * detail::m_cos(x));
        case UnaryOp::Cos:
          return T(-g * detail::m_sin(x));
        case UnaryOp::Softplus:
          return T(g * sigmoid(x));
      }
      return T(C(0));
    }
  }
};

template <typename T>
struct BinaryFn {
  BinaryOp op;
  __device__ T operator()(T a_value, T b_value) const {
    using C = compute_t<T>;
    const C x = C(a_value), y = C(b_value);
    if constexpr (std::is_same_v<T, bool>) {
      // Bool arithmetic is logic: + and max are or, * and min are and.
      if (op == BinaryOp::Add || op == BinaryOp::Maximum) return x || y;
      return x && y;
    } else if constexpr (std::is_integral_v<C>) {
      switch (op) {
        case BinaryOp::Add:
          return wrap_add(x, y);
        case BinaryOp::Sub:
          return wrap_sub(x, y);
        case BinaryOp::Mul:
          return wrap_mul(x, y);
        case BinaryOp::Div:
          return int_div(x, y);
        case BinaryOp::Maximum:
          return x > y ? x : y;
        case BinaryOp::Minimum:
          return x < y ? x : y;
        case BinaryOp::Pow:
          return int_pow(x, y);
        default:
          return C(0);
      }
    } else {
      switch (op) {
        case BinaryOp::Add:
          return T(x + y);
        case BinaryOp::Sub:
          return T(x - y);
        case BinaryOp::Mul:
          return T(x * y);
        case BinaryOp::Div:
          return T(x / y);
        case BinaryOp::Maximum:
          return T((is_nan(x) || x > y) ? x : y);
        case BinaryOp::Minimum:
          return T((is_nan(x) || x < y) ? x : y);
        case BinaryOp::Pow:
          return T(detail::m_pow(x, y));
        default:
          return T(C(0));
      }
    }
  }
};

template <typename T>
struct CompareFn {
  BinaryOp op;
  __device__ bool operator()(T a_value, T b_value) const {
    using C = compute_t<T>;
    const C x = C(a_value), y = C(b_value);
    switch (op) {
      case BinaryOp::Eq:
        return x == y;
      case BinaryOp::Ne:
        return x != y;
      case BinaryOp::Lt:
        return x < y;
      case BinaryOp::Le:
        return x <= y;
      case BinaryOp::Gt:
        return x > y;
      case BinaryOp::Ge:
        return x >= y;
      default:
        return false;
    }
  }
};

template <typename T>
struct WhereFn {
  __device__ T operator()(uint8_t cond, T a, T b) const { return cond != 0 ? a : b; }
};

template <typename T>
struct ClampFn {
  compute_t<T> low, high;
  __device__ T operator()(T value) const {
    using C = compute_t<T>;
    // max then min, so lo > hi gives hi everywhere and NaN passes through, as on the CPU.
    const C y = C(value) < low ? low : C(value);
    return T(y > high ? high : y);
  }
};

template <typename To, typename From>
struct CastFn {
  __device__ To operator()(From value) const { return cast_to<To>(value); }
};

template <typename T>
struct IdentityFn {
  __device__ T operator()(T value) const { return value; }
};

// ---- Host-side support checks (the CPU kernels' rules) ------------------------------------

bool is_integer_dtype(DType dtype) {
  return dtype == DType::Int32 || dtype == DType::Int64 || dtype == DType::UInt8;
}

// Same-dtype strided copies move bits by width, as on the CPU.
template <typename Word>
void copy_bits(const StridedLoop& loop, void* out, const void* in, void* stream) {
  run_map1<Word, Word>(loop, out, in, IdentityFn<Word>{}, stream);
}

template <typename T>
__global__ void fill_kernel(int64_t n, storage_t<T>* out, storage_t<T> value) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    out[i] = value;
  }
}

template <typename T, int V>
__global__ void fill_vec_kernel(int64_t chunks, storage_t<T>* out, storage_t<T> value) {
  using VT = Vec<storage_t<T>, V>;
  VT v;
#pragma unroll
  for (int k = 0; k < V; ++k) v.v[k] = value;
  for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < chunks;
       c += int64_t(gridDim.x) * blockDim.x) {
    reinterpret_cast<VT*>(out)[c] = v;
  }
}

template <typename T>
__global__ void arange_kernel(int64_t n, storage_t<T>* out, double start, double step) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    // Rounded multiply then add (no fused multiply-add), as the CPU computes start + i * step.
    const double value = __dadd_rn(start, __dmul_rn(double(i), step));
    out[i] = to_storage<T>(cast_to<T>(value));
  }
}

}  // namespace

void unary(UnaryOp op, DType dtype, const StridedLoop& loop, void* out, const void* in,
           void* stream) {
  if (dtype == DType::Bool ? (op == UnaryOp::Neg || !unary_op_allows_integers(op))
                           : (is_integer_dtype(dtype) && !unary_op_allows_integers(op))) {
    detail::throw_unsupported("unary", std::string("op ") + unary_op_name(op), dtype);
  }
  detail::visit(dtype, [&](auto tag) {
    using T = decltype(tag);
    run_map1<T, T>(loop, out, in, UnaryFn<T>{op}, stream);
  });
  detail::check_launch("unary", stream);
}

void unary_backward(UnaryOp op, DType dtype, const StridedLoop& loop, void* grad_in,
                    const void* grad_out, const void* in, const void* out, void* stream) {
  if (dtype == DType::Bool || (is_integer_dtype(dtype) && !unary_op_allows_integers(op))) {
    detail::throw_unsupported("unary_backward", std::string("op ") + unary_op_name(op), dtype);
  }
  detail::visit(dtype, [&](auto tag) {
    using T = decltype(tag);
    run_map3<T, T, T, T>(loop, grad_in, grad_out, in, out, UnaryBackwardFn<T>{op}, stream);
  });
  detail::check_launch("unary_backward", stream);
}

void binary(BinaryOp op, DType dtype, const StridedLoop& loop, void* out, const void* a,
            const void* b, void* stream) {
  if (dtype == DType::Bool && !is_comparison(op) && op != BinaryOp::Add &&
      op != BinaryOp::Maximum && op != BinaryOp::Mul && op != BinaryOp::Minimum) {
    detail::throw_unsupported("binary", std::string("op ") + binary_op_name(op), dtype);
  }
  detail::visit(dtype, [&](auto tag) {
    using T = decltype(tag);
    if (is_comparison(op)) {
      run_map2<bool, T, T>(loop, out, a, b, CompareFn<T>{op}, stream);
    } else {
      run_map2<T, T, T>(loop, out, a, b, BinaryFn<T>{op}, stream);
    }
  });
  detail::check_launch("binary", stream);
}

void where(DType dtype, const StridedLoop& loop, void* out, const void* cond, const void* a,
           const void* b, void* stream) {
  detail::visit(dtype, [&](auto tag) {
    using T = decltype(tag);
    run_map3<T, uint8_t, T, T>(loop, out, cond, a, b, WhereFn<T>{}, stream);
  });
  detail::check_launch("where", stream);
}

void clamp(DType dtype, const StridedLoop& loop, void* out, const void* in, double lo, double hi,
           void* stream) {
  detail::visit(dtype, [&](auto tag) {
    using T = decltype(tag);
    ClampFn<T> fn{saturate_bound<T>(lo), saturate_bound<T>(hi)};
    run_map1<T, T>(loop, out, in, fn, stream);
  });
  detail::check_launch("clamp", stream);
}

void copy(DType out_dtype, DType in_dtype, const StridedLoop& loop, void* out, const void* in,
          void* stream) {
  if (out_dtype == in_dtype) {
    if (out == in || loop.numel() <= 0) return;  // a view copied onto itself
    if (loop.contiguous(2)) {
      detail::check_cuda(cudaMemcpyAsync(out, in, size_t(loop.numel() * element_size(out_dtype)),
                                         cudaMemcpyDeviceToDevice, as_stream(stream)),
                         "cudaMemcpyAsync(DeviceToDevice)", "copy");
    } else {
      switch (element_size(out_dtype)) {
        case 1:
          copy_bits<uint8_t>(loop, out, in, stream);
          break;
        case 2:
          copy_bits<uint16_t>(loop, out, in, stream);
          break;
        case 4:
          copy_bits<uint32_t>(loop, out, in, stream);
          break;
        default:
          copy_bits<uint64_t>(loop, out, in, stream);
          break;
      }
    }
    detail::check_launch("copy", stream);
    return;
  }
  detail::visit(out_dtype, [&](auto out_tag) {
    using To = decltype(out_tag);
    detail::visit(in_dtype, [&](auto in_tag) {
      using From = decltype(in_tag);
      if constexpr (!std::is_same_v<To, From>) {
        run_map1<To, From>(loop, out, in, CastFn<To, From>{}, stream);
      }
    });
  });
  detail::check_launch("copy", stream);
}

void fill(DType dtype, int64_t n, void* out, double value, void* stream) {
  if (n < 0) detail::throw_invalid("fill", "negative element count");
  if (n == 0) return;
  detail::visit(dtype, [&](auto tag) {
    using T = decltype(tag);
    const storage_t<T> v = to_storage<T>(cast_to<T>(value));
    constexpr int V = int(16 / sizeof(storage_t<T>));
    int64_t done = 0;
    if (aligned(out, 16)) {
      const int64_t chunks = n / V;
      if (chunks > 0) {
        fill_vec_kernel<T, V><<<detail::grid_for(chunks), kThreads, 0, as_stream(stream)>>>(
            chunks, static_cast<storage_t<T>*>(out), v);
      }
      done = chunks * V;
    }
    if (done < n) {
      fill_kernel<T><<<detail::grid_for(n - done), kThreads, 0, as_stream(stream)>>>(
          n - done, static_cast<storage_t<T>*>(out) + done, v);
    }
  });
  detail::check_launch("fill", stream);
}

void arange(DType dtype, int64_t n, void* out, double start, double step, void* stream) {
  if (n < 0) detail::throw_invalid("arange", "negative element count");
  if (n == 0) return;
  detail::visit(dtype, [&](auto tag) {
    using T = decltype(tag);
    arange_kernel<T><<<detail::grid_for(n), kThreads, 0, as_stream(stream)>>>(
        n, static_cast<storage_t<T>*>(out), start, step);
  });
  detail::check_launch("arange", stream);
}

}  // namespace mpigrad::kernels::cuda
