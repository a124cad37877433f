// Autocast on CUDA (core/autocast.h) against float32 on CUDA: conv2d on cuDNN's 16-bit
// configurations and matmul on cuBLAS's, forward and both backward products, in bf16 and fp16;
// then a tiny CNN trained a few dozen steps in each precision (fp16 with the loss scaler).
//
// Tolerances are relative to the fp32 result, as a norm: ||low - fp32|| / ||fp32||. Each 16-bit
// operand is rounded once (relative error up to 2^-8 in bf16, 2^-11 in fp16; about 0.58 of that
// as an rms), the sums are fp32, and cuDNN's 16-bit output is rounded once more before it is
// widened: with products of random sign the norm-wise error is about 1.7 roundings' rms, 4e-3
// in bf16 and 5e-4 in fp16, so 1e-2 and 2e-3 leave 2.5x and 4x. The largest single error is held
// to 5x the tolerance, relative to the largest fp32 value (an element near zero has no relative
// error to speak of).
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mpigrad/core/autocast.h"
#include "mpigrad/core/autograd.h"
#include "mpigrad/core/cuda.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/indexing.h"
#include "mpigrad/core/ops/linalg.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/nn/functional/conv.h"
#include "mpigrad/nn/layers/activation.h"
#include "mpigrad/nn/layers/batch_norm.h"
#include "mpigrad/nn/layers/container.h"
#include "mpigrad/nn/layers/conv.h"
#include "mpigrad/nn/layers/linear.h"
#include "mpigrad/nn/layers/pooling.h"
#include "mpigrad/nn/loss.h"
#include "mpigrad/nn/optim/grad_scaler.h"
#include "mpigrad/nn/optim/sgd.h"
#include "nn_cuda_test.h"
#if MPIGRAD_TEST_CUDA_INTERNALS
#include "mpigrad/core/cuda/algorithm_plan.h"
#endif

namespace {

using namespace mpigrad;  // NOLINT
using core::Tensor;

const core::DType kLowDtypes[] = {core::kBFloat16, core::kFloat16};

double tolerance_for(core::DType low) {
  return low == core::kBFloat16 ? 1e-2 : 2e-3;
}

// "" when `low` is within `tolerance` of `reference` as a norm, and its largest error within
// 5 * tolerance of the largest |reference|.
std::string relative_mismatch(const Tensor& low, const Tensor& reference, double tolerance) {
  const std::vector<double> a = test::host_values(low), e = test::host_values(reference);
  if (a.size() != e.size()) return "sizes differ";
  double error2 = 0, norm2 = 0, worst = 0, largest = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = a[i] - e[i];
    if (!std::isfinite(a[i])) return "element " + std::to_string(i) + " is not finite";
    error2 += d * d;
    norm2 += e[i] * e[i];
    worst = std::max(worst, std::abs(d));
    largest = std::max(largest, std::abs(e[i]));
  }
  const double relative = std::sqrt(error2 / std::max(norm2, 1e-30));
  if (relative > tolerance || worst > 5 * tolerance * largest) {
    return "norm-wise relative error " + std::to_string(relative) + ", largest error " +
           std::to_string(worst) + " of largest value " + std::to_string(largest) + " (tolerance " +
           std::to_string(tolerance) + ")";
  }
  return "";
}

struct AutocastConvCase {
  const char* name;
  core::Shape input, weight;
  nn::functional::Conv2dOptions options;
};

nn::functional::Conv2dOptions conv_options(std::array<int64_t, 2> stride,
                                           std::array<int64_t, 2> padding,
                                           std::array<int64_t, 2> dilation, int64_t groups) {
  nn::functional::Conv2dOptions o;
  o.stride = stride;
  o.padding = padding;
  o.dilation = dilation;
  o.groups = groups;
  return o;
}

// y = f(a, b) and the gradients of sum(y * weights) in a and b, under autocast `low` (nullopt:
// float32).
struct Products {
  Tensor y, grad_a, grad_b;
};
template <typename Op>
Products run_products(const Tensor& a32, const Tensor& b32, uint64_t seed,
                      std::optional<core::DType> low, Op&& op) {
  Tensor a = a32.detach().to(core::cuda(0));
  Tensor b = b32.detach().to(core::cuda(0));
  a.set_requires_grad(true);
  b.set_requires_grad(true);
  Tensor y;
  {
    core::AutocastGuard autocast(low);
    y = op(a, b);
  }
  CHECK(y.dtype() == core::kFloat32);
  Tensor weights = test::random_input(y.shape(), core::kFloat32, seed).to(core::cuda(0));
  core::sum(y * weights).backward();
  return {y, a.grad(), b.grad()};
}

