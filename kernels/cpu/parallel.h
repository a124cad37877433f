// Internal to kernels/cpu: the one place the CPU kernels touch OpenMP.
//
// parallel_for splits [begin, end) into at most one contiguous chunk per thread and calls
// fn(chunk_begin, chunk_end) on each. Ranges no larger than `grain` run serially on the caller,
// so small tensors never pay for waking the thread pool. Nested calls (from inside a parallel
// region) also run serially rather than oversubscribing the machine.
// fn must not throw: an exception cannot leave an OpenMP region, so kernels validate first.
#pragma once

#include <algorithm>
#include <cstdint>

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace mpigrad::kernels::cpu {

// Elements per chunk below which threading costs more than it saves for a cheap elementwise op.
constexpr int64_t kElementwiseGrain = 32768;

inline int max_threads() {
#if defined(_OPENMP)
  return omp_in_parallel() ? 1 : omp_get_max_threads();
#else
  return 1;
#endif
}

template <typename Fn>
void parallel_for(int64_t begin, int64_t end, int64_t grain, Fn fn) {
  const int64_t range = end - begin;
  if (range <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t chunks = std::min<int64_t>(max_threads(), (range + grain - 1) / grain);
  if (range <= grain || chunks <= 1) {
    fn(begin, end);
    return;
  }
  const int64_t base = range / chunks;
  const int64_t extra = range % chunks;
#if defined(_OPENMP)
#pragma omp parallel for num_threads(int(chunks)) schedule(static, 1)
#endif
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    // The first `extra` chunks take one element more, so the split is as even as possible.
    const int64_t chunk_begin = begin + chunk * base + std::min(chunk, extra);
    const int64_t chunk_end = chunk_begin + base + (chunk < extra ? 1 : 0);
    fn(chunk_begin, chunk_end);
  }
}

}  // namespace mpigrad::kernels::cpu
