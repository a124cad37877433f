// An optimizer step rewrites a parameter's cached 16-bit autocast copy in the same pass as the
// parameter (nn/optim/optimizer.h, kernels/optimizer.h's low_copy): the next forward finds it
// current and casts nothing, and what it reads is bit for bit the cast of the updated float32
// parameter. Where the cache is not the copy's only holder, the step leaves it and autocast casts
// anew, so a graph kept with retain_graph still reads the values it was built from.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <iterator>
#include <vector>

#include "mpigrad/core/autocast.h"
#include "mpigrad/core/autograd.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/core/rng.h"
#include "mpigrad/core/threads.h"
#include "mpigrad/nn/functional/conv.h"
#include "mpigrad/nn/optim/adam.h"
#include "mpigrad/nn/optim/sgd.h"

namespace {

using namespace mpigrad::core;  // NOLINT
namespace nn = mpigrad::nn;

struct ThreadScope {
  int previous = num_threads();
  explicit ThreadScope(int threads) { set_num_threads(threads); }
  ~ThreadScope() { set_num_threads(previous); }
};

Tensor parameter(const Shape& shape, uint64_t seed) {
  Generator generator(seed);
  Tensor p = randn(shape, generator);
  p.set_requires_grad(true);
  return p;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.contiguous().data_ptr(), b.contiguous().data_ptr(),
                     size_t(a.numel()) * element_size(a.dtype())) == 0;
}

// The cast autocast would make of `p` now, without the cache.
Tensor fresh_cast(const Tensor& p, DType dtype) {
  NoGradGuard no_grad;
  return p.detach().to(dtype);
}

// Gives each parameter a gradient (of sum(p * p * 0.5), i.e. p itself, scaled by the seed) and
// casts it through autocast, as a forward would.
void forward_and_backward(const std::vector<Tensor>& params, DType dtype, double scale) {
  for (const Tensor& p : params) autocast_operand(p, dtype);
  for (const Tensor& p : params) sum(p * p * (0.5 * scale)).backward();
}

template <typename Optimizer, typename Options>
void check_rewritten(DType dtype, const Options& options, int threads) {
  ThreadScope scope(threads);
  clear_autocast_cache();
  // Sizes around the kernel's pieces (65536 elements): a piece that crosses tensors, a tensor of
  // several pieces, a tail that is not a whole vector.
  // And one of 1.2 MB in bfloat16.
  std::vector<Tensor> params = {parameter({70003}, 1), parameter({3, 5}, 2),
                                parameter({64, 1025}, 3), parameter({600001}, 4)};
  Optimizer optimizer(params, options);
  for (int step = 0; step < 3; ++step) {
    optimizer.zero_grad();
    forward_and_backward(params, dtype, 1.0 + step);
    optimizer.step();
  }
  // Cast at the first step only; the later forwards found the rewritten copies.
  CHECK(autocast_cache_stats().casts == int64_t(params.size()));
  CHECK(autocast_cache_stats().hits == 2 * int64_t(params.size()));
  for (const Tensor& p : params) {
    const int64_t casts = autocast_cache_stats().casts;
    const Tensor copy = autocast_operand(p, dtype);
    CHECK(autocast_cache_stats().casts == casts);
    CHECK(same_bits(copy, fresh_cast(p, dtype)));
  }
  clear_autocast_cache();
}

TEST_CASE("an optimizer step rewrites the parameters' autocast copies, bit for bit the cast") {
  nn::SGDOptions sgd;
  sgd.lr = 0.05;
  sgd.momentum = 0.9;
  sgd.weight_decay = 1e-2;
  nn::AdamOptions adam;
  adam.lr = 1e-2;
  adam.weight_decay = 1e-2;
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    check_rewritten<nn::SGD>(kBFloat16, sgd, threads);
    check_rewritten<nn::SGD>(kFloat16, sgd, threads);
    check_rewritten<nn::Adam>(kBFloat16, adam, threads);
    check_rewritten<nn::AdamW>(kBFloat16, adam, threads);
    check_rewritten<nn::AdamW>(kFloat16, adam, threads);
  }
}