template <typename Op>
void check_products(const std::string& label, const Tensor& a, const Tensor& b, uint64_t seed,
                    Op&& op) {
  INFO(label);
  const Products reference = run_products(a, b, seed, std::nullopt, op);
  for (core::DType low : kLowDtypes) {
    INFO("autocast " << core::dtype_name(low));
    const Products got = run_products(a, b, seed, low, op);
    const double tolerance = tolerance_for(low);
    const std::string forward = relative_mismatch(got.y, reference.y, tolerance);
    CHECK_MESSAGE(forward.empty(), "output: ", forward);
    const std::string grad_a = relative_mismatch(got.grad_a, reference.grad_a, tolerance);
    CHECK_MESSAGE(grad_a.empty(), "gradient of the input: ", grad_a);
    const std::string grad_b = relative_mismatch(got.grad_b, reference.grad_b, tolerance);
    CHECK_MESSAGE(grad_b.empty(), "gradient of the weight: ", grad_b);
  }
}

[[maybe_unused]] bool has_bf16_tensor_cores() {
  return core::cuda_device_info(core::cuda(0)).compute_major >= 8;
}

}  // namespace

MPIGRAD_NN_CUDA_TEST_CASE("conv2d under autocast on CUDA (cuDNN, 16 bits) matches float32") {
  const AutocastConvCase cases[] = {
      {"3x3 padding 1, 32 -> 64 channels",
       {4, 32, 12, 12},
       {64, 32, 3, 3},
       conv_options({1, 1}, {1, 1}, {1, 1}, 1)},
      {"stride 2, padding 1, odd sizes",
       {3, 16, 11, 9},
       {24, 16, 3, 3},
       conv_options({2, 2}, {1, 1}, {1, 1}, 1)},
      {"groups 4", {2, 32, 8, 8}, {32, 8, 3, 3}, conv_options({1, 1}, {1, 1}, {1, 1}, 4)},
      {"depthwise, stride 2",
       {2, 16, 9, 9},
       {16, 1, 3, 3},
       conv_options({2, 2}, {1, 1}, {1, 1}, 16)},
      {"dilation 2, asymmetric kernel and padding",
       {2, 8, 10, 7},
       {8, 8, 3, 2},
       conv_options({1, 1}, {2, 1}, {2, 2}, 1)},
      {"1x1, 64 -> 32 channels",
       {4, 64, 7, 7},
       {32, 64, 1, 1},
       conv_options({1, 1}, {0, 0}, {1, 1}, 1)},
      {"one input channel (the CNN's first layer)",
       {8, 1, 28, 28},
       {16, 1, 3, 3},
       conv_options({1, 1}, {1, 1}, {1, 1}, 1)},
  };
#if MPIGRAD_TEST_CUDA_INTERNALS
  const auto before = core::cuda_detail::cudnn_conv_algorithm_stats();
#endif
  uint64_t seed = 300;
  for (const AutocastConvCase& c : cases) {
    const Tensor x = test::random_input(c.input, core::kFloat32, ++seed);
    const double fan_in = double(c.weight[1] * c.weight[2] * c.weight[3]);
    const Tensor w =
        test::random_input(c.weight, core::kFloat32, ++seed) * (1.0 / std::sqrt(fan_in));
    check_products(std::string("conv case: ") + c.name, x, w, ++seed,
                   [&](const Tensor& input, const Tensor& weight) {
                     return nn::functional::conv2d(input, weight, Tensor(), c.options);
                   });
  }
#if MPIGRAD_TEST_CUDA_INTERNALS
  // Each case ran its three products once per 16-bit dtype on cuDNN.
  const auto after = core::cuda_detail::cudnn_conv_algorithm_stats();
  const int64_t expected = int64_t(std::size(cases)) * 3 * 2;
  if (has_bf16_tensor_cores()) {
    CHECK(after.mixed_widened_calls == before.mixed_widened_calls);
    CHECK(after.mixed_calls - before.mixed_calls == expected);
    // The heuristics may keep the tiny or depthwise shapes off the tensor cores, not the rest.
    CHECK(after.mixed_tensor_op_calls - before.mixed_tensor_op_calls >= expected / 2);
  } else {
    CHECK(after.mixed_calls + after.mixed_widened_calls ==
          before.mixed_calls + before.mixed_widened_calls + expected);
  }
#endif
}

MPIGRAD_NN_CUDA_TEST_CASE("matmul under autocast on CUDA (cuBLAS, 16 bits) matches float32") {
  const Tensor a = test::random_input({48, 96}, core::kFloat32, 41);
  const Tensor b = test::random_input({96, 40}, core::kFloat32, 42) * (1.0 / std::sqrt(96.0));
  check_products("matmul 48x96 @ 96x40", a, b, 43,
                 [](const Tensor& x, const Tensor& y) { return core::matmul(x, y); });
  const Tensor batched = test::random_input({3, 17, 64}, core::kFloat32, 44);
  check_products("batched matmul 3x17x64 @ 64x33", batched,
                 test::random_input({3, 64, 33}, core::kFloat32, 45) * 0.125, 46,
                 [](const Tensor& x, const Tensor& y) { return core::matmul(x, y); });
}

