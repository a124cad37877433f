// The CPU max-pooling, batch-norm and ReLU kernels' Float32 paths (AVX2 where the CPU has it)
// against their Float64 versions, which run the scalar loops: 2x2 max pooling must agree exactly
// (values, winners on ties, NaN and signed zeros, odd widths and heights, every tail length), batch
// norm to float rounding, including data whose mean is far larger than its spread.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/core/tensor.h"
#include "mpigrad/kernels/normalization.h"
#include "mpigrad/kernels/pooling.h"

namespace {

using mpigrad::kernels::DType;
using mpigrad::kernels::Pool2dGeometry;
namespace cpu = mpigrad::kernels::cpu;

Pool2dGeometry pool_2x2(int64_t planes, int64_t height, int64_t width) {
  Pool2dGeometry g;
  g.planes = planes;
  g.height = height;
  g.width = width;
  g.kernel_h = g.kernel_w = g.stride_h = g.stride_w = 2;
  g.out_h = height / 2;
  g.out_w = width / 2;
  return g;
}

// Small integers (many ties), signed zeros, and now and then -inf or a NaN of either sign.
std::vector<float> pooling_input(int64_t n, uint32_t seed, bool with_nan) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> pick(0, 39);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) {
    const int r = pick(rng);
    if (r == 0) {
      v = -0.0f;
    } else if (r == 1) {
      v = -std::numeric_limits<float>::infinity();
    } else if (r == 2 && with_nan) {
      v = std::numeric_limits<float>::quiet_NaN();
    } else if (r == 3 && with_nan) {
      v = -std::numeric_limits<float>::quiet_NaN();
    } else {
      v = float(r % 5) - 2.0f;
    }
  }
  return x;
}

// Equal, NaN to NaN (with the same sign, so the same NaN won), and zeros of the same sign.
bool same(float a, double b) {
  if (std::isnan(a) || std::isnan(b)) {
    return std::isnan(a) && std::isnan(b) && std::signbit(a) == std::signbit(b);
  }
  return double(a) == b && std::signbit(a) == std::signbit(b);
}

struct Pooled {
  std::vector<float> out, grad_in;
  std::vector<uint8_t> indices;  // window taps
  std::vector<double> out_ref, grad_in_ref;
  std::vector<uint8_t> indices_ref;
};

Pooled pool_both(const Pool2dGeometry& g, const std::vector<float>& x,
                 const std::vector<float>& grad_out) {
  Pooled r;
  const size_t outputs = size_t(g.planes * g.out_h * g.out_w);
  const size_t inputs = size_t(g.planes * g.height * g.width);
  // 8 guard elements past the end: a tail's whole-vector stores must stop short of them.
  r.out.assign(outputs + 8, 7.0f);
  r.indices.assign(outputs + 8, 0xEE);
  CHECK(cpu::max_pool2d_tap_dtype(g) == DType::UInt8);
  cpu::max_pool2d_forward(DType::Float32, g, x.data(), r.out.data(), r.indices.data());
  for (size_t k = outputs; k < outputs + 8; ++k) {
    CHECK(r.out[k] == 7.0f);
    CHECK(r.indices[k] == 0xEE);
  }
  r.out.resize(outputs);
  r.indices.resize(outputs);
  const std::vector<double> xd(x.begin(), x.end());
  r.out_ref.assign(outputs, 7.0);
  r.indices_ref.assign(outputs, 0xEE);
  cpu::max_pool2d_forward(DType::Float64, g, xd.data(), r.out_ref.data(), r.indices_ref.data());
  // Backward writes every input: a NaN left over would show.
  r.grad_in.assign(inputs, std::numeric_limits<float>::quiet_NaN());
  cpu::max_pool2d_backward(DType::Float32, g, grad_out.data(), r.indices.data(), r.grad_in.data());
  const std::vector<double> gd(grad_out.begin(), grad_out.end());
  r.grad_in_ref.assign(inputs, std::numeric_limits<double>::quiet_NaN());
  cpu::max_pool2d_backward(DType::Float64, g, gd.data(), r.indices_ref.data(),
                           r.grad_in_ref.data());
  return r;
}

}  // namespace

TEST_CASE("2x2 max pooling in Float32 matches the scalar rule: ties, NaN, zeros, every tail") {
  // 3 planes run on one thread; 60 planes of 18x29 are split between threads (when there are
  // several), whose chunk boundaries the tails must not write across.
  for (int64_t width = 2; width <= 37; ++width) {
    for (int64_t height : {2, 3, 6, 18}) {
      for (bool with_nan : {false, true}) {
        INFO("height ", height, " width ", width, " NaN ", with_nan);
        const Pool2dGeometry g = pool_2x2(height == 18 ? 60 : 3, height, width);
        const auto x =
            pooling_input(g.planes * height * width, uint32_t(width * 31 + height), with_nan);
        // Gradients with signed zeros too: the scalar 0 + g turns -0 into +0.
        auto grad_out = pooling_input(g.planes * g.out_h * g.out_w, uint32_t(width + 7), false);
        for (auto& v : grad_out) v = std::isinf(v) ? 0.5f : v;
        const Pooled r = pool_both(g, x, grad_out);
        bool values = true, winners = true, grads = true;
        for (size_t i = 0; i < r.out.size(); ++i) {
          values = values && same(r.out[i], r.out_ref[i]);
          winners = winners && r.indices[i] == r.indices_ref[i];
        }
        for (size_t i = 0; i < r.grad_in.size(); ++i) {
          grads = grads && same(r.grad_in[i], r.grad_in_ref[i]);
        }
        CHECK(values);
        CHECK(winners);
        CHECK(grads);
      }
    }
  }
}

