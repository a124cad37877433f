// CPU gemm through CBLAS, plus queries of the BLAS library that happens to be linked.
//
// Layout: row-major matrices with explicit leading dimensions; batch entries at element strides
// (0 broadcasts one matrix to every entry). C is written with `=` when beta == 0 (its old
// contents are never read, even if they hold NaN), otherwise C = alpha*op(A)*op(B) + beta*C.
// Threading: one pool, OpenMP's. The BLAS library runs single-threaded (core/threads.cpp sets
// it to 1 thread) and is called from our own parallel regions: a batch of products is spread
// over its entries when there are enough of them (or when each is below OpenBLAS's own
// single-thread threshold), and one large product is cut into a block of C's rows or columns
// per thread. Why: a BLAS that threads itself (OpenBLAS's pthreads build, Debian's default)
// keeps a second pool of workers that busy-wait up to ~0.1 s after every gemm, while OpenMP's
// workers busy-wait after every region of the kernels around it (im2col, elementwise); on a
// node with as many threads as cores the two pools take turns spinning on each other's cores,
// and 2 threads ran ResNet-18 14x slower than 1 (docs/clusters.md, Threads).
// The BLAS-specific entry points are looked up with dlsym, so any CBLAS links.
#include "mpigrad/kernels/matmul.h"

#include <cblas.h>
#include <dlfcn.h>

#include <algorithm>
#include <type_traits>

#include "mpigrad/kernels/cpu/parallel.h"
#include "mpigrad/kernels/cpu/scalar.h"

namespace mpigrad::kernels::cpu {
namespace {

// OpenBLAS runs a gemm with m*n*k at or below 65536 * 4 on the calling thread.
constexpr int64_t kSmallGemmWork = int64_t(1) << 18;

// C = beta * C for the products BLAS is not called for (k == 0 or alpha == 0).
template <typename T>
void scale_c(T* c, const GemmShape& s, T beta) {
  for (int64_t row = 0; row < s.m; ++row) {
    T* c_row = c + row * s.ldc;
    for (int64_t col = 0; col < s.n; ++col) c_row[col] = beta == T(0) ? T(0) : beta * c_row[col];
  }
}

template <typename T>
void gemm_one(const GemmShape& s, T alpha, const T* a, const T* b, T beta, T* c) {
  if (s.k == 0 || alpha == T(0)) return scale_c(c, s, beta);
  const CBLAS_TRANSPOSE trans_a = s.transpose_a ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE trans_b = s.transpose_b ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, trans_a, trans_b, int(s.m), int(s.n), int(s.k), alpha, a, int(s.lda),
                b, int(s.ldb), beta, c, int(s.ldc));
  } else {
    cblas_dgemm(CblasRowMajor, trans_a, trans_b, int(s.m), int(s.n), int(s.k), alpha, a, int(s.lda),
                b, int(s.ldb), beta, c, int(s.ldc));
  }
}

// One product, cut into a block of C's rows (or columns, when C is wider than tall) per thread,
// each block at least kSmallGemmWork of work: BLAS would not thread anything smaller either.
template <typename T>
void gemm_split(const GemmShape& s, T alpha, const T* a, const T* b, T beta, T* c) {
  const int64_t work = s.m * s.n * std::max<int64_t>(s.k, 1);
  const bool by_rows = s.m >= s.n;
  const int64_t extent = by_rows ? s.m : s.n;
  // The rows (columns) that make kSmallGemmWork of work, and at least 16 (the kernels' unroll).
  const int64_t per_block = (work + extent - 1) / extent;
  const int64_t grain = std::max<int64_t>(16, (kSmallGemmWork + per_block - 1) / per_block);
  parallel_for(0, extent, grain, [&](int64_t begin, int64_t end) {
    GemmShape block = s;
    block.batch = 1;
    if (by_rows) {
      block.m = end - begin;
      // op(A)'s rows are A's rows, or A's columns when A is stored transposed.
      gemm_one(block, alpha, a + begin * (s.transpose_a ? 1 : s.lda), b, beta, c + begin * s.ldc);
    } else {
      block.n = end - begin;
      // op(B)'s columns are B's columns, or B's rows when B is stored transposed.
      gemm_one(block, alpha, a, b + begin * (s.transpose_b ? s.ldb : 1), beta, c + begin);
    }
  });
}

