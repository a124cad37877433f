// The core op table (tests/core/op_cases.h) on CUDA against the CPU: every case forward, and
// every differentiable case backward (the gradients of sum(out * w)), in float32, float64,
// bfloat16 and float16. The CPU reference runs in float32 on the same (rounded) inputs for the
// 16-bit dtypes, since the CPU has no 16-bit GEMM; the tolerance is per dtype.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda_test.h"
#include "mpigrad/core/autocast.h"
#include "mpigrad/core/autograd.h"
#include "mpigrad/core/ops/reduce.h"
#include "op_cases.h"

namespace {

using namespace mpigrad::core;  // NOLINT
using mpigrad::test::OpCase;
using mpigrad::test::OpInputs;

struct Tolerance {
  double atol, rtol;
};

Tolerance tolerance_for(DType dtype) {
  switch (dtype) {
    case DType::Float64:
      return {1e-10, 1e-10};
    case DType::Float32:
      return {2e-5, 1e-4};
    case DType::Float16:
      return {1e-2, 1e-2};
    default:
      return {5e-2, 5e-2};  // BFloat16: 8 significant bits
  }
}

// Weights for sum(out * w), fixed and away from zero.
std::vector<double> weights(int64_t n) {
  std::vector<double> w;
  for (int64_t i = 0; i < n; ++i) w.push_back(0.25 + 0.5 * double((i * 7) % 5) / 4.0);
  return w;
}

// The case's inputs as values exactly representable in `dtype` (the 16-bit types round them).
std::vector<std::vector<double>> rounded_values(const OpCase& op, DType dtype) {
  std::vector<std::vector<double>> values;
  for (const auto& in : op.inputs) {
    if (in.fixed_dtype) {
      values.push_back(in.values);
    } else {
      values.push_back(Tensor::from_vector(in.values, in.shape, dtype).to_vector<double>());
    }
  }
  return values;
}

struct RunResult {
  std::vector<double> out;
  Shape shape;
  DType dtype = kFloat32;
  std::vector<std::vector<double>> grads;  // per float input, empty when not differentiable
};

RunResult run(const OpCase& op, const std::vector<std::vector<double>>& values, DType dtype,
              Device device) {
  OpInputs inputs;
  for (size_t i = 0; i < op.inputs.size(); ++i) {
    const auto& in = op.inputs[i];
    Tensor t = Tensor::from_vector(values[i], in.shape,
                                   TensorOptions(in.fixed_dtype.value_or(dtype)).device(device));
    if (op.differentiable && !in.fixed_dtype) t.set_requires_grad(true);
    inputs.push_back(t);
  }
  Tensor out = op.build(inputs);
  RunResult result{out.to_vector<double>(), out.shape(), out.dtype(), {}};
  if (op.differentiable) {
    Tensor w = Tensor::from_vector(weights(out.numel()), out.shape(),
                                   TensorOptions(out.dtype()).device(device));
    sum(out * w).backward();
    for (size_t i = 0; i < op.inputs.size(); ++i) {
      if (op.inputs[i].fixed_dtype) continue;
      Tensor grad = inputs[i].grad();
      result.grads.push_back(grad.defined() ? grad.to_vector<double>()
                                            : std::vector<double>(values[i].size(), 0.0));
    }
  }
  return result;
}

void check_case(const OpCase& op, DType dtype) {
  INFO("op case: ", op.name, ", dtype ", dtype_name(dtype));
  try {
    const auto values = rounded_values(op, dtype);
    const DType reference_dtype = dtype == kFloat64 ? kFloat64 : kFloat32;
    const RunResult expected = run(op, values, reference_dtype, kCPU);
    const RunResult actual = run(op, values, dtype, cuda(0));
    const Tolerance tol = tolerance_for(dtype);
    CHECK(actual.shape == expected.shape);
    CHECK(actual.dtype == op.output_dtype.value_or(dtype));
    const std::string forward =
        mpigrad::test::first_mismatch(actual.out, expected.out, tol.atol, tol.rtol);
    CHECK_MESSAGE(forward.empty(), "forward: ", forward);
    REQUIRE(actual.grads.size() == expected.grads.size());
    for (size_t i = 0; i < actual.grads.size(); ++i) {
      const std::string backward = mpigrad::test::first_mismatch(actual.grads[i], expected.grads[i],
                                                                 2 * tol.atol, 2 * tol.rtol);
      CHECK_MESSAGE(backward.empty(), "gradient of float input ", i, ": ", backward);
    }
  } catch (const std::exception& e) {
    FAIL_CHECK("threw: " << e.what());
  }
}

// Under autocast (core/autocast.h) in `dtype`: the cases of ops the policy runs in 16 bits, from
// float32 inputs, CUDA (cuBLAS with 16-bit operands, fp32 output) against the CPU (oneDNN, or
// its fp32 fallback) under the same autocast. Both sum the same rounded operands in fp32, so
// only the summation order differs.
void check_autocast_table(DType dtype) {
  int checked = 0;
  for (const OpCase& op : mpigrad::test::op_cases()) {
    const std::string first_word = op.name.substr(0, op.name.find(' '));
    bool low = false;
    for (const AutocastPolicy& entry : autocast_policy()) {
      low = low || (entry.op == first_word && entry.rule == AutocastRule::LowPrecision);
    }
    if (!low) continue;
    INFO("op case: ", op.name, " under autocast ", dtype_name(dtype));
    std::vector<std::vector<double>> values;
    for (const auto& in : op.inputs) values.push_back(in.values);
    AutocastGuard autocast(dtype);
    const RunResult expected = run(op, values, kFloat32, kCPU);
    const RunResult actual = run(op, values, kFloat32, cuda(0));
    CHECK(actual.dtype == kFloat32);
    CHECK_MESSAGE(mpigrad::test::first_mismatch(actual.out, expected.out, 1e-4, 1e-4).empty(),
                  "forward");
    REQUIRE(actual.grads.size() == expected.grads.size());
    for (size_t i = 0; i < actual.grads.size(); ++i) {
      CHECK_MESSAGE(
          mpigrad::test::first_mismatch(actual.grads[i], expected.grads[i], 1e-4, 1e-4).empty(),
          "gradient of input ", i);
    }
    ++checked;
  }
  CHECK(checked >= 10);
}

// Hessian-vector products of the case on `device` in float64: for f = sum(op(x) * w), the
// gradient is taken with create_graph and grad(sum(g * u)) returned per float input (zeros where
// the gradient does not depend on that input).
std::vector<std::vector<double>> hessian_vector(const OpCase& op, Device device) {
  std::vector<Tensor> inputs, wrt;
  for (const auto& in : op.inputs) {
    Tensor t =
        Tensor::from_vector(in.values, in.shape, in.fixed_dtype.value_or(kFloat64)).to(device);
    if (!in.fixed_dtype) {
      t.set_requires_grad(true);
      wrt.push_back(t);
    }
    inputs.push_back(t);
  }
  Tensor out = op.build(inputs);
  Tensor w = ones_like(out) * 0.75;
  std::vector<Tensor> g = grad({out}, wrt, {w}, {.create_graph = true, .allow_unused = true});
  Tensor s;
  for (size_t k = 0; k < g.size(); ++k) {
    if (!g[k].defined()) continue;
    Tensor term = sum(g[k] * g[k].detach() * 0.5 + g[k]);
    s = s.defined() ? s + term : term;
  }
  std::vector<Tensor> h(wrt.size());
  if (s.defined() && s.requires_grad()) h = grad({s}, wrt, {}, {.allow_unused = true});
  std::vector<std::vector<double>> values;
  for (size_t k = 0; k < wrt.size(); ++k) {
    values.push_back(h[k].defined() ? h[k].to(kCPU).to_vector<double>()
                                    : std::vector<double>(size_t(wrt[k].numel()), 0.0));
  }
  return values;
}

void check_table(DType dtype) {
  for (const OpCase& op : mpigrad::test::op_cases()) check_case(op, dtype);
}

}  // namespace

