// The CPU's multi-tensor optimizer kernels (kernels/cpu/optimizer.cpp) against the per-tensor
// scalar loops they replaced, written out here as the reference: after several steps of a list
// of tensors with mixed sizes and hyperparameters, every parameter and state element must be
// bitwise the reference's, on one thread and on several, and in float32 and float64.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

#include "mpigrad/core/threads.h"
#include "mpigrad/kernels/optimizer.h"

namespace {

using mpigrad::kernels::AdamHyper;
using mpigrad::kernels::AdamSlot;
using mpigrad::kernels::DType;
using mpigrad::kernels::SgdHyper;
using mpigrad::kernels::SgdSlot;

// The scalar loops of the per-tensor kernels this file checks against (one tensor per call,
// branches inside the element loop), kept verbatim as the reference.
template <typename T>
void reference_sgd(int64_t n, const SgdHyper& h, T* param, const T* grad, T* buffer) {
  const T lr = T(h.lr), momentum = T(h.momentum), wd = T(h.weight_decay);
  const T blend = T(1.0 - h.dampening);
  for (int64_t i = 0; i < n; ++i) {
    T d = grad[i];
    if (h.weight_decay != 0) d += wd * param[i];
    if (h.momentum != 0) {
      const T b = h.first_step ? d : momentum * buffer[i] + blend * d;
      buffer[i] = b;
      d = h.nesterov ? d + momentum * b : b;
    }
    param[i] -= lr * d;
  }
}

template <typename T>
void reference_adam(int64_t n, const AdamHyper& h, T* param, const T* grad, T* exp_avg,
                    T* exp_avg_sq) {
  const double correction1 = 1.0 - std::pow(h.beta1, double(h.step));
  const double correction2 = 1.0 - std::pow(h.beta2, double(h.step));
  const T step_size = T(h.lr / correction1);
  const T sqrt_correction2 = T(std::sqrt(correction2));
  const T beta1 = T(h.beta1), beta2 = T(h.beta2), eps = T(h.eps), wd = T(h.weight_decay);
  const T decay = T(1.0 - h.lr * h.weight_decay);
  for (int64_t i = 0; i < n; ++i) {
    T g = grad[i];
    T p = param[i];
    if (h.decoupled_weight_decay) {
      p *= decay;
    } else if (h.weight_decay != 0) {
      g += wd * p;
    }
    const T m = beta1 * exp_avg[i] + (T(1) - beta1) * g;
    const T v = beta2 * exp_avg_sq[i] + (T(1) - beta2) * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    param[i] = p - step_size * m / (std::sqrt(v) / sqrt_correction2 + eps);
  }
}

// Sizes that cross the vector width, the parallel grain (32768) and one big tensor, so ranges
// of the threads start and end inside tensors; zero-sized tensors are skipped in the walk. With
// the 400003 and 200000 the list passes 8 pieces of 65536 elements, so 2 threads take it in
// pieces (kernels/cpu/parallel.h's parallel_for_balanced) that also start and end inside tensors.
const std::vector<int64_t> kSizes = {1,    0,     3,      4, 5,      17, 64,    0,
                                     1000, 40000, 400003, 7, 150001, 2,  33000, 200000};

// Every buffer of one tensor: the kernel's copy and the reference's.
template <typename T>
struct Buffers {
  std::vector<T> param, grad, state1, state2;
};

template <typename T>
std::vector<Buffers<T>> random_buffers(std::mt19937& rng, bool positive_state2) {
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<Buffers<T>> out;
  for (int64_t n : kSizes) {
    Buffers<T> b;
    for (int64_t i = 0; i < n; ++i) {
      b.param.push_back(T(normal(rng)));
      b.grad.push_back(T(normal(rng) * 0.1));
      b.state1.push_back(T(normal(rng) * 0.01));
      // Adam's exp_avg_sq is a running mean of squares: never negative.
      const double s = normal(rng) * 0.001;
      b.state2.push_back(T(positive_state2 ? s * s : s));
    }
    out.push_back(std::move(b));
  }
  return out;
}

template <typename T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Sets the kernels' thread count for a scope and restores it after.
struct ThreadScope {
  int previous = mpigrad::core::num_threads();
  explicit ThreadScope(int threads) { mpigrad::core::set_num_threads(threads); }
  ~ThreadScope() { mpigrad::core::set_num_threads(previous); }
};

template <typename T>
void check_sgd(DType dtype, int threads) {
  ThreadScope scope(threads);
  std::mt19937 rng(7);
  std::vector<Buffers<T>> ours = random_buffers<T>(rng, false), theirs = ours;
  // Per tensor: weight decay or not, momentum or not, dampening, nesterov (only with momentum
  // and no dampening, as SGD requires).
  std::vector<SgdHyper> hypers(kSizes.size());
  for (size_t k = 0; k < hypers.size(); ++k) {
    SgdHyper& h = hypers[k];
    h.lr = 0.01 * double(k + 1);
    h.weight_decay = k % 3 == 0 ? 0.0 : 1e-3 * double(k);
    h.momentum = k % 4 == 1 ? 0.0 : 0.9;
    h.nesterov = h.momentum != 0 && k % 2 == 0;
    h.dampening = h.nesterov ? 0.0 : (k % 5 == 0 ? 0.1 : 0.0);
  }
  for (int step = 0; step < 3; ++step) {
    std::vector<SgdSlot> slots;
    for (size_t k = 0; k < kSizes.size(); ++k) {
      hypers[k].first_step = step == 0;
      SgdSlot s;
      s.param = ours[k].param.data();
      s.grad = ours[k].grad.data();
      s.momentum_buffer = hypers[k].momentum != 0 ? ours[k].state1.data() : nullptr;
      s.numel = kSizes[k];
      s.hyper = hypers[k];
      slots.push_back(s);
      reference_sgd<T>(kSizes[k], hypers[k], theirs[k].param.data(), theirs[k].grad.data(),
                       theirs[k].state1.data());
    }
    mpigrad::kernels::cpu::sgd_step_multi(dtype, int64_t(slots.size()), slots.data());
  }
  for (size_t k = 0; k < kSizes.size(); ++k) {
    CAPTURE(k);
    CHECK(bitwise_equal(ours[k].param, theirs[k].param));
    CHECK(bitwise_equal(ours[k].state1, theirs[k].state1));
  }
}

template <typename T>
void check_adam(DType dtype, int threads) {
  ThreadScope scope(threads);
  std::mt19937 rng(11);
  std::vector<Buffers<T>> ours = random_buffers<T>(rng, true), theirs = ours;
  // Per tensor: Adam without decay, Adam with L2 decay, AdamW; the step counts differ (a
  // parameter whose gradient was missing in some steps has a smaller count).
  std::vector<AdamHyper> hypers(kSizes.size());
  for (size_t k = 0; k < hypers.size(); ++k) {
    AdamHyper& h = hypers[k];
    h.lr = 1e-3 * double(k + 1);
    h.beta1 = k % 2 == 0 ? 0.9 : 0.8;
    h.beta2 = k % 3 == 0 ? 0.999 : 0.95;
    h.eps = k % 4 == 0 ? 1e-8 : 1e-6;
    h.decoupled_weight_decay = k % 3 == 2;
    h.weight_decay = k % 3 == 0 ? 0.0 : 1e-2;
    h.step = int64_t(k % 5);
  }
  for (int step = 0; step < 3; ++step) {
    std::vector<AdamSlot> slots;
    for (size_t k = 0; k < kSizes.size(); ++k) {
      ++hypers[k].step;
      AdamSlot s;
      s.param = ours[k].param.data();
      s.grad = ours[k].grad.data();
      s.exp_avg = ours[k].state1.data();
      s.exp_avg_sq = ours[k].state2.data();
      s.numel = kSizes[k];
      s.hyper = hypers[k];
      slots.push_back(s);
      reference_adam<T>(kSizes[k], hypers[k], theirs[k].param.data(), theirs[k].grad.data(),
                        theirs[k].state1.data(), theirs[k].state2.data());
    }
    mpigrad::kernels::cpu::adam_step_multi(dtype, int64_t(slots.size()), slots.data());
  }
  for (size_t k = 0; k < kSizes.size(); ++k) {
    CAPTURE(k);
    CHECK(bitwise_equal(ours[k].param, theirs[k].param));
    CHECK(bitwise_equal(ours[k].state1, theirs[k].state1));
    CHECK(bitwise_equal(ours[k].state2, theirs[k].state2));
  }
}

}  // namespace

