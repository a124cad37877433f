// C[b] = alpha * op(A[b]) * op(B[b]) + beta * C[b] for b in [0, batch), every matrix row-major
// with its own leading dimension, and the batch walked with element strides (0 broadcasts).
// With beta = 0, C is written with `=` and its old contents are never read.
#pragma once

#include <cstdint>

#include "mpigrad/kernels/dtype.h"

namespace mpigrad::kernels {

struct GemmShape {
  bool transpose_a = false;
  bool transpose_b = false;
  int64_t m = 0, n = 0, k = 0;        // op(A) is m x k, op(B) is k x n, C is m x n
  int64_t lda = 0, ldb = 0, ldc = 0;  // row-major leading dimensions of A, B, C as stored
  int64_t batch = 1;
  int64_t batch_stride_a = 0, batch_stride_b = 0, batch_stride_c = 0;
};

namespace cpu {

// Float32 and Float64 only (BLAS has no 16-bit GEMM); core/ reports other dtypes.
void gemm(DType dtype, const GemmShape& shape, double alpha, const void* a, const void* b,
          double beta, void* c);

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

}  // namespace cuda
}  // namespace mpigrad::kernels
