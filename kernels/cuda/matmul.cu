// CUDA gemm through cuBLAS (cublasGemmStridedBatchedEx), accumulating in fp32 for the 16-bit
// types.
//
// Layout: row-major matrices with explicit leading dimensions, batch entries at element strides
// (0 broadcasts), as in kernels/matmul.h. cuBLAS is column-major, and a row-major C = op(A) op(B)
// is the column-major C^T = op(B)^T op(A)^T, so the call passes B before A and swaps m and n; the
// leading dimensions and transposes carry over unchanged.
// Types: Float32 (fp32 compute, no TF32, so results match the CPU's sgemm closely), BFloat16 and
// Float16 (fp32 accumulation, 16-bit output, or fp32 output for gemm_mixed), Float64 (fp64
// compute).
// C is written with `=` when beta == 0 (never read), otherwise C = alpha*op(A)op(B) + beta*C.
// k == 0 or alpha == 0 scale C by beta (zero it for beta == 0) with a small kernel instead.
#include <cublas_v2.h>

#include <string>

#include "mpigrad/kernels/cuda/common.cuh"
#include "mpigrad/kernels/matmul.h"

namespace mpigrad::kernels::cuda {
namespace {

using detail::as_stream;

void check_cublas(cublasStatus_t status, const char* call) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw std::runtime_error(std::string("mpigrad::kernels::cuda::gemm: ") + call +
                             " failed: " + cublasGetStatusName(status) + " (" +
                             cublasGetStatusString(status) + ")");
  }
}

// C[b] = beta * C[b] (0 when beta == 0, even over NaN) for the products cuBLAS is not asked for.
template <typename T>
__global__ void scale_c_kernel(int64_t batch, int64_t m, int64_t n, int64_t ldc,
                               int64_t batch_stride_c, double beta, T* c) {
  const int64_t total = batch * m * n;
  for (int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; p < total;
       p += int64_t(gridDim.x) * blockDim.x) {
    const int64_t col = p % n, row = (p / n) % m, entry = p / (m * n);
    T& value = c[entry * batch_stride_c + row * ldc + col];
    using C = compute_t<T>;
    value = beta == 0.0 ? T(C(0)) : T(C(beta) * C(value));
  }
}

// The one cuBLAS call behind gemm and gemm_mixed: A and B of `operand`, C of `result`.
void run_gemm(DType operand, DType result, const GemmShape& shape, double alpha, const void* a,
              const void* b, double beta, void* c, void* blas_handle, void* stream) {
  auto cuda_type = [](DType dtype) -> cudaDataType_t {
    switch (dtype) {
      case DType::Float32:
        return CUDA_R_32F;
      case DType::Float64:
        return CUDA_R_64F;
      case DType::BFloat16:
        return CUDA_R_16BF;
      case DType::Float16:
        return CUDA_R_16F;
      default:
        detail::throw_unsupported("gemm", "", dtype);
    }
    return CUDA_R_32F;
  };
  const cudaDataType_t data_type = cuda_type(operand), result_type = cuda_type(result);
  const cublasComputeType_t compute_type =
      operand == DType::Float64 ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F;
  check_gemm_shape(shape, "cuda", "cuBLAS", /*int_batch=*/true);
  if (shape.m == 0 || shape.n == 0 || shape.batch == 0) return;
  if (blas_handle == nullptr) detail::throw_invalid("gemm", "no cuBLAS handle");
  // Entries that share C (batch_stride_c == 0) must run one after another, as on the CPU.
  const bool shared_c = shape.batch > 1 && shape.batch_stride_c == 0;

  if (shape.k == 0 || alpha == 0.0) {
    const int64_t entries = shared_c ? 1 : shape.batch;
    detail::visit(result, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (is_floating_v<T>) {
        scale_c_kernel<T><<<detail::grid_for(entries * shape.m * shape.n), detail::kThreads, 0,
                            as_stream(stream)>>>(entries, shape.m, shape.n, shape.ldc,
                                                 shape.batch_stride_c, beta, static_cast<T*>(c));
      }
    });
    detail::check_launch("gemm", stream);
    return;
  }

  auto handle = static_cast<cublasHandle_t>(blas_handle);
  check_cublas(cublasSetStream(handle, as_stream(stream)), "cublasSetStream");
  const float alpha_f = float(alpha), beta_f = float(beta);
  const void* alpha_ptr = operand == DType::Float64 ? static_cast<const void*>(&alpha)
                                                    : static_cast<const void*>(&alpha_f);
  const void* beta_ptr = operand == DType::Float64 ? static_cast<const void*>(&beta)
                                                   : static_cast<const void*>(&beta_f);
  const cublasOperation_t op_b = shape.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = shape.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int64_t size = element_size(operand);
  const int64_t calls = shared_c ? shape.batch : 1;
  const int batch_per_call = shared_c ? 1 : int(shape.batch);
  for (int64_t entry = 0; entry < calls; ++entry) {
    const char* a_entry = static_cast<const char*>(a) + entry * shape.batch_stride_a * size;
    const char* b_entry = static_cast<const char*>(b) + entry * shape.batch_stride_b * size;
    check_cublas(cublasGemmStridedBatchedEx(
                     handle, op_b, op_a, int(shape.n), int(shape.m), int(shape.k), alpha_ptr,
                     b_entry, data_type, int(shape.ldb), shape.batch_stride_b, a_entry, data_type,
                     int(shape.lda), shape.batch_stride_a, beta_ptr, c, result_type, int(shape.ldc),
                     shape.batch_stride_c, batch_per_call, compute_type, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmStridedBatchedEx");
  }
  detail::check_launch("gemm", stream);
}

}  // namespace

void gemm(DType dtype, const GemmShape& shape, double alpha, const void* a, const void* b,
          double beta, void* c, void* blas_handle, void* stream) {
  run_gemm(dtype, dtype, shape, alpha, a, b, beta, c, blas_handle, stream);
}

void gemm_mixed(DType operand, const GemmShape& shape, double alpha, const void* a, const void* b,
                double beta, float* c, void* blas_handle, void* stream) {
  if (operand != DType::BFloat16 && operand != DType::Float16) {
    detail::throw_unsupported("gemm_mixed", "", operand);
  }
  run_gemm(operand, DType::Float32, shape, alpha, a, b, beta, c, blas_handle, stream);
}

}  // namespace mpigrad::kernels::cuda
