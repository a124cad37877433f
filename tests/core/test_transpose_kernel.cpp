// The blocked paths of the CPU's same-dtype copy (kernels/cpu/transpose.cpp: tiled transposes,
// memcpy rows, rows folded into 8- and 16-byte words) against an index-by-index reference and
// against the generic element walk (kernels::cpu::copy_generic), byte for byte: every
// permutation of a 4-d tensor, NCHW <-> NHWC, sizes that are not multiples of the tile or the
// register block, extent-1 dims, every element size, strided destinations, and copies large
// enough to be split across threads; and the short rows of a conv weight narrowed to its used
// taps.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "../thread_count.h"
#include "mpigrad/kernels/dtype.h"
#include "mpigrad/kernels/elementwise.h"

namespace {

using mpigrad::kernels::DType;
using mpigrad::kernels::element_size;
using mpigrad::kernels::StridedLoop;
namespace cpu = mpigrad::kernels::cpu;

using Dims = std::vector<int64_t>;

Dims row_major_strides(const Dims& shape) {
  Dims strides(shape.size(), 1);
  for (int d = int(shape.size()) - 2; d >= 0; --d) {
    strides[size_t(d)] = strides[size_t(d) + 1] * shape[size_t(d) + 1];
  }
  return strides;
}

int64_t count(const Dims& shape) {
  int64_t n = 1;
  for (int64_t extent : shape) n *= extent;
  return n;
}

// Random bytes: every word is a distinct bit pattern (NaN payloads included for floats), so a
// copy that moved values instead of words, or moved the wrong word, shows.
std::vector<unsigned char> random_bytes(size_t n, unsigned seed) {
  std::mt19937 generator(seed);
  std::vector<unsigned char> bytes(n);
  for (auto& byte : bytes) byte = static_cast<unsigned char>(generator());
  return bytes;
}

// The loop of a permute: out[i] = in[permuted i] when `into_permuted`, the materializing copy
// (out dense in the permuted shape, in a permuted view of a dense tensor); otherwise the reverse
// (a dense in written into a permuted view of a dense out).
StridedLoop permute_loop(const Dims& shape, const Dims& order, bool into_permuted) {
  const Dims dense = row_major_strides(shape);
  Dims permuted_shape, permuted_strides;
  for (int64_t d : order) {
    permuted_shape.push_back(shape[size_t(d)]);
    permuted_strides.push_back(dense[size_t(d)]);
  }
  const Dims packed = row_major_strides(permuted_shape);
  StridedLoop loop;
  loop.ndim = int(shape.size());
  for (int d = 0; d < loop.ndim; ++d) {
    loop.size[d] = permuted_shape[size_t(d)];
    loop.stride[0][d] = into_permuted ? packed[size_t(d)] : permuted_strides[size_t(d)];
    loop.stride[1][d] = into_permuted ? permuted_strides[size_t(d)] : packed[size_t(d)];
  }
  return loop;
}

// What any copy of `loop` must write, one element at a time.
std::vector<unsigned char> reference_copy(const StridedLoop& loop, int size,
                                          const std::vector<unsigned char>& in, size_t out_bytes) {
  std::vector<unsigned char> out(out_bytes, 0);
  int64_t index[mpigrad::kernels::kMaxDims] = {};
  const int64_t n = loop.numel();
  for (int64_t i = 0; i < n; ++i) {
    int64_t out_offset = 0, in_offset = 0;
    for (int d = 0; d < loop.ndim; ++d) {
      out_offset += index[d] * loop.stride[0][d];
      in_offset += index[d] * loop.stride[1][d];
    }
    std::memcpy(&out[size_t(out_offset * size)], &in[size_t(in_offset * size)], size_t(size));
    for (int d = loop.ndim - 1; d >= 0; --d) {
      if (++index[d] < loop.size[d]) break;
      index[d] = 0;
    }
  }
  return out;
}

// Copies the permute of `shape` by `order` in `dtype` both ways, through copy() and
// copy_generic(), and checks both against the reference; returns the number of cases run.
// `offset` elements in, so that words widened from narrower ones are not aligned to their size.
int check_permute(const Dims& shape, const Dims& order, DType dtype, int64_t offset = 0) {
  const int size = element_size(dtype);
  const size_t bytes = size_t(count(shape) * size);
  const std::vector<unsigned char> source =
      random_bytes(bytes + size_t(offset * size), unsigned(bytes + order[0]));
  const std::vector<unsigned char> in(source.begin() + offset * size, source.end());
  int cases = 0;
  for (bool into_permuted : {true, false}) {
    const StridedLoop loop = permute_loop(shape, order, into_permuted);
    const std::vector<unsigned char> expected = reference_copy(loop, size, in, bytes);
    std::vector<unsigned char> blocked(bytes, 0), generic(bytes, 0);
    cpu::copy(dtype, dtype, loop, blocked.data(), source.data() + offset * size);
    cpu::copy_generic(dtype, dtype, loop, generic.data(), source.data() + offset * size);
    std::string what = "shape [";
    for (int64_t extent : shape) what += std::to_string(extent) + " ";
    what += "] order [";
    for (int64_t d : order) what += std::to_string(d) + " ";
    what += "] element size " + std::to_string(size) + (into_permuted ? " gather" : " scatter");
    what += " offset " + std::to_string(offset);
    CAPTURE(what);
    CHECK(blocked == expected);
    CHECK(generic == expected);
    ++cases;
  }
  return cases;
}

// Copies the window [first, first + extent) of a dense tensor of `shape` both ways (its
// contiguous(), and a dense tensor written into the window) through copy() and copy_generic(),
// and checks both against the reference; returns the number of cases run.
int check_window(const Dims& shape, const Dims& first, const Dims& extent, DType dtype) {
  const int size = element_size(dtype);
  const Dims dense = row_major_strides(shape), packed = row_major_strides(extent);
  int64_t start = 0;
  for (size_t d = 0; d < shape.size(); ++d) start += first[d] * dense[d];
  const size_t full_bytes = size_t(count(shape) * size),
               window_bytes = size_t(count(extent) * size);
  int cases = 0;
  for (bool gather : {true, false}) {
    StridedLoop loop;
    loop.ndim = int(shape.size());
    for (int d = 0; d < loop.ndim; ++d) {
      loop.size[d] = extent[size_t(d)];
      loop.stride[0][d] = gather ? packed[size_t(d)] : dense[size_t(d)];
      loop.stride[1][d] = gather ? dense[size_t(d)] : packed[size_t(d)];
    }
    const size_t in_bytes = gather ? full_bytes : window_bytes;
    const size_t out_bytes = gather ? window_bytes : full_bytes;
    const size_t in_at = gather ? size_t(start * size) : 0,
                 out_at = gather ? 0 : size_t(start * size);
    const std::vector<unsigned char> source = random_bytes(in_bytes, unsigned(in_bytes + start));
    const std::vector<unsigned char> in(source.begin() + in_at, source.end());
    std::vector<unsigned char> expected = reference_copy(loop, size, in, out_bytes - out_at);
    expected.insert(expected.begin(), out_at, 0);
    std::vector<unsigned char> blocked(out_bytes, 0), generic(out_bytes, 0);
    cpu::copy(dtype, dtype, loop, blocked.data() + out_at, source.data() + in_at);
    cpu::copy_generic(dtype, dtype, loop, generic.data() + out_at, source.data() + in_at);
    std::string what = "shape [";
    for (int64_t e : shape) what += std::to_string(e) + " ";
    what += "] window from [";
    for (int64_t e : first) what += std::to_string(e) + " ";
    what += "] of [";
    for (int64_t e : extent) what += std::to_string(e) + " ";
    what += "] element size " + std::to_string(size) + (gather ? " gather" : " scatter");
    CAPTURE(what);
    CHECK(blocked == expected);
    CHECK(generic == expected);
    ++cases;
  }
  return cases;
}

const DType kEveryElementSize[] = {DType::UInt8, DType::BFloat16, DType::Float16, DType::Float32,
                                   DType::Int32, DType::Int64,    DType::Float64};

}  // namespace

