// The gradient of slice, narrow and select in one pass (kernels/cpu/slice.cpp, reached through
// Backend::slice_backward from SliceBackward): byte for byte what zeros() and a copy into the
// window wrote before it, for slices of the first, a middle and the last dim, steps 1 to 3,
// windows that start at 0 or not and end at the extent or not, select, empty windows, every
// element size, non-contiguous incoming gradients, tiles and thread pieces that cut rows, and
// 1 and 2 threads. And the gradient that reaches a leaf through narrow.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "../thread_count.h"
#include "mpigrad/core/autograd.h"
#include "mpigrad/core/backend.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/core/tensor.h"
#include "mpigrad/kernels/slice.h"

namespace {

using namespace mpigrad::core;  // NOLINT
using mpigrad::kernels::SliceWindow;
using mpigrad::test::ThreadCount;
namespace cpu = mpigrad::kernels::cpu;

// What the kernel must write, one element at a time.
std::vector<unsigned char> reference(const SliceWindow& w, int size,
                                     const std::vector<unsigned char>& grad) {
  std::vector<unsigned char> out(size_t(w.outer * w.extent * w.inner * size), 0);
  for (int64_t o = 0; o < w.outer; ++o) {
    for (int64_t k = 0; k < w.count; ++k) {
      const int64_t position = w.start + k * w.step;
      std::memcpy(out.data() + ((o * w.extent + position) * w.inner) * size,
                  grad.data() + ((o * w.count + k) * w.inner) * size, size_t(w.inner * size));
    }
  }
  return out;
}

std::vector<unsigned char> random_bytes(size_t n, std::mt19937& generator) {
  std::vector<unsigned char> bytes(n);
  for (auto& byte : bytes) byte = static_cast<unsigned char>(generator());
  return bytes;
}

std::string describe(const SliceWindow& w, int size) {
  std::ostringstream text;
  text << "[" << w.outer << ", " << w.extent << ", " << w.inner << "] start " << w.start << " step "
       << w.step << " count " << w.count << ", " << size << "-byte words";
  return text.str();
}

// The kernel against the reference, on an output first filled with a pattern that is not zero,
// so an element it fails to write shows.
void check_kernel(const SliceWindow& w, int size, std::mt19937& generator) {
  INFO(describe(w, size));
  const auto grad = random_bytes(size_t(w.outer * w.count * w.inner * size), generator);
  std::vector<unsigned char> out(size_t(w.outer * w.extent * w.inner * size), 0xcd);
  cpu::slice_backward(size, w, out.data(), grad.data());
  CHECK(out == reference(w, size, grad));
}

SliceWindow window(int64_t outer, int64_t extent, int64_t inner, int64_t start, int64_t step,
                   int64_t end) {
  return {outer, extent, inner, start, step, end > start ? (end - start + step - 1) / step : 0};
}

TEST_CASE("slice_backward writes the window and zeros, for every element size and thread count") {
  std::mt19937 generator(7);
  const std::vector<SliceWindow> windows = {
      window(5, 9, 1, 4, 1, 5),              // a conv weight's centre tap
      window(6, 9, 1, 0, 1, 9),              // the whole extent
      window(7, 9, 1, 0, 2, 9),              // step 2 from 0 to the end
      window(4, 10, 3, 1, 3, 8),             // step 3, neither end
      window(1, 12, 5, 2, 2, 11),            // the first dim (outer 1)
      window(3, 4, 1, 3, 1, 4),              // the last position
      window(8, 6, 1, 2, 1, 2),              // empty
      window(2, 5, 70, 1, 1, 4),             // long rows of a dense window (written around)
      window(3, 200, 1, 10, 1, 190),         // a dense window with inner 1
      window(2, 3, 7000, 1, 1, 2),           // rows longer than a tile
      window(2, 30000, 1, 5, 3, 29990),      // step 3 across tiles of one row
      window(512, 64 * 9, 1, 4, 9, 64 * 9),  // every 9th element, many rows
      window(32768, 9, 1, 4, 1, 5),          // outer rows split across threads
      window(512 * 512, 9, 1, 4, 1, 5),      // a 512x512x3x3 weight at 1x1: the centre tap
      window(64, 9, 1024, 3, 2, 9),          // pieces and tiles that cut rows
      window(20, 40, 2000, 0, 1, 37),        // dense windows split across threads
  };
  for (int threads : {1, 2}) {
    ThreadCount scope(threads);
    INFO(threads, " threads");
    for (const SliceWindow& w : windows) {
      for (int size : {1, 2, 4, 8}) check_kernel(w, size, generator);
    }
  }
}

TEST_CASE("slice_backward matches a reference on random windows") {
  std::mt19937 generator(11);
  std::uniform_int_distribution<int64_t> small(1, 12), inner(1, 40);
  for (int threads : {1, 2}) {
    ThreadCount scope(threads);
    for (int trial = 0; trial < 300; ++trial) {
      const int64_t extent = small(generator);
      const int64_t start = std::uniform_int_distribution<int64_t>(0, extent - 1)(generator);
      const int64_t end = std::uniform_int_distribution<int64_t>(start, extent)(generator);
      const int64_t step = std::uniform_int_distribution<int64_t>(1, 4)(generator);
      const int64_t outer = trial % 10 == 0 ? 3000 : small(generator);
      check_kernel(window(outer, extent, inner(generator), start, step, end), 1 << (trial % 4),
                   generator);
    }
  }
}

TEST_CASE("slice_backward rejects a window outside the extent and odd element sizes") {
  std::vector<float> out(12), grad(12);
  CHECK_THROWS(cpu::slice_backward(4, {1, 4, 3, 2, 1, 3}, out.data(), grad.data()));
  CHECK_THROWS(cpu::slice_backward(4, {1, 4, 3, 0, 0, 1}, out.data(), grad.data()));
  CHECK_THROWS(cpu::slice_backward(3, {1, 4, 3, 0, 1, 1}, out.data(), grad.data()));
}

// A tensor of `shape` and `dtype` with distinct values that are exact in bfloat16.
Tensor distinct(const Shape& shape, DType dtype, int64_t seed) {
  std::vector<double> values(size_t(shape.numel()));
  for (size_t i = 0; i < values.size(); ++i)
    values[i] = double((int64_t(i) * 37 + seed) % 251 - 125);
  return Tensor::from_vector(values, shape).to(dtype);
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  const Tensor x = a.contiguous(), y = b.contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(),
                     size_t(x.numel() * mpigrad::kernels::element_size(x.dtype()))) == 0;
}