TEST_CASE("2x2 max pooling in Float32: the first of equal maxima wins, a later NaN replaces one") {
  // One window per case, 2x2: (0,0) (0,1) / (1,0) (1,1), taps 0 1 2 3.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  struct Case {
    float window[4];
    int64_t index;
  };
  const Case cases[] = {{{1, 1, 1, 1}, 0},   {{0, 2, 2, 1}, 1},     {{-0.0f, 0.0f, 0, 0}, 0},
                        {{1, nan, 3, 2}, 1}, {{nan, 5, nan, 1}, 2}, {{1, 2, 3, 4}, 3}};
  // Nine copies of each window side by side: a full vector of 8 outputs and a tail of 1.
  const int64_t copies = 9;
  for (const Case& c : cases) {
    const Pool2dGeometry g = pool_2x2(1, 2, 2 * copies);
    std::vector<float> x(static_cast<size_t>(4 * copies));
    for (int64_t k = 0; k < copies; ++k) {
      x[size_t(2 * k)] = c.window[0];
      x[size_t(2 * k + 1)] = c.window[1];
      x[size_t(2 * copies + 2 * k)] = c.window[2];
      x[size_t(2 * copies + 2 * k + 1)] = c.window[3];
    }
    std::vector<float> out(static_cast<size_t>(copies));
    std::vector<uint8_t> taps(static_cast<size_t>(copies));
    cpu::max_pool2d_forward(DType::Float32, g, x.data(), out.data(), taps.data());
    std::vector<int64_t> indices(static_cast<size_t>(copies));
    cpu::max_pool2d_flat_indices(g, taps.data(), indices.data());
    for (int64_t k = 0; k < copies; ++k) {
      const int64_t at = (c.index & 1) + (c.index >> 1) * 2 * copies + 2 * k;
      CHECK(int64_t(taps[size_t(k)]) == c.index);
      CHECK(indices[size_t(k)] == at);
      CHECK(std::memcmp(&out[size_t(k)], &x[size_t(at)], sizeof(float)) == 0);
    }
  }
}

namespace {

// mean and biased variance of each channel of [batch, channels, inner], in long double.
void reference_statistics(int64_t batch, int64_t channels, int64_t inner,
                          const std::vector<float>& x, std::vector<double>& mean,
                          std::vector<double>& variance) {
  mean.assign(size_t(channels), 0);
  variance.assign(size_t(channels), 0);
  for (int64_t c = 0; c < channels; ++c) {
    long double sum = 0, squares = 0;
    for (int64_t n = 0; n < batch; ++n) {
      for (int64_t i = 0; i < inner; ++i) sum += x[size_t((n * channels + c) * inner + i)];
    }
    const long double m = sum / (batch * inner);
    for (int64_t n = 0; n < batch; ++n) {
      for (int64_t i = 0; i < inner; ++i) {
        const long double d = x[size_t((n * channels + c) * inner + i)] - m;
        squares += d * d;
      }
    }
    mean[size_t(c)] = double(m);
    variance[size_t(c)] = double(squares / (batch * inner));
  }
}

std::vector<float> normal(int64_t n, uint32_t seed, float centre, float spread) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> draw(centre, spread);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = draw(rng);
  return x;
}

}  // namespace

TEST_CASE("batch norm statistics in Float32 are exact to float rounding, even far from zero") {
  // inner 7 takes the scalar lane sums; 8, 13 and 784 the vector path with and without a tail;
  // 1500 crosses a block of the float lanes. A mean of 1000 with a spread of 0.01: E[x^2] - m^2
  // in float would have no correct digit left.
  for (int64_t inner : {7, 8, 13, 784, 1500}) {
    for (float centre : {0.0f, 3.0f, 1000.0f}) {
      const float spread = centre == 1000.0f ? 0.01f : 1.0f;
      INFO("inner ", inner, " centre ", centre);
      const int64_t batch = 5, channels = 3;
      const auto x = normal(batch * channels * inner, uint32_t(inner), centre, spread);
      std::vector<float> mean(static_cast<size_t>(channels)),
          variance(static_cast<size_t>(channels));
      cpu::batch_norm_statistics(DType::Float32, batch, channels, inner, x.data(), mean.data(),
                                 variance.data());
      std::vector<double> mean_ref, variance_ref;
      reference_statistics(batch, channels, inner, x, mean_ref, variance_ref);
      for (int64_t c = 0; c < channels; ++c) {
        CHECK(mean[size_t(c)] == doctest::Approx(mean_ref[size_t(c)]).epsilon(1e-6));
        // Relative only: the variance is 1e-4 for the far-off data.
        CHECK(std::abs(variance[size_t(c)] - variance_ref[size_t(c)]) <=
              1e-5 * variance_ref[size_t(c)]);
      }
    }
  }
}

