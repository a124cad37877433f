// Internal to kernels/cuda: what every CUDA kernel family shares.
//
// - Launch checking: every launcher calls check_launch() after its kernels, which turns a
//   launch error into an exception naming the kernel; with MPIGRAD_CUDA_DEBUG_SYNC it also
//   synchronizes the stream, so an asynchronous fault is reported by the launch that caused it.
// - Scalar semantics: kernels/scalar.h's, the very functions the CPU kernels use (conversions
//   that saturate instead of hitting undefined behaviour, wrapping integer arithmetic, NaN
//   tests), plus the device load of a Bool.
// - Math wrappers that pick the float or double device function explicitly.
// - The strided-loop walk (size-1 dims dropped, mergeable dims merged) that the CPU kernels use.
// kernels/ includes nothing of ours above it, so errors are standard exceptions; the CUDA backend
// in core/cuda turns them into core::Error.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "mpigrad/kernels/dtype.h"
#include "mpigrad/kernels/elementwise.h"
#include "mpigrad/kernels/scalar.h"
#include "mpigrad/kernels/unsupported.h"

namespace mpigrad::kernels::cuda::detail {

// ---- Errors ------------------------------------------------------------------------------------

using kernels::dtype_name;

[[noreturn]] inline void throw_unsupported(const char* kernel, const std::string& what,
                                           DType dtype) {
  kernels::throw_unsupported("cuda", kernel, what, dtype);
}

[[noreturn]] inline void throw_invalid(const char* kernel, const std::string& what) {
  kernels::throw_invalid("cuda", kernel, what);
}

inline void check_cuda(cudaError_t status, const char* call, const char* kernel) {
  if (status != cudaSuccess) {
    throw std::runtime_error(std::string("mpigrad::kernels::cuda::") + kernel + ": " + call +
                             " failed: " + cudaGetErrorName(status) + " (" +
                             cudaGetErrorString(status) + ")");
  }
}

inline cudaStream_t as_stream(void* stream) {
  return static_cast<cudaStream_t>(stream);
}

// After the launches of one kernel call.
inline void check_launch(const char* kernel, void* stream) {
  check_cuda(cudaGetLastError(), "kernel launch", kernel);
#if defined(MPIGRAD_CUDA_DEBUG_SYNC) && MPIGRAD_CUDA_DEBUG_SYNC
  check_cuda(cudaStreamSynchronize(as_stream(stream)),
             "cudaStreamSynchronize (MPIGRAD_CUDA_DEBUG_SYNC)", kernel);
#else
  (void)stream;
#endif
}

// Streaming multiprocessors of the current device, for sizing grids of multi-block kernels.
inline int multiprocessor_count(const char* kernel) {
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice", kernel);
  int count = 0;
  check_cuda(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device),
             "cudaDeviceGetAttribute(MultiProcessorCount)", kernel);
  return count > 0 ? count : 1;
}

constexpr int kThreads = 256;                     // threads per block of the flat kernels
constexpr int64_t kMaxBlocks = int64_t(1) << 20;  // grid-stride loops cover the rest

inline unsigned grid_for(int64_t work_items, int threads = kThreads) {
  int64_t blocks = (work_items + threads - 1) / threads;
  if (blocks < 1) blocks = 1;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  return unsigned(blocks);
}

// Calls fn(T{}) with the C++ type of dtype (host side): kernels/dtype.h's visit_dtype, under the
// short name the launchers here use.
template <typename Fn>
void visit(DType dtype, Fn&& fn) {
  visit_dtype(dtype, std::forward<Fn>(fn));
}

// ---- Device scalar semantics (the rest are kernels/scalar.h's, shared with the CPU) ---------

// Bool is stored as one byte that may hold any value (a file, a cast); it is read as != 0.
template <typename T>
__device__ __forceinline__ T load(const T* p) {
  if constexpr (std::is_same_v<T, bool>) {
    return *reinterpret_cast<const uint8_t*>(p) != 0;
  } else {
    return *p;
  }
}

// ---- Math in float or double, chosen by overload --------------------------------------------

__device__ __forceinline__ float m_exp(float x) {
  return expf(x);
}
__device__ __forceinline__ double m_exp(double x) {
  return exp(x);
}
__device__ __forceinline__ float m_log(float x) {
  return logf(x);
}
__device__ __forceinline__ double m_log(double x) {
  return log(x);
}
__device__ __forceinline__ float m_sqrt(float x) {
  return sqrtf(x);
}
__device__ __forceinline__ double m_sqrt(double x) {
  return sqrt(x);
}
__device__ __forceinline__ float m_abs(float x) {
  return fabsf(x);
}
__device__ __forceinline__ double m_abs(double x) {
  return fabs(x);
}
__device__ __forceinline__ float m_erf(float x) {
  return erff(x);
}
__device__ __forceinline__ double m_erf(double x) {
  return erf(x);
}
__device__ __forceinline__ float m_tanh(float x) {
  return tanhf(x);
}
__device__ __forceinline__ double m_tanh(double x) {
  return tanh(x);
}
__device__ __forceinline__ float m_pow(float x, float y) {
  return powf(x, y);
}
__device__ __forceinline__ double m_pow(double x, double y) {
  return pow(x, y);
}
__device__ __forceinline__ float m_sin(float x) {
  return sinf(x);
}
__device__ __forceinline__ double m_sin(double x) {
  return sin(x);
}
__device__ __forceinline__ float m_cos(float x) {
  return cosf(x);
}
__device__ __forceinline__ double m_cos(double x) {
  return cos(x);
}

template <typename C>
__device__ __forceinline__ C infinity() {
  return std::numeric_limits<C>::infinity();
}

// ---- Strided walk ------------------------------------------------------------------------------

// The iteration space with size-1 dims dropped and mergeable neighbours merged
// (kernels::coalesced, as on the CPU) plus its element count, passed to kernels by value.
struct Walk : StridedLoop {
  int64_t numel = 0;
};

inline Walk coalesce(const StridedLoop& loop, int num_operands) {
  Walk walk;
  static_cast<StridedLoop&>(walk) = coalesced(loop, num_operands);
  walk.numel = loop.numel();
  return walk;
}

// Element offsets of operands [0, kOps) for flat row-major position i of the walk. The loop over
// dims is unrolled with a guard, so the walk's arrays are indexed by constants and stay in the
// kernel parameter space instead of being copied to local memory.
template <int kOps>
__device__ __forceinline__ void walk_offsets(const Walk& walk, int64_t i, int64_t (&offset)[kOps]) {
#pragma unroll
  for (int op = 0; op < kOps; ++op) offset[op] = 0;
#pragma unroll
  for (int j = 0; j < kMaxDims; ++j) {
    const int d = kMaxDims - 1 - j;
    if (d < walk.ndim) {
      const int64_t index = i % walk.size[d];
      i /= walk.size[d];
#pragma unroll
      for (int op = 0; op < kOps; ++op) offset[op] += index * walk.stride[op][d];
    }
  }
}

// ---- Index checks (defined in index.cu) ------------------------------------------------------

// The first position p in [0, n) whose index[p] lies outside [0, extent), or -1. Runs a check
// kernel into `workspace` (at least kIndexCheckBytes of device memory) and waits for the stream
// to read the answer back.
int64_t first_bad_index(const int64_t* index, int64_t n, int64_t extent, void* workspace,
                        void* stream, const char* kernel);

}  // namespace mpigrad::kernels::cuda::detail