struct SliceCase {
  Shape shape;
  int dim;
  int64_t start, end, step;
  bool select;
};

// The gradient of one slice, through autograd (float dtypes) or the backend (others), against
// zeros() with the incoming gradient copied into the window: the composition it replaces.
void check_against_composition(const SliceCase& c, DType dtype, bool transposed_grad) {
  INFO("shape ", c.shape, " dim ", c.dim, " [", c.start, ", ", c.end, ") step ", c.step,
       c.select ? " (select)" : "", " ", dtype_name(dtype),
       transposed_grad ? ", grad not contiguous" : "");
  const Tensor probe = zeros(c.shape, dtype);
  const Tensor view =
      c.select ? probe.select(c.dim, c.start) : probe.slice(c.dim, c.start, c.end, c.step);
  Tensor grad = distinct(view.shape(), dtype, 3);
  if (transposed_grad && view.dim() >= 2) {
    // The same values laid out column-major: a transpose of a dense transpose.
    grad = grad.transpose(0, view.dim() - 1).contiguous().transpose(0, view.dim() - 1);
    REQUIRE_FALSE(grad.is_contiguous());
  }
  Tensor expected = zeros(c.shape, dtype);
  expected.slice(c.dim, c.start, c.end, c.step).copy_(c.select ? grad.unsqueeze(c.dim) : grad);

  if (is_floating(dtype)) {
    Tensor leaf = zeros(c.shape, dtype).set_requires_grad(true);
    const Tensor out =
        c.select ? leaf.select(c.dim, c.start) : leaf.slice(c.dim, c.start, c.end, c.step);
    out.backward(grad);
    CHECK(same_bytes(leaf.grad(), expected));
  } else {
    SliceWindow w;
    for (int d = 0; d < c.dim; ++d) w.outer *= c.shape[d];
    w.extent = c.shape[c.dim];
    for (int d = c.dim + 1; d < c.shape.size(); ++d) w.inner *= c.shape[d];
    w.start = c.start;
    w.step = c.step;
    w.count = c.select ? 1 : view.shape()[c.dim];
    Tensor one_pass = Tensor::empty(c.shape, dtype);
    const Tensor dense = grad.contiguous();
    REQUIRE(backend_for(kCPU).supports_slice_backward());
    backend_for(kCPU).slice_backward(dtype, w, one_pass.data_ptr(), dense.data_ptr());
    CHECK(same_bytes(one_pass, expected));
  }
}