TEST_CASE("blocked copy: 2-d transposes at sizes around the tile and the register block") {
  const Dims sizes = {1, 2, 3, 4, 7, 8, 9, 15, 16, 17, 31, 33, 64};
  int cases = 0;
  for (DType dtype : kEveryElementSize) {
    for (int64_t rows : sizes) {
      for (int64_t cols : {int64_t(1), int64_t(5), int64_t(16), int64_t(17), int64_t(40)}) {
        cases += check_permute({rows, cols}, {1, 0}, dtype);
      }
    }
  }
  CHECK(cases == 7 * 13 * 5 * 2);
}

TEST_CASE("blocked copy: every permutation of a 4-d tensor, extent-1 dims included") {
  std::vector<Dims> orders;
  Dims order = {0, 1, 2, 3};
  do {
    orders.push_back(order);
  } while (std::next_permutation(order.begin(), order.end()));
  REQUIRE(orders.size() == 24);
  int cases = 0;
  for (const Dims& shape : {Dims{3, 5, 7, 9}, Dims{2, 17, 1, 19}, Dims{1, 8, 8, 4},
                            Dims{2, 3, 4, 2}, Dims{5, 1, 33, 3}}) {
    for (const Dims& permutation : orders) {
      for (DType dtype : {DType::Float32, DType::BFloat16, DType::Int64, DType::UInt8}) {
        cases += check_permute(shape, permutation, dtype);
      }
    }
  }
  CHECK(cases == 5 * 24 * 4 * 2);
}

