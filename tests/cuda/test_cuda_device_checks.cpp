// Labels checked on the GPU (core/device_checks.h): the fused cross-entropy on CUDA matches the
// CPU, does not raise a bad label at the call (nothing waits), and raises it, naming the labels,
// at the next synchronizing read or check_device_errors, once.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "cuda_test.h"
#include "mpigrad/core/autograd.h"
#include "mpigrad/core/device_checks.h"
#include "mpigrad/core/ops/cross_entropy.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/core/rng.h"

namespace {

using namespace mpigrad::core;  // NOLINT
using mpigrad::test::first_mismatch;

const Device kGpu = cuda(0);
const TargetCheck kLabels{"cross_entropy", "label field 'y'"};

std::vector<double> on_cpu(const Tensor& t) {
  return t.to(kCPU).to_vector<double>();
}

}  // namespace

MPIGRAD_CUDA_TEST_CASE("fused cross-entropy rows on CUDA match the CPU, with gradients") {
  Generator generator(3);
  Tensor logits = randn({9, 10}, generator);
  Tensor targets = Tensor::from_vector<int64_t>({0, 9, 3, -100, 2, 2, 5, 1, 7}, {9});
  for (RowLossReduction reduction :
       {RowLossReduction::Mean, RowLossReduction::Sum, RowLossReduction::None}) {
    INFO("reduction ", int(reduction));
    Tensor x = logits.detach().set_requires_grad();
    Tensor xg = logits.to(kGpu).set_requires_grad();
    Tensor loss = cross_entropy_rows(x, targets, -100, reduction, kLabels);
    Tensor loss_g = cross_entropy_rows(xg, targets.to(kGpu), -100, reduction, kLabels);
    CHECK(first_mismatch(on_cpu(loss_g), loss.to_vector<double>(), 1e-5, 1e-5).empty());
    sum(loss * 1.5).backward();
    sum(loss_g * 1.5).backward();
    CHECK(first_mismatch(on_cpu(xg.grad()), x.grad().to_vector<double>(), 1e-6, 1e-5).empty());
  }
  check_device_errors(kGpu);  // all good: returns
}

MPIGRAD_CUDA_TEST_CASE("a bad label on the GPU is reported later, once, naming the labels") {
  Tensor logits = zeros({4, 10}, TensorOptions().device(kGpu));
  Tensor bad = Tensor::from_vector<int64_t>({1, 0, 11, 3}, {4}).to(kGpu);
  Tensor loss;
  CHECK_NOTHROW(loss = cross_entropy_rows(logits, bad, -100, RowLossReduction::Mean, kLabels));
  CHECK_THROWS_WITH_AS(check_device_errors(kGpu),
                       doctest::Contains("cross_entropy: label 11 at position 2 of label field "
                                         "'y' is out of range for num_classes = 10 (checked on "
                                         "cuda:0"),
                       Error);
  CHECK_NOTHROW(check_device_errors(kGpu));  // reported once
  CHECK(std::isnan(loss.item<double>()));    // the step itself carries NaN

  // A read of the loss is a synchronization: it raises the check of the step that made it.
  Tensor again = cross_entropy_rows(logits, bad, -100, RowLossReduction::Sum, kLabels);
  CHECK_THROWS_WITH_AS(again.item<double>(), doctest::Contains("label 11 at position 2"), Error);

  // A negative label that is not ignore_index is bad too; ignore_index itself is not.
  Tensor negative = Tensor::from_vector<int64_t>({-100, -3, 0, 0}, {4}).to(kGpu);
  Tensor third = cross_entropy_rows(logits, negative, -100, RowLossReduction::Mean, kLabels);
  CHECK_THROWS_WITH_AS(check_device_errors(kGpu), doctest::Contains("label -3 at position 1"),
                       Error);
  Tensor good = Tensor::from_vector<int64_t>({-100, 9, 0, 0}, {4}).to(kGpu);
  Tensor fourth = cross_entropy_rows(logits, good, -100, RowLossReduction::Mean, kLabels);
  CHECK(fourth.item<double>() == doctest::Approx(std::log(10.0)));
  CHECK_NOTHROW(check_device_errors(kGpu));
}
