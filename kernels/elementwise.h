// Elementwise kernels over up to kMaxDims dimensions with arbitrary element strides, which is how
// broadcasting (stride 0) and non-contiguous views reach them without a copy. The caller (core/)
// has already computed the broadcast shape and the strides of every operand in that shape.
// All kernels write their output with `=`; none accumulates.
#pragma once

#include <cstdint>

#include "mpigrad/kernels/dtype.h"

namespace mpigrad::kernels {

constexpr int kMaxDims = 8;

// Shape of the iteration space plus the element strides of up to four operands in it.
// Operand 0 is always the output.
struct StridedLoop {
  int ndim = 0;
  int64_t size[kMaxDims] = {};
  int64_t stride[4][kMaxDims] = {};

  int64_t numel() const {
    int64_t n = 1;
    for (int d = 0; d < ndim; ++d) n *= size[d];
    return n;
  }
  // True when every operand given is dense and in row-major order, so a flat loop is valid.
  bool contiguous(int num_operands) const {
    for (int op = 0; op < num_operands; ++op) {
      int64_t expected = 1;
      for (int d = ndim - 1; d >= 0; --d) {
        if (size[d] != 1 && stride[op][d] != expected) return false;
        expected *= size[d];
      }
    }
    return true;
  }
};

// `loop` with extent-1 dims dropped and neighbours merged wherever every one of the first
// num_operands operands steps through them evenly, so a dense slice of a larger tensor becomes
// one long dim. Always at least one dim (a single element is [1] with strides 0).
inline StridedLoop coalesced(const StridedLoop& loop, int num_operands) {
  StridedLoop walk;
  for (int d = 0; d < loop.ndim; ++d) {
    if (loop.size[d] == 1) continue;
    const int last = walk.ndim - 1;
    bool mergeable = last >= 0;
    for (int op = 0; mergeable && op < num_operands; ++op) {
      mergeable = walk.stride[op][last] == loop.stride[op][d] * loop.size[d];
    }
    if (mergeable) {
      walk.size[last] *= loop.size[d];
      for (int op = 0; op < num_operands; ++op) walk.stride[op][last] = loop.stride[op][d];
    } else {
      walk.size[walk.ndim] = loop.size[d];
      for (int op = 0; op < num_operands; ++op) walk.stride[op][walk.ndim] = loop.stride[op][d];
      ++walk.ndim;
    }
  }
  if (walk.ndim == 0) {
    walk.ndim = 1;
    walk.size[0] = 1;
  }
  return walk;
}

enum class UnaryOp : uint8_t {
  Neg,
  Exp,
  Log,
  Sqrt,
  Rsqrt,
  Abs,
  Relu,
  GeluErf,
  GeluTanh,
  Silu,
  Sigmoid,
  Tanh,
  Sign,
  Erf,
  Sin,
  Cos,
  Softplus,  // log(1 + e^x), computed as relu(x) + log1p(e^-|x|) so that it never overflows
};

enum class BinaryOp : uint8_t {
  Add,
  Sub,
  Mul,
  Div,
  Maximum,
  Minimum,
  Pow,
  // Comparisons write Bool.
  Eq,
  Ne,
  Lt,
  Le,
  Gt,
  Ge,
};

inline bool is_comparison(BinaryOp op) {
  return op >= BinaryOp::Eq;
}

// Lower-case names for messages, shared by the CPU and CUDA kernels and core's ops.
constexpr const char* unary_op_name(UnaryOp op) {
  switch (op) {
    case UnaryOp::Neg:
      return "neg";
    case UnaryOp::Exp:
      return "exp";
    case UnaryOp::Log:
      return "log";
    case UnaryOp::Sqrt:
      return "sqrt";
    case UnaryOp::Rsqrt:
      return "rsqrt";
    case UnaryOp::Abs:
      return "abs";
    case UnaryOp::Relu:
      return "relu";
    case UnaryOp::GeluErf:
      return "gelu";
    case UnaryOp::GeluTanh:
      return "gelu_tanh";
    case UnaryOp::Silu:
      return "silu";
    case UnaryOp::Sigmoid:
      return "sigmoid";
    case UnaryOp::Tanh:
      return "tanh";
    case UnaryOp::Sign:
      return "sign";
    case UnaryOp::Erf:
      return "erf";
    case UnaryOp::Sin:
      return "sin";
    case UnaryOp::Cos:
      return "cos";
    case UnaryOp::Softplus:
      return "softplus";
  }
  return "unary";
}

constexpr const char* binary_op_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::Add:
      return "add";
    case BinaryOp::Sub:
      return "sub";
    case BinaryOp::Mul:
      return "mul";
    case BinaryOp::Div:
      return "div";
    case BinaryOp::Maximum:
      return "maximum";
    case BinaryOp::Minimum:
      return "minimum";
    case BinaryOp::Pow:
      return "pow";
    case BinaryOp::Eq:
      return "eq";
    case BinaryOp::Ne:
      return "ne";
    case BinaryOp::Lt:
      return "lt";
    case BinaryOp::Le:
      return "le";
    case BinaryOp::Gt:
      return "gt";
    case BinaryOp::Ge:
      return "ge";
  }
  return "binary";
}

