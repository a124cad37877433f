// CPU gemm_mixed: 16-bit A and B, fp32 C, fp32 accumulation (kernels/matmul.h).
//
// BFloat16 goes to oneDNN's matmul, which JIT-compiles AVX512-BF16 (vdpbf16ps) kernels: on this
// project's Zen 4 machines it ran a 1024^3 product at 1.9x OpenBLAS's sgemm, where a hand-written
// vdpbf16ps kernel would first have to match oneDNN's blocking to compete
// (docs/mixed-precision-and-zero.md, "Speed on the CPU", has the figures). Primitives are built
// once per shape and kept per thread, since building one costs far more than running a small
// product.
// Float16 (no fp16 dot product on these CPUs), BFloat16 on a CPU without AVX512-BF16, and
// MPIGRAD_CPU_BF16=convert convert each entry to fp32 and call sgemm: correct, not faster.
// C is written with `=` when beta == 0, otherwise C = alpha*op(A)op(B) + beta*C.
#include <omp.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <dnnl.hpp>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "mpigrad/kernels/cpu/parallel.h"
#include "mpigrad/kernels/cpu/scalar.h"
#include "mpigrad/kernels/matmul.h"

namespace mpigrad::kernels::cpu {
namespace {

bool convert_requested() {
  const char* value = std::getenv("MPIGRAD_CPU_BF16");
  return value != nullptr && std::string(value) == "convert";
}

bool native_bf16() {
  static const bool native =
      !convert_requested() && dnnl::get_effective_cpu_isa() >= dnnl::cpu_isa::avx512_core_bf16;
  return native;
}

struct OneDnn {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
};

OneDnn& onednn() {
  static OneDnn instance;
  return instance;
}

using dnnl::memory;

// Row-major [rows, cols] with leading dimension ld, as a oneDNN descriptor: 2-d when the product
// has one entry, else 3-d with `entries` (1 for an operand oneDNN broadcasts). A zero batch
// stride sends oneDNN to its reference kernel, so an entry that is never stepped gets its dense
// size as stride.
memory::desc matrix_desc(memory::data_type type, int64_t batch, int64_t entries,
                         int64_t batch_stride, bool transposed, int64_t rows, int64_t cols,
                         int64_t ld) {
  // op(X) is rows x cols; stored transposed, element (i, j) sits at j * ld + i.
  const memory::dims matrix_strides = transposed ? memory::dims{1, ld} : memory::dims{ld, 1};
  if (batch == 1) return memory::desc({rows, cols}, type, matrix_strides);
  const int64_t stride = entries == 1 || batch_stride == 0 ? rows * cols : batch_stride;
  return memory::desc({entries, rows, cols}, type,
                      {std::max<int64_t>(stride, 1), matrix_strides[0], matrix_strides[1]});
}

// Products up to this many multiply-adds run on the calling thread, as OpenBLAS runs them: an
// OpenMP team's start and barrier cost more than they save there, and far more when the cores
// are shared with other processes (a small bf16 product took 16 ms on a loaded 2-core machine).
constexpr int64_t kSmallGemmWork = int64_t(1) << 18;

// Sets the OpenMP thread count oneDNN sees for the guard's lifetime (oneDNN reads it when it
// builds a primitive and when it runs one).
class ThreadLimit {
 public:
  explicit ThreadLimit(int threads) : previous_(omp_get_max_threads()) {
    omp_set_num_threads(threads);
  }
  ~ThreadLimit() { omp_set_num_threads(previous_); }
  ThreadLimit(const ThreadLimit&) = delete;
  ThreadLimit& operator=(const ThreadLimit&) = delete;

 private:
  int previous_;
};

struct Plan {
  dnnl::matmul primitive;
  memory::desc a, b, c;
  bool reference = false;  // oneDNN's reference kernel: far slower than converting to fp32
};

const Plan& plan_for(const GemmShape& s, int64_t batch, float alpha, float beta, int threads) {
  using Key = std::array<int64_t, 15>;
  thread_local std::map<Key, Plan> plans;
  int32_t alpha_bits, beta_bits;
  std::memcpy(&alpha_bits, &alpha, 4);
  std::memcpy(&beta_bits, &beta, 4);
  const Key key{s.transpose_a,
                s.transpose_b,
                s.m,
                s.n,
                s.k,
                s.lda,
                s.ldb,
                s.ldc,
                batch,
                s.batch_stride_a,
                s.batch_stride_b,
                s.batch_stride_c,
                alpha_bits,
                beta_bits,
                threads};
  auto found = plans.find(key);
  if (found != plans.end()) return found->second;
  // A broadcast operand (batch stride 0) is one matrix oneDNN broadcasts itself.
  const bool broadcast_a = batch > 1 && s.batch_stride_a == 0;
  const bool broadcast_b = batch > 1 && s.batch_stride_b == 0;
  const auto bf16 = memory::data_type::bf16;
  const memory::desc a = matrix_desc(bf16, batch, broadcast_a ? 1 : batch, s.batch_stride_a,
                                     s.transpose_a, s.m, s.k, s.lda);
  const memory::desc b = matrix_desc(bf16, batch, broadcast_b ? 1 : batch, s.batch_stride_b,
                                     s.transpose_b, s.k, s.n, s.ldb);
  const memory::desc c =
      matrix_desc(memory::data_type::f32, batch, batch, s.batch_stride_c, false, s.m, s.n, s.ldc);
  dnnl::primitive_attr attr;
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  if (beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(beta);
    attr.set_post_ops(ops);
  }
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), attr, onednn().engine);
  const bool reference = std::string(pd.impl_info_str()).rfind("ref", 0) == 0;
  return plans.emplace(key, Plan{dnnl::matmul(pd), a, b, c, reference}).first->second;
}