template <typename T>
void gemm_typed(const GemmShape& s, T alpha, const T* a, const T* b, T beta, T* c) {
  auto entry = [&](int64_t i) {
    gemm_one(s, alpha, a + i * s.batch_stride_a, b + i * s.batch_stride_b, beta,
             c + i * s.batch_stride_c);
  };
  const int64_t work = s.m * s.n * std::max<int64_t>(s.k, 1);
  // Entries that share C (batch_stride_c == 0) must not run concurrently. Whole entries per
  // thread when they are small, or when they share out evenly (or nearly: 4 per thread or more);
  // otherwise each entry is cut up.
  const int64_t threads = max_threads();
  if (s.batch > 1 && s.batch_stride_c != 0 &&
      (work < kSmallGemmWork || s.batch % threads == 0 || s.batch >= 4 * threads)) {
    const int64_t grain = std::max<int64_t>(1, kSmallGemmWork / std::max<int64_t>(work, 1) / 4);
    parallel_for(0, s.batch, grain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) entry(i);
    });
    return;
  }
  for (int64_t i = 0; i < s.batch; ++i) {
    if (work <= kSmallGemmWork || s.k == 0 || alpha == T(0)) {
      entry(i);
    } else {
      gemm_split(s, alpha, a + i * s.batch_stride_a, b + i * s.batch_stride_b, beta,
                 c + i * s.batch_stride_c);
    }
  }
}

}  // namespace

void gemm(DType dtype, const GemmShape& shape, double alpha, const void* a, const void* b,
          double beta, void* c) {
  if (dtype != DType::Float32 && dtype != DType::Float64) {
    throw_unsupported("gemm", "", dtype);
  }
  check_gemm_shape(shape, "cpu", "CBLAS", /*int_batch=*/false);
  if (shape.m == 0 || shape.n == 0 || shape.batch == 0) return;
  if (dtype == DType::Float32) {
    gemm_typed<float>(shape, float(alpha), static_cast<const float*>(a),
                      static_cast<const float*>(b), float(beta), static_cast<float*>(c));
  } else {
    gemm_typed<double>(shape, alpha, static_cast<const double*>(a), static_cast<const double*>(b),
                       beta, static_cast<double*>(c));
  }
}

const char* blas_core_name() {
  using CoreNameFn = char* (*)();
  if (void* symbol = dlsym(RTLD_DEFAULT, "openblas_get_corename")) {
    const char* name = reinterpret_cast<CoreNameFn>(symbol)();
    if (name != nullptr) return name;
  }
  return "unknown";
}

void set_blas_threads(int num_threads) {
  if (num_threads < 1) num_threads = 1;
  if (void* symbol = dlsym(RTLD_DEFAULT, "openblas_set_num_threads")) {
    reinterpret_cast<void (*)(int)>(symbol)(num_threads);
    return;
  }
  // BLIS takes a dim_t, which is 64-bit in its default builds.
  if (void* symbol = dlsym(RTLD_DEFAULT, "bli_thread_set_num_threads")) {
    reinterpret_cast<void (*)(int64_t)>(symbol)(num_threads);
    return;
  }
  // MKL's C entry point, which takes the count by value. (The lowercase mkl_set_num_threads
  // symbol is the Fortran-style interface, and calling it by value would pass garbage.)
  if (void* symbol = dlsym(RTLD_DEFAULT, "MKL_Set_Num_Threads")) {
    reinterpret_cast<void (*)(int)>(symbol)(num_threads);
  }
}

}  // namespace mpigrad::kernels::cpu