MPIGRAD_CUDA_TEST_CASE("op table on CUDA matches the CPU: float32") {
  check_table(kFloat32);
}
MPIGRAD_CUDA_TEST_CASE("op table on CUDA matches the CPU: float64") {
  check_table(kFloat64);
}
MPIGRAD_CUDA_TEST_CASE("op table on CUDA matches the CPU: bfloat16") {
  check_table(kBFloat16);
}
MPIGRAD_CUDA_TEST_CASE("op table on CUDA matches the CPU: float16") {
  check_table(kFloat16);
}
MPIGRAD_CUDA_TEST_CASE("second derivatives of the op table on CUDA match the CPU: float64") {
  int checked = 0;
  for (const OpCase& op : mpigrad::test::op_cases()) {
    if (!op.differentiable) continue;
    INFO("op case: ", op.name);
    try {
      const auto expected = hessian_vector(op, kCPU);
      const auto actual = hessian_vector(op, cuda(0));
      REQUIRE(actual.size() == expected.size());
      for (size_t k = 0; k < actual.size(); ++k) {
        CHECK_MESSAGE(mpigrad::test::first_mismatch(actual[k], expected[k], 1e-10, 1e-10).empty(),
                      "second derivative of input ", k);
      }
      ++checked;
    } catch (const std::exception& e) {
      FAIL_CHECK("threw: " << std::string(e.what()));
    }
  }
  CHECK(checked > 40);
}
MPIGRAD_CUDA_TEST_CASE("autocast on CUDA matches autocast on the CPU: bfloat16 and float16") {
  check_autocast_table(kBFloat16);
  check_autocast_table(kFloat16);
}
