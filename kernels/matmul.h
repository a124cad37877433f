// C[b] = alpha * op(A[b]) * op(B[b]) + beta * C[b] for b in [0, batch), every matrix row-major
// with its own leading dimension, and the batch walked with element strides (0 broadcasts).
// With beta = 0, C is written with `=` and its old contents are never read.
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>

#include "mpigrad/kernels/dtype.h"
#include "mpigrad/kernels/unsupported.h"

namespace mpigrad::kernels {

struct GemmShape {
  bool transpose_a = false;
  bool transpose_b = false;
  int64_t m = 0, n = 0, k = 0;        // op(A) is m x k, op(B) is k x n, C is m x n
  int64_t lda = 0, ldb = 0, ldc = 0;  // row-major leading dimensions of A, B, C as stored
  int64_t batch = 1;
  int64_t batch_stride_a = 0, batch_stride_b = 0, batch_stride_c = 0;
};

// The argument checks both gemms make before calling BLAS, which takes every size as an int and
// would report a too-small leading dimension through xerbla (printing, perhaps aborting): sizes
// not negative, sizes and leading dimensions within int (the batch count too where `library`
// takes it as an int: cuBLAS), leading dimensions at least one row long. Throws
// std::invalid_argument "mpigrad::kernels::<backend>::gemm: ...".
inline void check_gemm_shape(const GemmShape& s, const char* backend, const char* library,
                             bool int_batch) {
  auto fail = [&](const std::string& what) { throw_invalid(backend, "gemm", what); };
  if (s.m < 0 || s.n < 0 || s.k < 0 || s.batch < 0) fail("negative size");
  if (s.m > INT_MAX || s.n > INT_MAX || s.k > INT_MAX || s.lda > INT_MAX || s.ldb > INT_MAX ||
      s.ldc > INT_MAX) {
    fail(std::string("a size or leading dimension exceeds the 32-bit range of ") + library);
  }
  if (int_batch && s.batch > INT_MAX) {
    fail(std::string("the batch count exceeds the 32-bit range of ") + library);
  }
  const int64_t a_cols = s.transpose_a ? s.m : s.k;
  const int64_t b_cols = s.transpose_b ? s.k : s.n;
  if (s.lda < std::max<int64_t>(1, a_cols)) fail("lda " + std::to_string(s.lda) + " is too small");
  if (s.ldb < std::max<int64_t>(1, b_cols)) fail("ldb " + std::to_string(s.ldb) + " is too small");
  if (s.ldc < std::max<int64_t>(1, s.n)) fail("ldc " + std::to_string(s.ldc) + " is too small");
}

namespace cpu {

// Float32 and Float64 only (BLAS has no 16-bit GEMM); core/ reports other dtypes.
void gemm(DType dtype, const GemmShape& shape, double alpha, const void* a, const void* b,
          double beta, void* c);

// Mixed precision: A and B of `operand` (BFloat16 or Float16), C Float32, the products summed
// in fp32; same layout and beta contract as gemm. BFloat16 runs on oneDNN's AVX512-BF16 kernels
// where the CPU has them; Float16, and BFloat16 on a CPU without AVX512-BF16, are converted to
// fp32 and go through sgemm (correct, not faster).
void gemm_mixed(DType operand, const GemmShape& shape, double alpha, const void* a, const void* b,
                double beta, float* c);

// Whether gemm_mixed runs BFloat16 natively (AVX512-BF16 through oneDNN) on this CPU, and the
// kernel oneDNN picked for it ("brg:avx512_core_bf16"), or a line saying why not.
bool has_native_bf16();
const char* bf16_gemm_path();

// The BLAS library's name for the CPU kernel it picked ("SkylakeX", "Prescott", ...), or
// "unknown" when the BLAS in use cannot say.
const char* blas_core_name();

// Sets the BLAS library's own thread count, where it offers a way to.
void set_blas_threads(int num_threads);

}  // namespace cpu

// The same product on a CUDA device through cuBLAS, queued on `stream`. `blas_handle` is a
// cublasHandle_t owned by the caller (core/cuda keeps one per device); the call sets its stream.
// Float32 (fp32 compute, no TF32), Float64, and BFloat16 / Float16 with fp32 accumulation.
namespace cuda {

void gemm(DType dtype, const GemmShape& shape, double alpha, const void* a, const void* b,
          double beta, void* c, void* blas_handle, void* stream);

// A and B of `operand` (BFloat16 or Float16), C Float32, CUBLAS_COMPUTE_32F on the tensor cores.
void gemm_mixed(DType operand, const GemmShape& shape, double alpha, const void* a, const void* b,
                double beta, float* c, void* blas_handle, void* stream);

}  // namespace cuda
}  // namespace mpigrad::kernels