TEST_CASE("the rewritten copy rounds special values as the cast does") {
  // NaNs (quiet and signalling), infinities, signed zeros, subnormals, the largest finite
  // float and ties of the rounding to nearest even, over a small parameter and one of many
  // pieces of the step's threads; zero gradients, so only the copy is tested.
  const uint32_t specials[] = {0x7fc00001u, 0x7f800001u, 0x7fffffffu, 0xffc00000u,
                               0x7f800000u, 0xff800000u, 0x00000000u, 0x80000000u,
                               0x00000001u, 0x807fffffu, 0x7f7fffffu, 0x3f808000u,
                               0x3f818000u, 0xbf808000u, 0x3f80ffffu, 0x3f7fffffu};
  for (int threads : {1, 2}) {
    ThreadScope scope(threads);
    for (int64_t n : {int64_t(37), int64_t(600013)}) {
      for (DType dtype : {kBFloat16, kFloat16}) {
        CAPTURE(threads);
        CAPTURE(n);
        clear_autocast_cache();
        std::vector<float> values(static_cast<size_t>(n));
        for (size_t i = 0; i < values.size(); ++i) {
          const uint32_t bits = specials[i % std::size(specials)];
          std::memcpy(&values[i], &bits, sizeof(bits));
        }
        Tensor p = Tensor::from_vector(values, {n});
        p.set_requires_grad(true);
        p.set_grad(zeros_like(p).detach());
        nn::SGD optimizer({p}, nn::SGDOptions{});
        autocast_operand(p, dtype);
        optimizer.step();
        const int64_t casts = autocast_cache_stats().casts;
        CHECK(same_bits(autocast_operand(p, dtype), fresh_cast(p, dtype)));
        CHECK(autocast_cache_stats().casts == casts);
        clear_autocast_cache();
      }
    }
  }
}

TEST_CASE("a copy someone else still holds is not rewritten: it keeps the values it had") {
  clear_autocast_cache();
  Tensor p = parameter({4, 7}, 5);
  nn::SGD optimizer({p}, nn::SGDOptions{});
  forward_and_backward({p}, kBFloat16, 1.0);
  const Tensor held = autocast_operand(p, kBFloat16);  // a retained graph's saved operand
  const Tensor before = fresh_cast(p, kBFloat16);
  CHECK(same_bits(held, before));
  optimizer.step();
  CHECK(same_bits(held, before));
  const int64_t casts = autocast_cache_stats().casts;
  const Tensor after = autocast_operand(p, kBFloat16);
  CHECK(autocast_cache_stats().casts == casts + 1);  // stale, so cast again
  CHECK(same_bits(after, fresh_cast(p, kBFloat16)));
  CHECK_FALSE(same_bits(after, before));
  clear_autocast_cache();
}

TEST_CASE("parameters without a cached copy, and float64 ones, step as before") {
  clear_autocast_cache();
  Tensor cast = parameter({9}, 6);
  Tensor uncast = parameter({9}, 7);
  Generator generator(8);
  Tensor wide = randn({9}, generator, TensorOptions(kFloat64));
  wide.set_requires_grad(true);
  nn::SGD optimizer({cast, uncast, wide}, nn::SGDOptions{});
  autocast_operand(cast, kBFloat16);
  const Tensor uncast_before = uncast.detach().clone();
  for (const Tensor& p : {cast, uncast, wide}) sum(p * p).backward();
  optimizer.step();
  // p - lr * 2p for each; the cached copy follows its parameter.
  CHECK(same_bits(uncast, uncast_before - uncast_before * 2.0 * 0.01));
  CHECK(same_bits(autocast_operand(cast, kBFloat16), fresh_cast(cast, kBFloat16)));
  CHECK(autocast_cache_stats().casts == 1);
  clear_autocast_cache();
}

TEST_CASE(
    "training a convolution under autocast casts its weight once, and matches casting each "
    "step") {
  // Three SGD steps of a 3x3 convolution, once with the cache (rewritten by the step) and once
  // with the cache cleared before every forward: the same losses and weights, bit for bit.
  auto train = [](bool clear_each_step, std::vector<float>& losses) {
    clear_autocast_cache();
    Tensor w = parameter({6, 4, 3, 3}, 11);
    Tensor b = parameter({6}, 12);
    Generator generator(13);
    const Tensor x = randn({2, 4, 5, 5}, generator);
    nn::SGDOptions options;
    options.lr = 0.01;
    options.momentum = 0.9;
    nn::SGD optimizer({w, b}, options);
    nn::functional::Conv2dOptions conv;
    conv.padding = {1, 1};
    for (int step = 0; step < 3; ++step) {
      if (clear_each_step) clear_autocast_cache();
      optimizer.zero_grad();
      AutocastGuard guard(kBFloat16);
      Tensor loss =
          sum(nn::functional::conv2d(x, w, b, conv) * nn::functional::conv2d(x, w, b, conv));
      losses.push_back(loss.item<float>());
      loss.backward();
      optimizer.step();
    }
    const AutocastCacheStats stats = autocast_cache_stats();
    clear_autocast_cache();
    return std::pair{w.detach().clone(), stats};
  };
  std::vector<float> cached_losses, fresh_losses;
  const auto [cached_w, cached_stats] = train(false, cached_losses);
  const auto [fresh_w, fresh_stats] = train(true, fresh_losses);
  CHECK(cached_losses == fresh_losses);
  CHECK(same_bits(cached_w, fresh_w));
  // x is cast at each of the six uses; the weight at the first only, then found current.
  CHECK(cached_stats.casts == 6 + 1);
  CHECK(cached_stats.hits == 5);
}

}  // namespace