// False, with nothing computed, when oneDNN offers only its reference kernel for this shape.
bool gemm_onednn(const GemmShape& s, float alpha, const void* a, const void* b, float beta,
                 float* c) {
  // Entries that share C must accumulate one after another: run them one by one.
  const bool shared_c = s.batch > 1 && s.batch_stride_c == 0;
  const int64_t calls = shared_c ? s.batch : 1;
  const int64_t batch = shared_c ? 1 : s.batch;
  OneDnn& dnn = onednn();
  const int64_t work = batch * s.m * s.n * s.k;
  const int threads = work <= kSmallGemmWork ? 1 : omp_get_max_threads();
  ThreadLimit limit(threads);
  for (int64_t entry = 0; entry < calls; ++entry) {
    const float entry_beta = entry == 0 ? beta : 1.0f;
    const Plan& plan = plan_for(s, batch, alpha, entry_beta, threads);
    if (plan.reference) return false;
    auto* a_entry = static_cast<uint16_t*>(const_cast<void*>(a)) + entry * s.batch_stride_a;
    auto* b_entry = static_cast<uint16_t*>(const_cast<void*>(b)) + entry * s.batch_stride_b;
    dnnl::memory a_mem(plan.a, dnn.engine, a_entry);
    dnnl::memory b_mem(plan.b, dnn.engine, b_entry);
    dnnl::memory c_mem(plan.c, dnn.engine, c);
    plan.primitive.execute(
        dnn.stream, {{DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_mem}, {DNNL_ARG_DST, c_mem}});
  }
  dnn.stream.wait();
  return true;
}

// One stored matrix (rows x ld, the last row only `cols` long) converted to fp32.
template <typename T>
void widen(const T* in, int64_t rows, int64_t cols, int64_t ld, std::vector<float>& out) {
  const int64_t count = rows == 0 ? 0 : (rows - 1) * ld + cols;
  out.resize(size_t(count));
  parallel_for(0, count, 1 << 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) out[size_t(i)] = float(in[i]);
  });
}

template <typename T>
void gemm_converted(const GemmShape& s, float alpha, const T* a, const T* b, float beta, float* c) {
  std::vector<float> a32, b32;
  GemmShape one = s;
  one.batch = 1;
  one.batch_stride_a = one.batch_stride_b = one.batch_stride_c = 0;
  for (int64_t entry = 0; entry < s.batch; ++entry) {
    widen(a + entry * s.batch_stride_a, s.transpose_a ? s.k : s.m, s.transpose_a ? s.m : s.k, s.lda,
          a32);
    widen(b + entry * s.batch_stride_b, s.transpose_b ? s.n : s.k, s.transpose_b ? s.k : s.n, s.ldb,
          b32);
    const bool later_shared = entry > 0 && s.batch_stride_c == 0;
    gemm(DType::Float32, one, alpha, a32.data(), b32.data(), later_shared ? 1.0 : beta,
         c + entry * s.batch_stride_c);
  }
}

}  // namespace

bool has_native_bf16() {
  return native_bf16();
}

const char* bf16_gemm_path() {
  if (convert_requested()) return "fp32 conversion + sgemm (MPIGRAD_CPU_BF16=convert)";
  if (!native_bf16()) return "fp32 conversion + sgemm (this CPU has no AVX512-BF16)";
  return "oneDNN matmul, AVX512-BF16";
}

void gemm_mixed(DType operand, const GemmShape& shape, double alpha, const void* a, const void* b,
                double beta, float* c) {
  if (operand != DType::BFloat16 && operand != DType::Float16) {
    throw_unsupported("gemm_mixed", "", operand);
  }
  if (shape.m == 0 || shape.n == 0 || shape.batch == 0) return;
  if (shape.k == 0 || alpha == 0.0) {
    // No product: scale C as gemm does (zero it for beta == 0, even over NaN).
    GemmShape none = shape;
    none.k = 0;
    return gemm(DType::Float32, none, alpha, c, c, beta, c);
  }
  if (operand == DType::BFloat16 && native_bf16()) {
    try {
      if (gemm_onednn(shape, float(alpha), a, b, float(beta), c)) return;
    } catch (const dnnl::error& e) {
      throw std::runtime_error(std::string("mpigrad::kernels::cpu::gemm_mixed: oneDNN: ") +
                               e.what());
    }
  }
  if (operand == DType::BFloat16) {
    return gemm_converted(shape, float(alpha), static_cast<const BFloat16*>(a),
                          static_cast<const BFloat16*>(b), float(beta), c);
  }
  gemm_converted(shape, float(alpha), static_cast<const Half*>(a), static_cast<const Half*>(b),
                 float(beta), c);
}

}  // namespace mpigrad::kernels::cpu
