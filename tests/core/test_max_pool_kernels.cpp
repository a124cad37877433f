// The CPU max-pooling kernels against a plain reference of PyTorch's rules, on a table of window
// geometries that takes every path: the 2x2 stride-2 routines, disjoint windows (stride at least
// the kernel: backward writes each input once, no zero fill) with padding, gaps and a dilated 1x1,
// overlapping and dilated windows (the zero-and-scatter backward), a window of more than 256
// taps (Int32 taps), and rows of windows wide enough for the vectorized forward's loops. Values, winners (as flat indices) and input gradients must match to the
// last bit, in Float32 and Float64, at 1, 2 and 3 threads, on data with ties, signed zeros, -inf
// and NaN of either sign.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "mpigrad/core/threads.h"
#include "mpigrad/kernels/pooling.h"

namespace {

using mpigrad::kernels::DType;
using mpigrad::kernels::Pool2dGeometry;
namespace cpu = mpigrad::kernels::cpu;

struct ThreadCountRestorer {
  int previous = mpigrad::core::num_threads();
  ~ThreadCountRestorer() { mpigrad::core::set_num_threads(previous); }
};

struct Window {
  const char* what;
  int64_t planes, height, width, kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, dilation_h,
      dilation_w;
};

Pool2dGeometry geometry_of(const Window& w) {
  Pool2dGeometry g;
  g.planes = w.planes;
  g.height = w.height;
  g.width = w.width;
  g.kernel_h = w.kernel_h;
  g.kernel_w = w.kernel_w;
  g.stride_h = w.stride_h;
  g.stride_w = w.stride_w;
  g.pad_h = w.pad_h;
  g.pad_w = w.pad_w;
  g.dilation_h = w.dilation_h;
  g.dilation_w = w.dilation_w;
  g.out_h = (g.height + 2 * g.pad_h - g.dilation_h * (g.kernel_h - 1) - 1) / g.stride_h + 1;
  g.out_w = (g.width + 2 * g.pad_w - g.dilation_w * (g.kernel_w - 1) - 1) / g.stride_w + 1;
  return g;
}

// Small integers (many ties), signed zeros, and now and then -inf or a NaN of either sign.
template <typename T>
std::vector<T> pooling_input(int64_t n, uint32_t seed, bool with_nan) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> pick(0, 59);
  std::vector<T> x(static_cast<size_t>(n));
  for (auto& v : x) {
    const int r = pick(rng);
    if (r == 0) {
      v = T(-0.0);
    } else if (r == 1) {
      v = -std::numeric_limits<T>::infinity();
    } else if (r == 2 && with_nan) {
      v = std::numeric_limits<T>::quiet_NaN();
    } else if (r == 3 && with_nan) {
      v = -std::numeric_limits<T>::quiet_NaN();
    } else {
      v = T(r % 7) - T(3);
    }
  }
  return x;
}

// PyTorch's rule, written plainly: the first in-bounds element starts the window, a later one
// replaces it when strictly greater or when it is NaN. Backward adds each output's gradient to its
// winner in a zeroed plane, outputs in order.
template <typename T>
void reference(const Pool2dGeometry& g, const std::vector<T>& x, const std::vector<T>& grad_out,
               std::vector<T>& out, std::vector<int64_t>& flat, std::vector<T>& grad_in) {
  const size_t outputs = size_t(g.planes * g.out_h * g.out_w);
  out.assign(outputs, T(0));
  flat.assign(outputs, 0);
  grad_in.assign(size_t(g.planes * g.height * g.width), T(0));
  for (int64_t p = 0; p < g.planes; ++p) {
    for (int64_t oy = 0; oy < g.out_h; ++oy) {
      for (int64_t ox = 0; ox < g.out_w; ++ox) {
        T best = -std::numeric_limits<T>::infinity();
        int64_t at = -1;
        for (int64_t i = 0; i < g.kernel_h; ++i) {
          for (int64_t j = 0; j < g.kernel_w; ++j) {
            const int64_t y = oy * g.stride_h - g.pad_h + i * g.dilation_h;
            const int64_t x_at = ox * g.stride_w - g.pad_w + j * g.dilation_w;
            if (y < 0 || y >= g.height || x_at < 0 || x_at >= g.width) continue;
            const T v = x[size_t((p * g.height + y) * g.width + x_at)];
            if (at < 0 || v > best || std::isnan(v)) {
              best = v;
              at = y * g.width + x_at;
            }
          }
        }
        const size_t o = size_t((p * g.out_h + oy) * g.out_w + ox);
        out[o] = best;
        flat[o] = at < 0 ? 0 : at;
        grad_in[size_t(p * g.height * g.width + flat[o])] += grad_out[o];
      }
    }
  }
}

// Same bits (so NaN of the same sign, and zeros of the same sign).
template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

size_t tap_bytes(DType dtype) {
  return dtype == DType::UInt8 ? 1 : dtype == DType::Int32 ? 4 : 8;
}

