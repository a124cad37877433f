// The one-call training batch-norm forward (kernels::cpu::batch_norm_forward_training) against the
// separate steps it replaces: batch_norm_statistics, the per-channel invstd and running-statistics
// arithmetic in the data's type, then batch_norm_forward. Every output must match to the last bit,
// at 1, 2 and 3 threads, on shapes that take each path (inner below 8, not a multiple of 8, a
// whole Fashion-MNIST feature map, batch 1).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

#include "mpigrad/core/threads.h"
#include "mpigrad/kernels/normalization.h"

namespace {

using mpigrad::kernels::DType;
namespace cpu = mpigrad::kernels::cpu;

struct ThreadCountRestorer {
  int previous = mpigrad::core::num_threads();
  ~ThreadCountRestorer() { mpigrad::core::set_num_threads(previous); }
};

struct Shape {
  int64_t batch, channels, inner;
};

// Everything the training forward writes.
template <typename T>
struct Outputs {
  std::vector<T> y, mean, invstd, running_mean, running_var;
};

template <typename T>
std::vector<T> normal(size_t n, uint32_t seed, double centre, double spread) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> draw(centre, spread);
  std::vector<T> v(n);
  for (auto& e : v) e = T(draw(rng));
  return v;
}

template <typename T>
constexpr DType dtype_of() {
  return std::is_same_v<T, float> ? DType::Float32 : DType::Float64;
}

template <typename T>
Outputs<T> start(const Shape& s, bool running) {
  Outputs<T> out;
  out.y.assign(size_t(s.batch * s.channels * s.inner), T(-7));
  out.mean.assign(size_t(s.channels), T(-7));
  out.invstd.assign(size_t(s.channels), T(-7));
  if (running) {
    out.running_mean = normal<T>(size_t(s.channels), 11, 0.5, 1.0);
    out.running_var = normal<T>(size_t(s.channels), 12, 2.0, 0.5);
  }
  return out;
}

template <typename T>
T* or_null(std::vector<T>& v) {
  return v.empty() ? nullptr : v.data();
}
template <typename T>
const T* or_null(const std::vector<T>& v) {
  return v.empty() ? nullptr : v.data();
}

// The steps the backend took before the fused kernel, the arithmetic as it was written there.
template <typename T>
Outputs<T> separate(const Shape& s, double factor, double eps, const std::vector<T>& x,
                    const std::vector<T>& weight, const std::vector<T>& bias, bool running) {
  Outputs<T> out = start<T>(s, running);
  std::vector<T> variance(size_t(s.channels));
  cpu::batch_norm_statistics(dtype_of<T>(), s.batch, s.channels, s.inner, x.data(), out.mean.data(),
                             variance.data());
  const int64_t count = s.batch * s.inner;
  const T unbias = T(double(count) / (double(count) - 1.0));
  for (size_t c = 0; c < size_t(s.channels); ++c) {
    const T shifted = variance[c] + T(eps);
    out.invstd[c] = T(1) / std::sqrt(shifted);
    if (!running) continue;
    const T keep_mean = out.running_mean[c] * T(1.0 - factor);
    const T add_mean = out.mean[c] * T(factor);
    out.running_mean[c] = keep_mean + add_mean;
    const T unbiased = variance[c] * unbias;
    const T keep_var = out.running_var[c] * T(1.0 - factor);
    const T add_var = unbiased * T(factor);
    out.running_var[c] = keep_var + add_var;
  }
  cpu::batch_norm_forward(dtype_of<T>(), s.batch, s.channels, s.inner, x.data(), out.mean.data(),
                          out.invstd.data(), or_null(weight), or_null(bias), out.y.data());
  return out;
}

template <typename T>
Outputs<T> fused(const Shape& s, double factor, double eps, const std::vector<T>& x,
                 const std::vector<T>& weight, const std::vector<T>& bias, bool running) {
  Outputs<T> out = start<T>(s, running);
  cpu::batch_norm_forward_training(dtype_of<T>(), s.batch, s.channels, s.inner, factor, eps,
                                   x.data(), or_null(weight), or_null(bias),
                                   or_null(out.running_mean), or_null(out.running_var),
                                   out.y.data(), out.mean.data(), out.invstd.data());
  return out;
}

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return false;
  return a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

template <typename T>
void check_fused_matches(const Shape& s, double centre, double spread) {
  ThreadCountRestorer restore;
  const size_t n = size_t(s.batch * s.channels * s.inner);
  const auto x = normal<T>(n, uint32_t(n + s.inner), centre, spread);
  const auto weight = normal<T>(size_t(s.channels), 3, 1.0, 0.5);
  const auto bias = normal<T>(size_t(s.channels), 4, 0.0, 0.5);
  const std::vector<T> none;
  const double factor = 0.1, eps = 1e-5;
  for (bool affine : {true, false}) {
    for (bool running : {true, false}) {
      INFO("affine ", affine, " running ", running);
      mpigrad::core::set_num_threads(1);
      const Outputs<T> want =
          separate<T>(s, factor, eps, x, affine ? weight : none, affine ? bias : none, running);
      for (int threads : {1, 2, 3}) {
        INFO("threads ", threads);
        mpigrad::core::set_num_threads(threads);
        const Outputs<T> got =
            fused<T>(s, factor, eps, x, affine ? weight : none, affine ? bias : none, running);
        CHECK(same_bits(got.y, want.y));
        CHECK(same_bits(got.mean, want.mean));
        CHECK(same_bits(got.invstd, want.invstd));
        CHECK(same_bits(got.running_mean, want.running_mean));
        CHECK(same_bits(got.running_var, want.running_var));
      }
    }
  }
}

// Batch 1; inner 1 (BatchNorm1d), below 8, exactly 8, not a multiple of 8, a 28x28 map and more
// than a block of the float lanes (1024); enough channels that 3 threads each get some.
const Shape kShapes[] = {{1, 3, 13},  {4, 6, 1},   {5, 3, 7},    {3, 4, 8},   {2, 5, 9},
                         {1, 7, 784}, {6, 5, 196}, {64, 3, 784}, {2, 3, 1500}};

}  // namespace

TEST_CASE("fused training batch norm matches statistics + update + forward bitwise in Float32") {
  for (const Shape& s : kShapes) {
    INFO("shape ", s.batch, "x", s.channels, "x", s.inner);
    check_fused_matches<float>(s, 0.5, 2.0);
    // Far from zero: the two-pass statistics' correction of the first mean's rounding matters.
    check_fused_matches<float>(s, 1000.0, 0.01);
  }
}

TEST_CASE("fused training batch norm matches statistics + update + forward bitwise in Float64") {
  for (const Shape& s : kShapes) {
    INFO("shape ", s.batch, "x", s.channels, "x", s.inner);
    check_fused_matches<double>(s, 0.5, 2.0);
  }
}

TEST_CASE("fused training batch norm rejects a dtype it does not compute") {
  float x[8] = {}, y[8] = {}, mean[1] = {}, invstd[1] = {};
  CHECK_THROWS(cpu::batch_norm_forward_training(DType::Int32, 2, 1, 4, 0.1, 1e-5, x, nullptr,
                                                nullptr, nullptr, nullptr, y, mean, invstd));
}