TEST_CASE("multi-tensor SGD is bitwise the per-tensor loop, on 1 and 2 threads") {
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    check_sgd<float>(DType::Float32, threads);
    check_sgd<double>(DType::Float64, threads);
  }
}

TEST_CASE("multi-tensor Adam and AdamW are bitwise the per-tensor loop, on 1 and 2 threads") {
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    check_adam<float>(DType::Float32, threads);
    check_adam<double>(DType::Float64, threads);
  }
}

TEST_CASE("multi-tensor optimizer kernels reject what they cannot step") {
  std::vector<float> p(8, 1.0f), g(8, 1.0f);
  SgdSlot sgd;
  sgd.param = p.data();
  sgd.grad = g.data();
  sgd.numel = 8;
  sgd.hyper.lr = 0.1;
  sgd.hyper.momentum = 0.9;  // but no buffer
  CHECK_THROWS_WITH_AS(mpigrad::kernels::cpu::sgd_step_multi(DType::Float32, 1, &sgd),
                       doctest::Contains("momentum but no momentum buffer"), std::invalid_argument);
  CHECK(p[0] == 1.0f);  // nothing was written
  AdamSlot adam;
  adam.param = p.data();
  adam.grad = g.data();
  adam.exp_avg = p.data();
  adam.exp_avg_sq = p.data();
  adam.numel = 8;
  CHECK_THROWS_WITH_AS(mpigrad::kernels::cpu::adam_step_multi(DType::BFloat16, 1, &adam),
                       doctest::Contains("adam_step_multi"), std::invalid_argument);
  // An empty list is a step of nothing.
  CHECK_NOTHROW(mpigrad::kernels::cpu::sgd_step_multi(DType::Float32, 0, nullptr));
}