template <typename T>
void check_against_reference(const Window& w, bool with_nan) {
  const Pool2dGeometry g = geometry_of(w);
  const DType dtype = std::is_same_v<T, float> ? DType::Float32 : DType::Float64;
  const auto x = pooling_input<T>(g.planes * g.height * g.width,
                                  uint32_t(g.height * 131 + g.kernel_w * 7 + w.stride_w), with_nan);
  auto grad_out = pooling_input<T>(g.planes * g.out_h * g.out_w, uint32_t(g.width + 3), false);
  for (auto& v : grad_out) v = std::isinf(v) ? T(0.25) : v;
  std::vector<T> out_ref, grad_ref;
  std::vector<int64_t> flat_ref;
  reference(g, x, grad_out, out_ref, flat_ref, grad_ref);

  const DType tap_dtype = cpu::max_pool2d_tap_dtype(g);
  CHECK(tap_dtype == (g.kernel_h * g.kernel_w <= 256 ? DType::UInt8 : DType::Int32));
  const size_t outputs = out_ref.size();
  ThreadCountRestorer restore;
  for (int threads : {1, 2, 3}) {
    INFO(std::string(w.what), ", ", threads, " threads, NaN ", with_nan, ", ",
         std::is_same_v<T, float> ? "Float32" : "Float64");
    mpigrad::core::set_num_threads(threads);
    std::vector<T> out(outputs, T(7));
    std::vector<unsigned char> taps(outputs * tap_bytes(tap_dtype), 0xEE);
    cpu::max_pool2d_forward(dtype, g, x.data(), out.data(), taps.data());
    std::vector<int64_t> flat(outputs, -1);
    cpu::max_pool2d_flat_indices(g, taps.data(), flat.data());
    // Backward writes every input: a NaN left over would show.
    std::vector<T> grad_in(x.size(), std::numeric_limits<T>::quiet_NaN());
    cpu::max_pool2d_backward(dtype, g, grad_out.data(), taps.data(), grad_in.data());
    CHECK(same_bits(out, out_ref));
    CHECK(flat == flat_ref);
    CHECK(same_bits(grad_in, grad_ref));
  }
}

// Rows: what, planes, height, width, kernel h w, stride h w, padding h w, dilation h w.
const Window kWindows[] = {
    {"2x2 stride 2, odd sizes", 37, 7, 29, 2, 2, 2, 2, 0, 0, 1, 1},
    {"2x2 stride 2, 14x14 (all tail)", 9, 14, 14, 2, 2, 2, 2, 0, 0, 1, 1},
    {"2x2 stride 2 with padding (disjoint)", 5, 7, 8, 2, 2, 2, 2, 1, 1, 1, 1},
    {"3x3 stride 3 padding 1 (disjoint)", 6, 10, 11, 3, 3, 3, 3, 1, 1, 1, 1},
    {"2x3 stride 3x4 padding 1 (gaps)", 4, 9, 13, 2, 3, 3, 4, 1, 1, 1, 1},
    {"1x1 stride 2 dilation 3 (disjoint)", 3, 6, 7, 1, 1, 2, 2, 0, 0, 3, 3},
    {"3x3 stride 2 padding 1 (overlap)", 5, 9, 8, 3, 3, 2, 2, 1, 1, 1, 1},
    {"2x2 stride 2 dilation 2 (overlap)", 4, 9, 9, 2, 2, 2, 2, 0, 0, 2, 2},
    {"3x2 stride 1 (overlap)", 3, 5, 6, 3, 2, 1, 1, 0, 0, 1, 1},
    {"17x16 stride 5 (272 taps)", 3, 26, 22, 17, 16, 5, 5, 0, 0, 1, 1},
    // Rows of windows long enough for the vector loops of the row-at-a-time forward, with tails.
    {"3x3 stride 2 padding 1, 75 wide (ResNet's stem)", 3, 11, 75, 3, 3, 2, 2, 1, 1, 1, 1},
    {"3x3 stride 1 padding 1, 45 wide", 2, 6, 45, 3, 3, 1, 1, 1, 1, 1, 1},
    {"3x3 stride 3 padding 1 dilation 2, 100 wide", 2, 13, 100, 3, 3, 3, 3, 1, 1, 2, 2},
    {"4x5 stride 2x3 padding 2, 64 wide", 3, 10, 64, 4, 5, 2, 3, 2, 2, 1, 1},
};

}  // namespace

TEST_CASE("max pooling kernels match PyTorch's rule on every path, at any thread count") {
  for (const Window& w : kWindows) {
    for (bool with_nan : {false, true}) {
      check_against_reference<float>(w, with_nan);
      check_against_reference<double>(w, with_nan);
    }
  }
}

TEST_CASE("max pooling records one byte per output up to 256 taps, Int32 beyond") {
  Pool2dGeometry g;
  g.kernel_h = 16;
  g.kernel_w = 16;
  CHECK(cpu::max_pool2d_tap_dtype(g) == DType::UInt8);
  g.kernel_w = 17;
  CHECK(cpu::max_pool2d_tap_dtype(g) == DType::Int32);
}

TEST_CASE("max pooling of a window with no input element gives -inf and PyTorch's index 0") {
  // Height 2, kernel 2 dilated by 3, padding 1: the window's taps are rows -1 and 2, both outside.
  Pool2dGeometry g;
  g.planes = 1;
  g.height = 2;
  g.width = 1;
  g.kernel_h = 2;
  g.dilation_h = 3;
  g.pad_h = 1;
  g.out_h = 1;
  g.out_w = 1;
  const std::vector<float> x = {5.0f, 6.0f};
  float out = 0;
  uint8_t tap = 0xEE;
  cpu::max_pool2d_forward(DType::Float32, g, x.data(), &out, &tap);
  CHECK(out == -std::numeric_limits<float>::infinity());
  int64_t flat = -1;
  cpu::max_pool2d_flat_indices(g, &tap, &flat);
  CHECK(flat == 0);
  const float grad = 2.0f;
  std::vector<float> grad_in(2, std::numeric_limits<float>::quiet_NaN());
  cpu::max_pool2d_backward(DType::Float32, g, &grad, &tap, grad_in.data());
  CHECK(grad_in == std::vector<float>{2.0f, 0.0f});
}
