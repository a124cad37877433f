// The cuDNN convolution chooses its algorithms once per shape (core/cuda/cudnn_conv.cpp): repeated
// steps of one shape ask cuDNN's heuristics nothing, and a new shape builds its own plans.
#include <doctest/doctest.h>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/nn/layers/conv.h"
#include "nn_cuda_test.h"
#if MPIGRAD_TEST_CUDA_INTERNALS
#include "mpigrad/core/cuda/algorithm_plan.h"
#endif

namespace {

using namespace mpigrad;  // NOLINT
using core::Tensor;

}  // namespace

#if MPIGRAD_TEST_CUDA_INTERNALS
MPIGRAD_NN_CUDA_TEST_CASE("cuDNN convolution: one heuristics query per shape and direction") {
  core::Generator generator(4);
  // A shape no other case uses, so its plans are built here.
  nn::Conv2d conv({3, 5, {3, 3}, {1, 1}, {1, 1}, {1, 1}, 1, true}, generator);
  conv.to(core::cuda(0));
  auto step = [&](int64_t batch) {
    Tensor x = test::random_input({batch, 3, 13, 11}, core::kFloat32, 7)
                   .to(core::cuda(0))
                   .set_requires_grad();
    core::sum(conv.forward(x)).backward();
    conv.zero_grad();
  };
  const auto start = core::cuda_detail::cudnn_conv_algorithm_stats();
  step(5);
  const auto first = core::cuda_detail::cudnn_conv_algorithm_stats();
  CHECK(first.plans == start.plans + 3);  // forward, backward data, backward filter
  CHECK(first.heuristic_queries == start.heuristic_queries + 3);
  for (int i = 0; i < 4; ++i) step(5);
  const auto repeated = core::cuda_detail::cudnn_conv_algorithm_stats();
  CHECK(repeated.plans == first.plans);
  CHECK(repeated.heuristic_queries == first.heuristic_queries);
  CHECK(repeated.fallbacks == first.fallbacks);  // the plans' first choices ran
  step(6);                                       // another batch size is another shape
  CHECK(core::cuda_detail::cudnn_conv_algorithm_stats().heuristic_queries ==
        first.heuristic_queries + 3);
}
#endif