MPIGRAD_NN_CUDA_TEST_CASE("autocast_kernels names cuBLAS and cuDNN for CUDA, truthfully") {
  for (core::DType low : kLowDtypes) {
    INFO(core::dtype_name(low));
    const std::string text = core::autocast_kernels(low, core::cuda(0));
    CHECK(text.find("cuBLAS") != std::string::npos);
#if MPIGRAD_TEST_CUDA_INTERNALS
    CHECK(text.find("cuDNN") != std::string::npos);
    if (has_bf16_tensor_cores()) {
      CHECK_MESSAGE(text.find("widened") == std::string::npos, text);
      CHECK(text.find("tensor-op math") != std::string::npos);
    }
#endif
  }
}

namespace {

// A tiny CNN (conv, BatchNorm, ReLU, max-pool twice, then Linear) on 4 classes of 16x16 images,
// each a fixed random template plus noise; `steps` steps of SGD from the same initial weights in
// each precision. Returns the loss of every step.
std::vector<double> train_tiny_cnn(std::optional<core::DType> low, int steps,
                                   int64_t* skipped = nullptr) {
  core::Generator init(7);
  nn::Sequential model;
  model.push_back(std::make_shared<nn::Conv2d>(1, 8, 3, init, 1, 1));
  model.push_back(std::make_shared<nn::BatchNorm2d>(8));
  model.push_back(std::make_shared<nn::ReLU>());
  model.push_back(std::make_shared<nn::MaxPool2d>(2));
  model.push_back(std::make_shared<nn::Conv2d>(8, 16, 3, init, 1, 1));
  model.push_back(std::make_shared<nn::ReLU>());
  model.push_back(std::make_shared<nn::MaxPool2d>(2));
  model.push_back(std::make_shared<nn::Flatten>());
  model.push_back(std::make_shared<nn::Linear>(16 * 4 * 4, 4, init));
  model.to(core::cuda(0));
  model.train(true);
  nn::SGD optimizer(model.parameters(), nn::SGDOptions{.lr = 0.05, .momentum = 0.9});
  const bool scaled = low == core::kFloat16;
  nn::GradScaler scaler;
  const Tensor templates = test::random_input({4, 1, 16, 16}, core::kFloat32, 8).to(core::cuda(0));
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step) {
    std::vector<int64_t> labels(32);
    for (size_t i = 0; i < labels.size(); ++i) labels[i] = int64_t((i * 7 + size_t(step)) % 4);
    const Tensor y = Tensor::from_vector(labels, {32}, core::kInt64).to(core::cuda(0));
    const Tensor noise =
        test::random_input({32, 1, 16, 16}, core::kFloat32, 1000 + uint64_t(step)) * 0.8;
    const Tensor x = core::index_select(templates, 0, y) + noise.to(core::cuda(0));
    optimizer.zero_grad();
    Tensor loss;
    {
      core::AutocastGuard autocast(low);
      loss = nn::cross_entropy(model.forward(x), y);
    }
    losses.push_back(loss.item<float>());
    if (scaled) {
      scaler.scale(loss).backward();
      scaler.step(optimizer);
      scaler.update();
    } else {
      loss.backward();
      optimizer.step();
    }
  }
  if (skipped != nullptr) *skipped = scaler.skipped_steps();
  return losses;
}

double mean_of(const std::vector<double>& values, size_t first, size_t count) {
  double total = 0;
  for (size_t i = first; i < first + count; ++i) total += values[i];
  return total / double(count);
}

}  // namespace

MPIGRAD_NN_CUDA_TEST_CASE(
    "a tiny CNN trains under autocast on CUDA: bf16, and fp16 with the loss "
    "scaler, close to fp32") {
  constexpr int kSteps = 40;
  const std::vector<double> fp32 = train_tiny_cnn(std::nullopt, kSteps);
  const double fp32_start = mean_of(fp32, 0, 3), fp32_end = mean_of(fp32, kSteps - 5, 5);
  CHECK(fp32_end < 0.5 * fp32_start);
  for (core::DType low : kLowDtypes) {
    INFO("autocast " << core::dtype_name(low));
    int64_t skipped = 0;
    const std::vector<double> losses = train_tiny_cnn(low, kSteps, &skipped);
    const double start = mean_of(losses, 0, 3), end = mean_of(losses, kSteps - 5, 5);
    INFO("loss " << start << " -> " << end << " (fp32 " << fp32_start << " -> " << fp32_end << "), "
                 << skipped << " steps skipped by the loss scaler");
    // The first step's loss comes from identical weights: only the rounding differs.
    CHECK(std::abs(losses[0] - fp32[0]) <= 0.05 * fp32[0]);
    CHECK(end < 0.5 * start);
    CHECK(std::abs(end - fp32_end) <= 0.1 + 0.5 * fp32_end);
    // fp16's scaler starts at 2^16 and halves on each overflow: a few skipped steps at most.
    CHECK(skipped <= 8);
  }
}