// Neg, Abs, Relu and Sign also take integer dtypes; every other unary op needs a float type.
constexpr bool unary_op_allows_integers(UnaryOp op) {
  return op == UnaryOp::Neg || op == UnaryOp::Abs || op == UnaryOp::Relu || op == UnaryOp::Sign;
}

namespace cpu {

// out = op(in). Operands: 0 out, 1 in. Both have `dtype`, which must be a float type except for
// Neg, Abs, Relu and Sign.
void unary(UnaryOp op, DType dtype, const StridedLoop& loop, void* out, const void* in);

// grad_in = grad_out * op'(in). Operands: 0 grad_in, 1 grad_out, 2 in, 3 out (the forward
// result, which Exp, Sigmoid, Tanh, Sqrt and Rsqrt use instead of recomputing).
void unary_backward(UnaryOp op, DType dtype, const StridedLoop& loop, void* grad_in,
                    const void* grad_out, const void* in, const void* out);

// out = a op b, all of `dtype`, except comparisons, whose out is Bool. Operands: 0 out, 1 a, 2 b.
void binary(BinaryOp op, DType dtype, const StridedLoop& loop, void* out, const void* a,
            const void* b);

// out = cond ? a : b. cond is Bool; out, a, b are `dtype`. Operands: 0 out, 1 cond, 2 a, 3 b.
void where(DType dtype, const StridedLoop& loop, void* out, const void* cond, const void* a,
           const void* b);

// out = min(max(in, lo), hi). Operands: 0 out, 1 in.
void clamp(DType dtype, const StridedLoop& loop, void* out, const void* in, double lo, double hi);

// out = in, converting in_dtype to out_dtype. Operands: 0 out, 1 in. This is also how core/
// makes a view contiguous. Same-dtype copies whose layout is a (batched) transpose go through
// cache tiles, and rows contiguous on both sides through memcpy, or fixed-size moves where the
// rows are short (kernels/cpu/transpose.h); MPIGRAD_CPU_COPY=generic, read once, sends them to
// the element walk instead.
void copy(DType out_dtype, DType in_dtype, const StridedLoop& loop, void* out, const void* in);

// copy() by the element walk alone, whatever the layout: the reference that tests and
// benchmarks compare the blocked paths against.
void copy_generic(DType out_dtype, DType in_dtype, const StridedLoop& loop, void* out,
                  const void* in);

// Dense conversion of n elements between float32 and a 16-bit float (bfloat16 or float16), either
// way, bit for bit what BFloat16's and Half's scalar conversions give (round to nearest even,
// NaN stays NaN), on the calling thread alone: the communication thread calls it too. Vectorized
// with AVX-512 or AVX2 where the CPU has them. copy() uses it for dense operands, in parallel.
// Throws std::invalid_argument for any other pair of dtypes.
void convert_dense(DType out_dtype, DType in_dtype, int64_t n, void* out, const void* in);

// inout[i] = T(float(in[i]) + float(inout[i])) for n elements of a 16-bit float T (bfloat16 or
// float16): MPI's 16-bit sum. One thread, vectorized like convert_dense. The sum of two NaNs is
// a NaN whose sign is not specified (as in IEEE arithmetic).
void add_16bit_dense(DType dtype, int64_t n, const void* in, void* inout);

// out[i] = value for a dense buffer of n elements.
void fill(DType dtype, int64_t n, void* out, double value);

// out[i] = start + i * step for a dense buffer of n elements.
void arange(DType dtype, int64_t n, void* out, double start, double step);

}  // namespace cpu

// The same kernels on a CUDA device: pointers are device memory, the work is queued on `stream`
// (a cudaStream_t; null is the legacy default stream) and nothing waits for it. Unsupported dtypes
// throw std::invalid_argument before anything is queued; launch failures std::runtime_error.
namespace cuda {

void unary(UnaryOp op, DType dtype, const StridedLoop& loop, void* out, const void* in,
           void* stream);
void unary_backward(UnaryOp op, DType dtype, const StridedLoop& loop, void* grad_in,
                    const void* grad_out, const void* in, const void* out, void* stream);
void binary(BinaryOp op, DType dtype, const StridedLoop& loop, void* out, const void* a,
            const void* b, void* stream);
void where(DType dtype, const StridedLoop& loop, void* out, const void* cond, const void* a,
           const void* b, void* stream);
void clamp(DType dtype, const StridedLoop& loop, void* out, const void* in, double lo, double hi,
           void* stream);
void copy(DType out_dtype, DType in_dtype, const StridedLoop& loop, void* out, const void* in,
          void* stream);
void fill(DType dtype, int64_t n, void* out, double value, void* stream);
void arange(DType dtype, int64_t n, void* out, double start, double step, void* stream);

}  // namespace cuda

}  // namespace mpigrad::kernels
