// Internal to kernels/cpu: copy_short, a copy of a few bytes without a call. Passes that move
// many short runs (a slice's gradient with a few elements a row, the contiguous() of a conv
// weight narrowed to its used taps: rows of 8 or 12 bytes) spent most of their time in memcpy's
// call and size dispatch, about 5 ns a run against 1 for the loads and stores themselves.
#pragma once

#include <cstddef>
#include <cstring>

namespace mpigrad::kernels::cpu {

namespace detail {
// n bytes, kSize <= n <= 2 * kSize: a head and a tail of kSize that overlap where n < 2 * kSize.
// Fixed-size memcpy compiles to one load and one store each.
template <size_t kSize>
inline void copy_head_tail(char* out, const char* in, size_t n) {
  char head[kSize], tail[kSize];
  std::memcpy(head, in, kSize);
  std::memcpy(tail, in + n - kSize, kSize);
  std::memcpy(out, head, kSize);
  std::memcpy(out + n - kSize, tail, kSize);
}
}  // namespace detail

// out[0, n) = in[0, n); the two ranges must not overlap. Up to 64 bytes by two fixed-size moves
// each (callers pass the same n run after run, so the size branches predict); memcpy beyond.
inline void copy_short(void* out_bytes, const void* in_bytes, size_t n) {
  auto* out = static_cast<char*>(out_bytes);
  const auto* in = static_cast<const char*>(in_bytes);
  if (n > 64) {
    std::memcpy(out, in, n);
  } else if (n >= 32) {
    detail::copy_head_tail<32>(out, in, n);
  } else if (n >= 16) {
    detail::copy_head_tail<16>(out, in, n);
  } else if (n >= 8) {
    detail::copy_head_tail<8>(out, in, n);
  } else if (n >= 4) {
    detail::copy_head_tail<4>(out, in, n);
  } else if (n >= 2) {
    detail::copy_head_tail<2>(out, in, n);
  } else if (n == 1) {
    *out = *in;
  }
}

}  // namespace mpigrad::kernels::cpu