TEST_CASE("blocked copy: ConvNeXt's NCHW <-> NHWC and the rows a permute keeps together") {
  int cases = 0;
  for (DType dtype : kEveryElementSize) {
    // NCHW -> NHWC and back, at stage sizes of a 32x32 input and at odd ones.
    cases += check_permute({8, 96, 8, 8}, {0, 2, 3, 1}, dtype);
    cases += check_permute({8, 8, 8, 96}, {0, 3, 1, 2}, dtype);
    cases += check_permute({3, 13, 5, 7}, {0, 2, 3, 1}, dtype);
    cases += check_permute({2, 2, 2, 384}, {0, 3, 1, 2}, dtype);
    // The last dim stays last: rows of 2 to 80 elements, by memcpy, as 8- or 16-byte words of a
    // transpose, or as short rows.
    for (int64_t row : {1, 2, 3, 4, 8, 20}) {
      cases += check_permute({6, 9, row}, {1, 0, 2}, dtype);
      cases += check_permute({4, 3, 5, row}, {2, 0, 1, 3}, dtype);
    }
  }
  CHECK(cases == 7 * (4 + 12) * 2);
}

TEST_CASE("blocked copy: views that start at an odd element, rows widened into unaligned words") {
  int cases = 0;
  for (DType dtype : {DType::Float32, DType::BFloat16, DType::UInt8}) {
    for (int64_t row : {2, 4, 8}) {
      cases += check_permute({7, 5, row}, {1, 0, 2}, dtype, 1);
      cases += check_permute({3, 9, 4, row}, {0, 2, 1, 3}, dtype, 3);
    }
    cases += check_permute({19, 23}, {1, 0}, dtype, 1);
  }
  CHECK(cases == 3 * 7 * 2);
}

TEST_CASE("blocked copy: copies large enough to be split across threads") {
  int cases = 0;
  cases += check_permute({4, 96, 28, 28}, {0, 2, 3, 1}, DType::Float32);
  cases += check_permute({4, 28, 28, 96}, {0, 3, 1, 2}, DType::BFloat16);
  cases += check_permute({1000, 333}, {1, 0}, DType::Float32);
  cases += check_permute({64, 200, 12}, {1, 0, 2}, DType::Float32);
  CHECK(cases == 8);
}

TEST_CASE("blocked copy: conv weights narrowed to their used taps, rows shorter than a memcpy's") {
  // [O, I, 3, 3] weights cut to the taps that see more than padding (nn::functional::conv2d):
  // rows of 1 to 3 elements along the last dim, 3 elements apart, at 1 and 2 threads.
  int cases = 0;
  for (int threads : {1, 2}) {
    mpigrad::test::ThreadCount scope(threads);
    for (DType dtype : kEveryElementSize) {
      cases += check_window({5, 4, 3, 3}, {0, 0, 1, 0}, {5, 4, 2, 2}, dtype);
      cases += check_window({5, 4, 3, 3}, {0, 0, 0, 1}, {5, 4, 3, 2}, dtype);
      cases += check_window({5, 4, 3, 3}, {0, 0, 1, 1}, {5, 4, 1, 1}, dtype);
      cases += check_window({5, 4, 3, 3}, {0, 0, 0, 0}, {5, 4, 2, 3}, dtype);
      cases += check_window({6, 7}, {0, 2}, {6, 3}, dtype);  // a 2-d walk
      cases += check_window({2, 3, 40, 5}, {1, 1, 3, 1}, {1, 2, 30, 4}, dtype);
    }
    cases += check_window({256, 128, 3, 3}, {0, 0, 1, 0}, {256, 128, 2, 2}, DType::Float32);
    cases += check_window({40000, 9}, {0, 3}, {40000, 2}, DType::Float32);
  }
  CHECK(cases == 2 * (7 * 6 + 2) * 2);
}
