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

// Elements per piece of parallel_for_balanced's memory-bound passes: 64K floats, 256 KB a stream,
// long enough that taking the next piece (one atomic add) costs nothing beside it.
constexpr int64_t kBalancedPiece = 65536;

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

// For long memory-bound passes (an optimizer step over every parameter, weight layout copies):
// like parallel_for, serial up to `grain`, but the range is cut into pieces of about `piece`
// elements that the threads take in turn as they finish the last, so a thread that runs slower
// (its core shared with other work, its half of the data further away) does less of the pass
// instead of leaving the other waiting at the join. What it buys depends on how busy the cores
// are: perf of ResNet-18's training step at batch 8 on 2 threads (shared 2-core VM) had the main
// thread alone in the SGD update and the forward weight copies for about 1.5 ms a step with even
// halves, 0.3 ms with pieces; on the SGD update of ResNet-18's 11.2M parameters alone, the two
// alternated in one process (200 steps), the best step was the same (3.6-3.9 ms) and the mean
// 0.02-0.17 ms shorter.
// fn(piece_begin, piece_end) runs once per piece, pieces in no set order and on no set thread: fn
// must not keep per-thread state across calls.
template <typename Fn>
void parallel_for_balanced(int64_t begin, int64_t end, int64_t grain, int64_t piece, Fn fn) {
  const int64_t range = end - begin;
  if (range <= 0) return;
  piece = std::max<int64_t>(piece, 1);
  const int64_t pieces = (range + piece - 1) / piece;
  const int64_t threads = max_threads();
  // Under 4 pieces a thread, the last piece taken could leave a wait as long as an even split's:
  // split evenly then.
  if (threads <= 1 || pieces < 4 * threads || range <= std::max<int64_t>(grain, 1)) {
    parallel_for(begin, end, grain, fn);
    return;
  }
#if defined(_OPENMP)
#pragma omp parallel for num_threads(int(threads)) schedule(dynamic, 1)
#endif
  for (int64_t index = 0; index < pieces; ++index) {
    const int64_t piece_begin = begin + index * piece;
    fn(piece_begin, std::min(end, piece_begin + piece));
  }
}

}  // namespace mpigrad::kernels::cpu
