// The algorithm order and fall-back of core/cuda/algorithm_plan.h, which the cuDNN convolution
// builds once per shape: checked here without cuDNN or a GPU.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "mpigrad/core/cuda/algorithm_plan.h"
#include "mpigrad/core/error.h"

namespace {

using mpigrad::core::cuda_detail::AlgorithmChoice;
using mpigrad::core::cuda_detail::AlgorithmPlan;

}  // namespace

TEST_CASE("algorithm plan: preference order, repeats dropped, workspace capped") {
  AlgorithmPlan plan({{1, 3, 100}, {6, 3, 5000}, {1, 3, 100}, {0, 3, 0}, {1, 0, 10}}, 1000);
  REQUIRE_FALSE(plan.exhausted());
  CHECK(plan.remaining() == 3);  // 6 is over the cap, the second {1, 3} is a repeat
  CHECK(plan.current().algorithm == 1);
  CHECK(plan.current().math_type == 3);
  CHECK(plan.describe().find("algorithm 6 (math type 3) needs 5000 bytes of workspace, over the "
                             "cap of 1000") != std::string::npos);
}

TEST_CASE("algorithm plan: a failing algorithm is left behind for good") {
  AlgorithmPlan plan({{1, 3, 0}, {0, 3, 0}, {2, 3, 0}}, 1 << 20);
  std::vector<int> tried;
  auto fail_first = [&](const AlgorithmChoice& choice) {
    tried.push_back(choice.algorithm);
    return choice.algorithm == 1 ? std::string("CUDNN_STATUS_NOT_SUPPORTED") : std::string();
  };
  CHECK(plan.run("conv2d forward", fail_first).algorithm == 0);
  CHECK(plan.run("conv2d forward", fail_first).algorithm == 0);  // no second try of 1
  CHECK(tried == std::vector<int>{1, 0, 0});
  CHECK(plan.describe().find("algorithm 1 (math type 3) failed: CUDNN_STATUS_NOT_SUPPORTED") !=
        std::string::npos);
}

TEST_CASE("algorithm plan: when every algorithm fails, one error lists them all") {
  AlgorithmPlan plan({{1, 3, 0}, {0, 3, 0}}, 1 << 20);
  auto always = [](const AlgorithmChoice& choice) {
    return "status " + std::to_string(choice.algorithm);
  };
  CHECK_THROWS_WITH_AS(plan.run("conv2d backward data", always),
                       doctest::Contains("conv2d backward data: no algorithm could run (algorithm "
                                         "1 (math type 3) failed: status 1; algorithm 0 (math "
                                         "type 3) failed: status 0)"),
                       mpigrad::core::Error);
  CHECK(plan.exhausted());
  AlgorithmPlan none({}, 0);
  CHECK_THROWS_WITH_AS(none.run("conv2d forward", always),
                       doctest::Contains("no algorithm suggested"), mpigrad::core::Error);
}

TEST_CASE("algorithm plan: try_run returns null where run throws, and tries nothing twice") {
  AlgorithmPlan plan({{1, 1, 0}, {0, 3, 0}}, 1 << 20);
  int calls = 0;
  auto always = [&](const AlgorithmChoice& choice) {
    ++calls;
    return "CUDNN_STATUS_NOT_SUPPORTED for " + std::to_string(choice.algorithm);
  };
  CHECK(plan.try_run(always) == nullptr);
  CHECK(calls == 2);
  CHECK(plan.exhausted());
  CHECK(plan.try_run(always) == nullptr);  // a 16-bit convolution's later calls widen at once
  CHECK(calls == 2);
  CHECK(
      plan.describe().find("algorithm 1 (math type 1) failed: CUDNN_STATUS_NOT_SUPPORTED for 1") !=
      std::string::npos);
  AlgorithmPlan good({{7, 1, 0}}, 1 << 20);
  const AlgorithmChoice* ran = good.try_run([](const AlgorithmChoice&) { return std::string(); });
  REQUIRE(ran != nullptr);
  CHECK(ran->algorithm == 7);
}