TEST_CASE("batch norm forward and backward in Float32 match Float64 to float rounding") {
  for (int64_t inner : {7, 8, 13, 196, 1500}) {
    INFO("inner ", inner);
    const int64_t batch = 4, channels = 3, n = batch * channels * inner;
    const auto x = normal(n, uint32_t(inner + 1), 0.5f, 2.0f);
    const auto dy = normal(n, uint32_t(inner + 2), 0.0f, 1.0f);
    const std::vector<float> mean = {0.4f, 0.6f, 0.5f}, invstd = {0.5f, 0.45f, 0.55f};
    const std::vector<float> weight = {1.5f, -0.5f, 0.75f}, bias = {0.1f, -0.2f, 0.3f};
    const std::vector<double> xd(x.begin(), x.end()), dyd(dy.begin(), dy.end());
    const std::vector<double> meand(mean.begin(), mean.end()),
        invstdd(invstd.begin(), invstd.end()), weightd(weight.begin(), weight.end()),
        biasd(bias.begin(), bias.end());

    std::vector<float> y(static_cast<size_t>(n));
    std::vector<double> y_ref(static_cast<size_t>(n));
    cpu::batch_norm_forward(DType::Float32, batch, channels, inner, x.data(), mean.data(),
                            invstd.data(), weight.data(), bias.data(), y.data());
    cpu::batch_norm_forward(DType::Float64, batch, channels, inner, xd.data(), meand.data(),
                            invstdd.data(), weightd.data(), biasd.data(), y_ref.data());
    bool forward = true;
    for (size_t i = 0; i < y.size(); ++i) {
      forward = forward && std::abs(y[i] - y_ref[i]) <= 1e-5 * (1 + std::abs(y_ref[i]));
    }
    CHECK(forward);

    for (bool training : {true, false}) {
      INFO("training ", training);
      std::vector<float> dx(static_cast<size_t>(n)), dw(3), db(3);
      std::vector<double> dx_ref(static_cast<size_t>(n)), dw_ref(3), db_ref(3);
      cpu::batch_norm_backward(DType::Float32, batch, channels, inner, training, x.data(),
                               dy.data(), mean.data(), invstd.data(), weight.data(), dx.data(),
                               dw.data(), db.data());
      cpu::batch_norm_backward(DType::Float64, batch, channels, inner, training, xd.data(),
                               dyd.data(), meand.data(), invstdd.data(), weightd.data(),
                               dx_ref.data(), dw_ref.data(), db_ref.data());
      bool input = true;
      for (size_t i = 0; i < dx.size(); ++i) {
        input = input && std::abs(dx[i] - dx_ref[i]) <= 1e-5 * (1 + std::abs(dx_ref[i]));
      }
      CHECK(input);
      for (size_t c = 0; c < 3; ++c) {
        CHECK(dw[c] == doctest::Approx(dw_ref[c]).epsilon(1e-5));
        CHECK(db[c] == doctest::Approx(db_ref[c]).epsilon(1e-5));
      }
    }
  }
}

TEST_CASE("ReLU in Float32, forward and backward: NaN passes, -0 stays, the gradient is g or +0") {
  using namespace mpigrad::core;  // NOLINT
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  // 19 elements: two vectors of 8 and a tail of 3.
  const std::vector<float> values = {-1,   2,     -0.0f, 0,  nan, 3.5f, -inf, inf, 1e-30f, -1e-30f,
                                     0.5f, -0.5f, 7,     -7, 0,   nan,  -2,   4,   -0.0f};
  const std::vector<float> upstream = {1,   -2,    3, 4, 5,  6, 7, -8,    9, 10,
                                       inf, -0.0f, 1, 1, -1, 2, 3, -0.0f, 2};
  Tensor x = Tensor::from_vector(values, {19}).set_requires_grad();
  Tensor y = relu(x);
  sum(y * Tensor::from_vector(upstream, {19})).backward();
  const auto out = y.to_vector<float>();
  const auto grad = x.grad().to_vector<float>();
  for (size_t i = 0; i < values.size(); ++i) {
    INFO("element ", i, " x ", values[i]);
    const float expected = values[i] < 0 ? 0.0f : values[i];
    CHECK(same(out[i], expected));
    CHECK(same(grad[i], values[i] > 0 ? upstream[i] : 0.0f));
  }
}
