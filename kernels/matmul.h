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