TEST_CASE("the gradient of slice and select is the composition of zeros and a copy, bit for bit") {
  const std::vector<SliceCase> cases = {
      {{6, 5, 4}, 0, 1, 5, 1, false},    // first dim, neither end
      {{6, 5, 4}, 0, 0, 6, 2, false},    // first dim, step 2 from 0
      {{6, 5, 4}, 1, 2, 5, 3, false},    // middle dim, step 3 to the end
      {{6, 5, 4}, 1, 0, 5, 1, false},    // middle dim, all of it
      {{6, 5, 4}, 2, 1, 3, 1, false},    // last dim (inner 1)
      {{6, 5, 4}, 2, 0, 4, 2, false},    // last dim, step 2
      {{6, 5, 4}, 1, 3, 3, 1, false},    // empty
      {{6, 5, 4}, 1, 2, 3, 1, true},     // select in the middle
      {{6, 5, 4}, 0, 5, 6, 1, true},     // select of the last row
      {{6, 5, 4}, 2, 0, 1, 1, true},     // select in the last dim
      {{64, 64, 9}, 2, 4, 5, 1, false},  // a conv weight's centre tap
      {{64, 64, 3, 3}, 3, 0, 2, 1, false},
      {{300, 41, 33}, 1, 3, 40, 2, false},  // large enough for two threads
  };
  for (int threads : {1, 2}) {
    ThreadCount scope(threads);
    for (const SliceCase& c : cases) {
      for (DType dtype : {kFloat32, kFloat64, kBFloat16, kInt64}) {
        check_against_composition(c, dtype, false);
        check_against_composition(c, dtype, true);
      }
    }
  }
}

TEST_CASE("the gradient through two narrows reaches the leaf in the window, zero elsewhere") {
  // conv2d's used taps: the middle 2x2 of a 3x3 kernel, sum(w_narrowed * weights).
  const Tensor values = distinct({4, 3, 3, 3}, kFloat64, 5);
  Tensor leaf = values.clone().set_requires_grad(true);
  const Tensor weights = distinct({4, 3, 2, 2}, kFloat64, 9);
  sum(leaf.narrow(2, 1, 2).narrow(3, 0, 2).contiguous() * weights).backward();
  const std::vector<double> grad = leaf.grad().to_vector<double>();
  const std::vector<double> w = weights.to_vector<double>();
  REQUIRE(grad.size() == size_t(4 * 3 * 9));
  for (int64_t plane = 0; plane < 12; ++plane) {
    for (int64_t y = 0; y < 3; ++y) {
      for (int64_t x = 0; x < 3; ++x) {
        const bool used = y >= 1 && x < 2;
        const double expected = used ? w[size_t(plane * 4 + (y - 1) * 2 + x)] : 0.0;
        CHECK(grad[size_t(plane * 9 + y * 3 + x)] == expected);
      }
    }
  }
}

}  // namespace
