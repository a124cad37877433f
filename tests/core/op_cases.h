// The table of op cases shared by the op tests: every differentiable op of core/ops/*.h and the
// views of core/tensor.h, each with small inputs, the forward values expected for them, and a
// flag saying whether its gradient can be checked against finite differences.
//
// Cases named after an op that core/autocast.h's table runs in 16 bits ("matmul ...") are also
// checked under autocast in bf16 and fp16 against float32 (test_autocast.cpp).
//
// The expected values were computed independently of mpigrad (closed forms evaluated in plain
// Python) and pasted in, so a wrong kernel cannot also produce its own reference. Inputs avoid
// the points where an op is not differentiable (0 for relu/abs, the clamp bounds, ties for
// max/min), because finite differences are meaningless there.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/indexing.h"
#include "mpigrad/core/ops/join.h"
#include "mpigrad/core/ops/linalg.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/core/ops/softmax.h"
#include "mpigrad/core/tensor.h"

namespace mpigrad::test {

using core::DType;
using core::Shape;
using core::Tensor;

// One input of a case. Floating inputs are created in the dtype under test and are the ones
// perturbed by the gradient check; index and mask inputs keep their own dtype.
struct OpInput {
  Shape shape;
  std::vector<double> values;
  std::optional<DType> fixed_dtype;  // set for Int64 indices and Bool masks
};

using OpInputs = std::vector<Tensor>;

struct OpCase {
  std::string name;
  std::vector<OpInput> inputs;
  std::function<Tensor(const OpInputs&)> build;
  Shape expected_shape;
  std::vector<double> expected;
  bool differentiable = true;
  // The dtype of the result when it does not follow the inputs (comparisons, argmax, one_hot).
  std::optional<DType> output_dtype;

  OpCase(std::string name_, std::vector<OpInput> inputs_,
         std::function<Tensor(const OpInputs&)> build_, Shape expected_shape_,
         std::vector<double> expected_, bool differentiable_ = true,
         std::optional<DType> output_dtype_ = std::nullopt)
      : name(std::move(name_)),
        inputs(std::move(inputs_)),
        build(std::move(build_)),
        expected_shape(expected_shape_),
        expected(std::move(expected_)),
        differentiable(differentiable_),
        output_dtype(output_dtype_) {}
};

inline OpInput input(Shape shape, std::vector<double> values) {
  return OpInput{shape, std::move(values), std::nullopt};
}
inline OpInput index_input(Shape shape, std::vector<double> values) {
  return OpInput{shape, std::move(values), core::kInt64};
}
inline OpInput mask_input(Shape shape, std::vector<double> values) {
  return OpInput{shape, std::move(values), core::kBool};
}

// ((multiplier * i) mod n) * scale + shift for i in [0, n): distinct values in a scrambled order,
// so reductions see no ties and matmuls see no symmetric operands.
inline std::vector<double> scrambled(int n, int multiplier, double scale, double shift) {
  std::vector<double> values;
  for (int i = 0; i < n; ++i) values.push_back(((multiplier * i) % n) * scale + shift);
  return values;
}
inline std::vector<double> ramp(int n, double scale, double shift) {
  std::vector<double> values;
  for (int i = 0; i < n; ++i) values.push_back(i * scale + shift);
  return values;
}

// Builds the inputs of `op` with floating inputs in `dtype`; `values` replaces the case's values
// when given (the gradient check perturbs them).
inline OpInputs make_inputs(const OpCase& op, DType dtype,
                            const std::vector<std::vector<double>>* values = nullptr) {
  OpInputs tensors;
  for (size_t i = 0; i < op.inputs.size(); ++i) {
    const OpInput& in = op.inputs[i];
    const std::vector<double>& v = values ? (*values)[i] : in.values;
    tensors.push_back(Tensor::from_vector(v, in.shape, in.fixed_dtype.value_or(dtype)));
  }
  return tensors;
}

inline std::vector<OpCase> op_cases() {
  using namespace core;  // NOLINT: the table reads like the math
  const std::vector<double> a23 = {0.5, -1.2, 2.0, 1.5, -0.3, 0.8};
  const std::vector<double> b23 = {1.1, 0.4, -0.7, 2.2, -1.6, 0.9};
  const std::vector<double> p23 = {0.5, 1.2, 2.0, 3.5, 0.3, 0.8};  // positive, for log/sqrt/pow
  const std::vector<double> s23 = {0.2, -1.0, 1.5, 0.7, 0.3, -0.4};
  const std::vector<double> x234 = scrambled(24, 7, 0.25, -2.5);
  const std::vector<double> m23 = {0.5, -1.0, 2.0, 1.5, 0.25, -0.75};
  const std::vector<double> m32 = {1.0, -0.5, 0.3, 2.0, -1.2, 0.7};
  const std::vector<double> v3 = {0.4, -1.1, 2.5};
  const std::vector<double> q223 = ramp(12, 0.3, -1.5);
  std::vector<double> r232;
  for (int i = 0; i < 12; ++i) r232.push_back((i % 5) * 0.4 - 0.9);
  const auto a = [&](Shape s = {2, 3}) { return input(s, a23); };
  const auto b = [&](Shape s = {2, 3}) { return input(s, b23); };
  const auto x = [&] { return input({2, 3, 4}, x234); };
  const std::vector<double> ints = {1, 2, 3, 4, 5, 6}, int_row = {2, 2, 5};

  return {
      // ---- Binary elementwise, same shape, broadcast, and non-contiguous operands ----
      {"add",
       {a(), b()},
       [](const OpInputs& in) { return in[0] + in[1]; },
       {2, 3},
       {1.6, -0.8, 1.3, 3.7, -1.9, 1.7}},
      {"sub",
       {a(), b()},
       [](const OpInputs& in) { return in[0] - in[1]; },
       {2, 3},
       {-0.6, -1.6, 2.7, -0.7, 1.3, -0.1}},
      {"mul",
       {a(), b()},
       [](const OpInputs& in) { return in[0] * in[1]; },
       {2, 3},
       {0.55, -0.48, -1.4, 3.3, 0.48, 0.72}},
      {"div",
       {a(), b()},
       [](const OpInputs& in) { return in[0] / in[1]; },
       {2, 3},
       {0.4545454545, -3, -2.857142857, 0.6818181818, 0.1875, 0.8888888889}},
      {"maximum",
       {a(), b()},
       [](const OpInputs& in) { return maximum(in[0], in[1]); },
       {2, 3},
       {1.1, 0.4, 2, 2.2, -0.3, 0.9}},
      {"minimum",
       {a(), b()},
       [](const OpInputs& in) { return minimum(in[0], in[1]); },
       {2, 3},
       {0.5, -1.2, -0.7, 1.5, -1.6, 0.8}},
      {"add broadcast [3,1]+[4]",
       {input({3, 1}, {1, 2, 3}), input({4}, {0.1, 0.2, 0.3, 0.4})},
       [](const OpInputs& in) { return in[0] + in[1]; },
       {3, 4},
       {1.1, 1.2, 1.3, 1.4, 2.1, 2.2, 2.3, 2.4, 3.1, 3.2, 3.3, 3.4}},
      {"mul broadcast [2,3,4]*[3,1]",
       {x(), input({3, 1}, {0.5, -1.0, 2.0})},
       [](const OpInputs& in) { return in[0] * in[1]; },
       {2, 3, 4},
       {-1.25, -0.375, 0.5, 1.375,  1.5,  -0.25, -2, 2.25,  -1, 2.5,  6, -2.5,
        0.25,  1.125,  -1,  -0.125, -1.5, -3.25, 1,  -0.75, 5,  -3.5, 0, 3.5}},
      {"div broadcast [2,3]/[3]",
       {a(), input({3}, {0.5, 2.0, 4.0})},
       [](const OpInputs& in) { return in[0] / in[1]; },
       {2, 3},
       {1, -0.6, 0.5, 3, -0.15, 0.2}},
      {"sub broadcast [2,1,3]-[4,1]",
       {input({2, 1, 3}, {1, 2, 3, -1, -2, -3}), input({4, 1}, {0.5, 1.5, 2.5, 3.5})},
       [](const OpInputs& in) { return in[0] - in[1]; },
       {2, 4, 3},
       {0.5,  1.5,  2.5,  -0.5, 0.5,  1.5,  -1.5, -0.5, 0.5,  -2.5, -1.5, -0.5,
        -1.5, -2.5, -3.5, -2.5, -3.5, -4.5, -3.5, -4.5, -5.5, -4.5, -5.5, -6.5}},
      {"maximum broadcast [2,3],[3]",
       {a(), input({3}, {0.0, -0.5, 1.0})},
       [](const OpInputs& in) { return maximum(in[0], in[1]); },
       {2, 3},
       {0.5, -0.5, 2, 1.5, -0.3, 1}},
      {"tensor-scalar operators",
       {a()},
       [](const OpInputs& in) { return (in[0] * 2.5 + 1.0) / 4.0 - (3.0 - in[0]); },
       {2, 3},
       {-1.9375, -4.7, 0.5, -0.3125, -3.2375, -1.45}},
      {"scalar / tensor",
       {input({2, 3}, p23)},
       [](const OpInputs& in) { return 3.0 / in[0]; },
       {2, 3},
       {6, 2.5, 1.5, 0.8571428571, 10, 3.75}},
      {"add 0-d tensor",
       {a(), input({}, {0.75})},
       [](const OpInputs& in) { return in[0] + in[1]; },
       {2, 3},
       {1.25, -0.45, 2.75, 2.25, 0.45, 1.55}},
      {"add transposed view",
       {input({3, 2}, a23), b()},
       [](const OpInputs& in) { return in[0].t() + in[1]; },
       {2, 3},
       {1.6, 2.4, -1, 1, -0.1, 1.7}},
      {"mul slice with step",
       {input({2, 4}, {1.0, -2.0, 3.0, -4.0, 0.5, 0.25, -0.5, 2.0}),
        input({2, 2}, {1.1, 0.4, -0.7, 2.2})},
       [](const OpInputs& in) { return in[0].slice(1, 0, 4, 2) * in[1]; },
       {2, 2},
       {1.1, 1.2, -0.35, -1.1}},
      {"mul expanded view",
       {input({1, 3}, {0.5, -2.0, 1.5}), b()},
       [](const OpInputs& in) {
         return in[0].expand({2, 3}) * in[1];
       },
       {2, 3},
       {0.55, -0.8, -1.05, 1.1, 3.2, 1.35}},
      {"composite uses an input three times",
       {a(), b()},
       [](const OpInputs& in) { return exp(in[0]) * in[0] - in[0] / in[1]; },
       {2, 3},
       {0.3698151808, 2.638566946, 17.63525506, 6.040715424, -0.4097454662, 0.8915438539}},

      // ---- Unary elementwise ----
      {"neg",
       {a()},
       [](const OpInputs& in) { return -in[0]; },
       {2, 3},
       {-0.5, 1.2, -2, -1.5, 0.3, -0.8}},
      {"exp",
       {a()},
       [](const OpInputs& in) { return exp(in[0]); },
       {2, 3},
       {1.648721271, 0.3011942119, 7.389056099, 4.48168907, 0.7408182207, 2.225540928}},
      {"log",
       {input({2, 3}, p23)},
       [](const OpInputs& in) { return log(in[0]); },
       {2, 3},
       {-0.6931471806, 0.1823215568, 0.6931471806, 1.252762968, -1.203972804, -0.2231435513}},
      {"sqrt",
       {input({2, 3}, p23)},
       [](const OpInputs& in) { return sqrt(in[0]); },
       {2, 3},
       {0.7071067812, 1.095445115, 1.414213562, 1.870828693, 0.5477225575, 0.894427191}},
      {"rsqrt",
       {input({2, 3}, p23)},
       [](const OpInputs& in) { return rsqrt(in[0]); },
       {2, 3},
       {1.414213562, 0.9128709292, 0.7071067812, 0.5345224838, 1.825741858, 1.118033989}},
      {"abs",
       {a()},
       [](const OpInputs& in) { return abs(in[0]); },
       {2, 3},
       {0.5, 1.2, 2, 1.5, 0.3, 0.8}},
      {"relu",
       {a()},
       [](const OpInputs& in) { return relu(in[0]); },
       {2, 3},
       {0.5, 0, 2, 1.5, 0, 0.8}},
      {"gelu erf",
       {a()},
       [](const OpInputs& in) { return gelu(in[0]); },
       {2, 3},
       {0.3457312306, -0.1380836043, 1.954499736, 1.399789198, -0.1146265733, 0.6305156811}},
      {"gelu tanh",
       {a()},
       [](const OpInputs& in) { return gelu(in[0], GeluApproximation::Tanh); },
       {2, 3},
       {0.3457140098, -0.1382972309, 1.954597694, 1.399571577, -0.1146290765, 0.6304316914}},
      {"silu",
       {a()},
       [](const OpInputs& in) { return silu(in[0]); },
       {2, 3},
       {0.3112296656, -0.2777702598, 1.761594156, 1.226361714, -0.127667245, 0.5519795849}},
      {"softplus",
       {a()},
       [](const OpInputs& in) { return softplus(in[0]); },
       {2, 3},
       {0.9740769842, 0.2632824673, 2.126928011, 1.701413278, 0.5543552445, 1.171100666}},
      {"sigmoid",
       {a()},
       [](const OpInputs& in) { return sigmoid(in[0]); },
       {2, 3},
       {0.6224593312, 0.2314752165, 0.880797078, 0.8175744762, 0.4255574832, 0.6899744811}},
      {"tanh",
       {a()},
       [](const OpInputs& in) { return tanh(in[0]); },
       {2, 3},
       {0.4621171573, -0.833654607, 0.9640275801, 0.9051482536, -0.2913126125, 0.6640367703}},
      {"erf",
       {a()},
       [](const OpInputs& in) { return erf(in[0]); },
       {2, 3},
       {0.5204998778, -0.9103139782, 0.995322265, 0.9661051465, -0.3286267595, 0.7421009647}},
      {"sin",
       {a()},
       [](const OpInputs& in) { return sin(in[0]); },
       {2, 3},
       {0.4794255386, -0.932039086, 0.9092974268, 0.9974949866, -0.2955202067, 0.7173560909}},
      {"cos",
       {a()},
       [](const OpInputs& in) { return cos(in[0]); },
       {2, 3},
       {0.8775825619, 0.3623577545, -0.4161468365, 0.0707372017, 0.9553364891, 0.6967067093}},
      {"pow of a tensor exponent (broadcast)",
       {input({2, 3}, p23), input({3}, {1.5, -0.5, 0.7})},
       [](const OpInputs& in) { return pow(in[0], in[1]); },
       {2, 3},
       {0.3535533906, 0.9128709292, 1.624504793, 6.547900427, 1.825741858, 0.85538768}},
      {"pow 2",
       {a()},
       [](const OpInputs& in) { return pow(in[0], 2.0); },
       {2, 3},
       {0.25, 1.44, 4, 2.25, 0.09, 0.64}},
      {"pow 3 of negatives",
       {a()},
       [](const OpInputs& in) { return pow(in[0], 3.0); },
       {2, 3},
       {0.125, -1.728, 8, 3.375, -0.027, 0.512}},
      {"pow 2.5",
       {input({2, 3}, p23)},
       [](const OpInputs& in) { return pow(in[0], 2.5); },
       {2, 3},
       {0.1767766953, 1.577440966, 5.656854249, 22.91765149, 0.04929503018, 0.5724334022}},
      {"pow -1.5",
       {input({2, 3}, p23)},
       [](const OpInputs& in) { return pow(in[0], -1.5); },
       {2, 3},
       {2.828427125, 0.7607257743, 0.3535533906, 0.1527207097, 6.085806195, 1.397542486}},
      {"clamp",
       {a()},
       [](const OpInputs& in) { return clamp(in[0], -0.5, 1.0); },
       {2, 3},
       {0.5, -0.5, 1, 1, -0.3, 0.8}},
      {"where",
       {mask_input({2, 3}, {1, 0, 0, 1, 1, 0}), a(), b()},
       [](const OpInputs& in) { return where(in[0], in[1], in[2]); },
       {2, 3},
       {0.5, 0.4, -0.7, 1.5, -0.3, 0.9}},
      {"where broadcast",
       {mask_input({3}, {0, 1, 1}), a(), input({1}, {-5.0})},
       [](const OpInputs& in) { return where(in[0], in[1], in[2]); },
       {2, 3},
       {-5, -1.2, 2, -5, -0.3, 0.8}},
      {"sign",
       {a()},
       [](const OpInputs& in) { return sign(in[0]); },
       {2, 3},
       {1, -1, 1, 1, -1, 1},
       false},

      // ---- Comparisons: Bool results, no gradient ----
      {"eq",
       {input({2, 3}, ints), input({3}, int_row)},
       [](const OpInputs& in) { return eq(in[0], in[1]); },
       {2, 3},
       {0, 1, 0, 0, 0, 0},
       false,
       kBool},
      {"ne",
       {input({2, 3}, ints), input({3}, int_row)},
       [](const OpInputs& in) { return ne(in[0], in[1]); },
       {2, 3},
       {1, 0, 1, 1, 1, 1},
       false,
       kBool},
      {"lt",
       {input({2, 3}, ints), input({3}, int_row)},
       [](const OpInputs& in) { return lt(in[0], in[1]); },
       {2, 3},
       {1, 0, 1, 0, 0, 0},
       false,
       kBool},
      {"le",
       {input({2, 3}, ints), input({3}, int_row)},
       [](const OpInputs& in) { return le(in[0], in[1]); },
       {2, 3},
       {1, 1, 1, 0, 0, 0},
       false,
       kBool},
      {"gt",
       {input({2, 3}, ints), input({3}, int_row)},
       [](const OpInputs& in) { return gt(in[0], in[1]); },
       {2, 3},
       {0, 0, 0, 1, 1, 1},
       false,
       kBool},
      {"ge",
       {input({2, 3}, ints), input({3}, int_row)},
       [](const OpInputs& in) { return ge(in[0], in[1]); },
       {2, 3},
       {0, 1, 0, 1, 1, 1},
       false,
       kBool},

      // ---- Reductions ----
      {"sum all", {x()}, [](const OpInputs& in) { return sum(in[0]); }, {}, {9}},
      {"sum dim 1",
       {x()},
       [](const OpInputs& in) { return sum(in[0], {1}); },
       {2, 4},
       {-4.5, 0.75, 6, -0.75, 4.5, 3.75, -3, 2.25}},
      {"sum dims 0,2",
       {x()},
       [](const OpInputs& in) {
         return sum(in[0], {0, 2});
       },
       {3},
       {1, 3, 5}},
      {"sum dim -1 keepdim",
       {x()},
       [](const OpInputs& in) { return sum(in[0], {-1}, true); },
       {2, 3, 1},
       {0.5, -1.5, 2.5, 0.5, 4.5, 2.5}},
      {"sum of transposed view",
       {x()},
       [](const OpInputs& in) { return sum(in[0].transpose(0, 2), {1}); },
       {4, 2},
       {-4.5, 4.5, 0.75, 3.75, 6, -3, -0.75, 2.25}},
      {"mean all", {x()}, [](const OpInputs& in) { return mean(in[0]); }, {}, {0.375}},
      {"mean dim 1 keepdim",
       {x()},
       [](const OpInputs& in) { return mean(in[0], {1}, true); },
       {2, 1, 4},
       {-1.5, 0.25, 2, -0.25, 1.5, 1.25, -1, 0.75}},
      {"mean dims 0,2",
       {x()},
       [](const OpInputs& in) {
         return mean(in[0], {0, 2});
       },
       {3},
       {0.125, 0.375, 0.625}},
      {"var dim 1",
       {x()},
       [](const OpInputs& in) { return var(in[0], {1}); },
       {2, 4},
       {1, 1, 1, 7, 1, 7, 1, 1}},
      {"var dims 0,2 population keepdim",
       {x()},
       [](const OpInputs& in) {
         return var(in[0], {0, 2}, 0, true);
       },
       {1, 3, 1},
       {3.078125, 3.078125, 2.703125}},
      {"var dim -1",
       {x()},
       [](const OpInputs& in) { return var(in[0], {-1}); },
       {2, 3},
       {5.104166667, 3.604166667, 3.604166667, 3.104166667, 3.104166667, 3.604166667}},
      {"max dim 1",
       {x()},
       [](const OpInputs& in) { return max(in[0], 1).values; },
       {2, 4},
       {-0.5, 1.25, 3, 2.75, 2.5, 3.25, 0, 1.75}},
      {"max dim -1 keepdim",
       {x()},
       [](const OpInputs& in) { return max(in[0], -1, true).values; },
       {2, 3, 1},
       {2.75, 2, 3, 2.25, 3.25, 2.5}},
      {"max dim 1 indices",
       {x()},
       [](const OpInputs& in) { return max(in[0], 1).indices; },
       {2, 4},
       {2, 2, 2, 0, 2, 1, 2, 2},
       false,
       kInt64},
      {"min dim 0",
       {x()},
       [](const OpInputs& in) { return min(in[0], 0).values; },
       {3, 4},
       {-2.5, -0.75, -2, -0.25, -1.5, 0.25, -1, -2.25, -0.5, -1.75, 0, -1.25}},
      {"max all", {x()}, [](const OpInputs& in) { return max(in[0]); }, {}, {3.25}},
      {"min all", {x()}, [](const OpInputs& in) { return min(in[0]); }, {}, {-2.5}},
      {"argmax dim 1",
       {x()},
       [](const OpInputs& in) { return argmax(in[0], 1); },
       {2, 4},
       {2, 2, 2, 0, 2, 1, 2, 2},
       false,
       kInt64},
      {"argmax dim -1 keepdim",
       {x()},
       [](const OpInputs& in) { return argmax(in[0], -1, true); },
       {2, 3, 1},
       {3, 2, 2, 1, 1, 0},
       false,
       kInt64},

      // ---- matmul ----
      {"matmul 1d.1d",
       {input({3}, v3), input({3}, {1.5, 0.5, -2.0})},
       [](const OpInputs& in) { return matmul(in[0], in[1]); },
       {},
       {-4.95}},
      {"matmul 2d",
       {input({2, 3}, m23), input({3, 2}, m32)},
       [](const OpInputs& in) { return matmul(in[0], in[1]); },
       {2, 2},
       {-2.2, -0.85, 2.475, -0.775}},
      {"matmul 1d.2d",
       {input({3}, v3), input({3, 2}, m32)},
       [](const OpInputs& in) { return matmul(in[0], in[1]); },
       {2},
       {-2.93, -0.65}},
      {"matmul 2d.1d",
       {input({2, 3}, m23), input({3}, v3)},
       [](const OpInputs& in) { return matmul(in[0], in[1]); },
       {2},
       {6.3, -1.55}},
      {"matmul batched",
       {input({2, 2, 3}, q223), input({2, 3, 2}, r232)},
       [](const OpInputs& in) { return matmul(in[0], in[1]); },
       {2, 2, 2},
       {0.84, 1.2, 0.57, 0.21, -0.78, -0.06, -1.77, 0.03}},
      {"matmul batched.2d",
       {input({2, 2, 3}, q223), input({3, 2}, m32)},
       [](const OpInputs& in) { return matmul(in[0], in[1]); },
       {2, 2, 2},
       {-0.78, -2.28, -0.69, -0.3, -0.6, 1.68, -0.51, 3.66}},
      {"matmul broadcast batch [2,1,2,3].[3,3,2]",
       {input({2, 1, 2, 3}, scrambled(12, 5, 0.2, -1.0)),
        input({3, 3, 2}, scrambled(18, 7, 0.15, -1.2))},
       [](const OpInputs& in) { return matmul(in[0], in[1]); },
       {2, 3, 2, 2},
       {1.5,  1.5,  0.78,  -1.47, 1.5,   -1.2, -1.38, 0.15, -1.2, 1.5,  0.24, 0.69,
        0.78, -1.2, -1.38, 0.87,  -1.38, 0.42, 0.78,  0.33, 0.24, 0.96, 0.24, -1.29}},
      {"matmul 1d.batched",
       {input({3}, v3), input({2, 3, 2}, r232)},
       [](const OpInputs& in) { return matmul(in[0], in[1]); },
       {2, 2},
       {1.5, -2.78, -2.78, -2.06}},
      {"matmul transposed a",
       {input({3, 2}, m32), input({3, 2}, m32)},
       [](const OpInputs& in) { return matmul(in[0].t(), in[1]); },
       {2, 2},
       {2.53, -0.74, -0.74, 4.74}},
      {"matmul transposed b",
       {input({2, 3}, m23), b()},
       [](const OpInputs& in) { return matmul(in[0], in[1].t()); },
       {2, 2},
       {-1.25, 4.5, 2.275, 2.225}},
      {"matmul batched, both transposed",
       {input({2, 3, 2}, r232), input({2, 2, 3}, q223)},
       [](const OpInputs& in) { return matmul(in[0].transpose(1, 2), in[1].transpose(-1, -2)); },
       {2, 2, 2},
       {0.84, 0.57, 1.2, 0.21, -0.78, -1.77, -0.06, 0.03}},

      // ---- Views and copies ----
      {"reshape",
       {x()},
       [](const OpInputs& in) {
         return in[0].reshape({4, 6});
       },
       {4, 6},
       {-2.5, -0.75, 1,  2.75,  -1.5, 0.25, 2,  -2.25, -0.5, 1.25,  3, -1.25,
        0.5,  2.25,  -2, -0.25, 1.5,  3.25, -1, 0.75,  2.5,  -1.75, 0, 1.75}},
      {"reshape of non-contiguous",
       {x()},
       [](const OpInputs& in) {
         return in[0].transpose(1, 2).reshape({4, -1});
       },
       {4, 6},
       {-2.5, -1.5, -0.5, -0.75, 0.25, 1.25,  1,  2,  3, 2.75,  -2.25, -1.25,
        0.5,  1.5,  2.5,  2.25,  3.25, -1.75, -2, -1, 0, -0.25, 0.75,  1.75}},
      {"view",
       {x()},
       [](const OpInputs& in) {
         return in[0].view({-1, 4});
       },
       {6, 4},
       {-2.5, -0.75, 1,  2.75,  -1.5, 0.25, 2,  -2.25, -0.5, 1.25,  3, -1.25,
        0.5,  2.25,  -2, -0.25, 1.5,  3.25, -1, 0.75,  2.5,  -1.75, 0, 1.75}},
      {"permute",
       {x()},
       [](const OpInputs& in) {
         return in[0].permute({2, 0, 1});
       },
       {4, 2, 3},
       {-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, -0.75, 0.25,  1.25,  2.25,  3.25, -1.75,
        1,    2,    3,    -2,  -1,  0,   2.75,  -2.25, -1.25, -0.25, 0.75, 1.75}},
      {"transpose",
       {x()},
       [](const OpInputs& in) { return in[0].transpose(0, 2); },
       {4, 3, 2},
       {-2.5, 0.5, -1.5, 1.5, -0.5, 2.5, -0.75, 2.25,  0.25,  3.25, 1.25,  -1.75,
        1,    -2,  2,    -1,  3,    0,   2.75,  -0.25, -2.25, 0.75, -1.25, 1.75}},
      {"slice with step",
       {x()},
       [](const OpInputs& in) { return in[0].slice(1, 0, 3, 2); },
       {2, 2, 4},
       {-2.5, -0.75, 1, 2.75, -0.5, 1.25, 3, -1.25, 0.5, 2.25, -2, -0.25, 2.5, -1.75, 0, 1.75}},
      {"slice negative start, clamped end",
       {x()},
       [](const OpInputs& in) { return in[0].slice(2, -3, 100, 2); },
       {2, 3, 2},
       {-0.75, 2.75, 0.25, -2.25, 1.25, -1.25, 2.25, -0.25, 3.25, 0.75, -1.75, 1.75}},
      {"narrow",
       {x()},
       [](const OpInputs& in) { return in[0].narrow(2, 1, 2); },
       {2, 3, 2},
       {-0.75, 1, 0.25, 2, 1.25, 3, 2.25, -2, 3.25, -1, -1.75, 0}},
      {"select",
       {x()},
       [](const OpInputs& in) { return in[0].select(1, 1); },
       {2, 4},
       {-1.5, 0.25, 2, -2.25, 1.5, 3.25, -1, 0.75}},
      {"select of transposed",
       {x()},
       [](const OpInputs& in) { return in[0].transpose(0, 1).select(2, 0); },
       {3, 2},
       {-2.5, 0.5, -1.5, 1.5, -0.5, 2.5}},
      {"unsqueeze", {a()}, [](const OpInputs& in) { return in[0].unsqueeze(1); }, {2, 1, 3}, a23},
      {"unsqueeze -1",
       {a()},
       [](const OpInputs& in) { return in[0].unsqueeze(-1); },
       {2, 3, 1},
       a23},
      {"squeeze dim",
       {a({2, 1, 3})},
       [](const OpInputs& in) { return in[0].squeeze(1); },
       {2, 3},
       a23},
      {"squeeze all", {a({1, 6, 1})}, [](const OpInputs& in) { return in[0].squeeze(); }, {6}, a23},
      {"flatten from 1", {x()}, [](const OpInputs& in) { return in[0].flatten(1); }, {2, 12}, x234},
      {"flatten all", {x()}, [](const OpInputs& in) { return in[0].flatten(); }, {24}, x234},
      {"expand",
       {input({3, 1}, {0.5, -1.0, 2.0})},
       [](const OpInputs& in) {
         return in[0].expand({-1, 4});
       },
       {3, 4},
       {0.5, 0.5, 0.5, 0.5, -1, -1, -1, -1, 2, 2, 2, 2}},
      {"contiguous of transposed",
       {x()},
       [](const OpInputs& in) { return in[0].transpose(0, 2).contiguous(); },
       {4, 3, 2},
       {-2.5, 0.5, -1.5, 1.5, -0.5, 2.5, -0.75, 2.25,  0.25,  3.25, 1.25,  -1.75,
        1,    -2,  2,    -1,  3,    0,   2.75,  -0.25, -2.25, 0.75, -1.25, 1.75}},
      {"clone", {a()}, [](const OpInputs& in) { return in[0].clone(); }, {2, 3}, a23},

      // ---- Indexing ----
      {"index_select dim 0, repeated index",
       {input({4, 3}, ramp(12, 0.5, -2.5)), index_input({3}, {2, 0, 2})},
       [](const OpInputs& in) { return index_select(in[0], 0, in[1]); },
       {3, 3},
       {0.5, 1, 1.5, -2.5, -2, -1.5, 0.5, 1, 1.5}},
      {"index_select dim 2",
       {x(), index_input({2}, {3, 1})},
       [](const OpInputs& in) { return index_select(in[0], 2, in[1]); },
       {2, 3, 2},
       {2.75, -0.75, -2.25, 0.25, -1.25, 1.25, -0.25, 2.25, 0.75, 3.25, 1.75, -1.75}},
      {"gather dim 1",
       {input({3, 4}, scrambled(12, 5, 0.5, -3.0)), index_input({3, 2}, {3, 0, 1, 1, 2, 3})},
       [](const OpInputs& in) { return gather(in[0], 1, in[1]); },
       {3, 2},
       {-1.5, -3, -2.5, -2.5, -2, 0.5}},
      {"gather dim 0",
       {input({3, 4}, scrambled(12, 5, 0.5, -3.0)), index_input({2, 4}, {2, 0, 1, 2, 0, 0, 2, 1})},
       [](const OpInputs& in) { return gather(in[0], 0, in[1]); },
       {2, 4},
       {-1, -0.5, 0, 0.5, -3, -0.5, -2, 2.5}},
      {"embedding, repeated row",
       {input({4, 3}, scrambled(12, 7, 0.25, -1.5)), index_input({2, 2}, {1, 3, 1, 0})},
       [](const OpInputs& in) { return embedding(in[0], in[1]); },
       {2, 2, 3},
       {0.75, -0.5, 1.25, -0.75, 1, -0.25, 0.75, -0.5, 1.25, -1.5, 0.25, -1}},
      // Message passing: repeated sources and targets, and a target no edge reaches.
      {"gather_mul_scatter, repeated indices",
       {input({3, 2}, {0.5, -1.25, 1.5, 0.75, -2.0, 1.0}), index_input({5}, {2, 0, 2, 1, 0}),
        input({5, 2}, {1.5, -0.5, 0.25, 2.0, -1.0, 0.75, 2.5, -1.5, 0.5, 1.25}),
        index_input({5}, {1, 3, 1, 0, 1})},
       [](const OpInputs& in) { return gather_mul_scatter(in[0], in[1], in[2], in[3], 4); },
       {4, 2},
       {3.75, -1.125, -0.75, -1.3125, 0, 0, 0.125, -2.5}},
      {"gather_product, repeated indices",
       {input({3, 2}, {0.5, -1.25, 1.5, 0.75, -2.0, 1.0}), index_input({4}, {2, 0, 2, 1}),
        input({2, 2}, {1.5, -0.5, 0.25, 2.0}), index_input({4}, {1, 1, 0, 0})},
       [](const OpInputs& in) { return gather_product(in[0], in[1], in[2], in[3]); },
       {4, 2},
       {-0.5, 2.0, 0.125, -2.5, -3.0, -0.5, 2.25, -0.375}},
      // scatter_reduce: repeated positions, positions no update reaches, and for mul a
      // position with one zero update and one with two (the products stay smooth there).
      {"scatter_reduce max dim 0, repeated index",
       {input({3, 2}, {0.5, -1.0, 2.0, 0.25, -0.75, 1.5}),
        index_input({4, 2}, {0, 2, 0, 0, 1, 0, 0, 2}),
        input({4, 2}, {1.25, -2.0, 0.75, 0.5, 2.5, -0.5, -1.5, 1.75})},
       [](const OpInputs& in) {
         return scatter_reduce(in[0], 0, in[1], in[2], core::ScatterReduceOp::Max);
       },
       {3, 2},
       {1.25, 0.5, 2.5, 0.25, -0.75, 1.75}},
      {"scatter_reduce min dim 1, repeated index",
       {input({2, 3}, {0.5, -1.0, 2.0, 0.25, -0.75, 1.5}),
        index_input({2, 4}, {0, 1, 0, 0, 2, 2, 1, 0}),
        input({2, 4}, {1.25, -2.0, 0.75, -1.25, 2.5, -0.5, -1.5, 1.75})},
       [](const OpInputs& in) {
         return scatter_reduce(in[0], 1, in[1], in[2], core::ScatterReduceOp::Min);
       },
       {2, 3},
       {-1.25, -2.0, 2.0, 0.25, -1.5, -0.5}},
      {"scatter_reduce mul dim 0, zero updates",
       {input({3, 2}, {0.5, -1.5, 2.0, 0.75, -1.25, 1.5}),
        index_input({5, 2}, {0, 1, 0, 1, 1, 1, 0, 2, 2, 1}),
        input({5, 2}, {1.5, 0.0, -0.5, 2.0, 0.0, 0.0, 1.25, -0.75, 0.5, 1.75})},
       [](const OpInputs& in) {
         return scatter_reduce(in[0], 0, in[1], in[2], core::ScatterReduceOp::Mul);
       },
       {3, 2},
       {-0.46875, -1.5, 0.0, 0.0, -0.625, -1.125}},
      {"scatter_reduce mul dim 1",
       {input({2, 3}, {0.5, -1.5, 2.0, 0.75, -1.25, 1.5}),
        index_input({2, 4}, {0, 2, 0, 0, 1, 1, 2, 1}),
        input({2, 4}, {1.5, -0.5, 2.0, 1.25, -0.75, 0.5, 1.75, -1.25})},
       [](const OpInputs& in) {
         return scatter_reduce(in[0], 1, in[1], in[2], core::ScatterReduceOp::Mul);
       },
       {2, 3},
       {1.875, -1.5, -1.0, 0.75, -0.5859375, 2.625}},
      {"one_hot",
       {index_input({3}, {2, 0, 1})},
       [](const OpInputs& in) { return one_hot(in[0], 3); },
       {3, 3},
       {0, 0, 1, 1, 0, 0, 0, 1, 0},
       false,
       kInt64},

      // ---- Joins ----
      {"cat dim 0",
       {a(), input({1, 3}, {9.0, -8.0, 7.0})},
       [](const OpInputs& in) {
         return cat({in[0], in[1]}, 0);
       },
       {3, 3},
       {0.5, -1.2, 2, 1.5, -0.3, 0.8, 9, -8, 7}},
      {"cat dim 1",
       {input({2, 2}, {1, 2, 3, 4}), a()},
       [](const OpInputs& in) {
         return cat({in[0], in[1]}, 1);
       },
       {2, 5},
       {1, 2, 0.5, -1.2, 2, 3, 4, 1.5, -0.3, 0.8}},
      {"cat dim -1 of a transposed view",
       {input({3, 2}, a23), input({2, 2}, {1, 2, 3, 4})},
       [](const OpInputs& in) {
         return cat({in[0].t(), in[1]}, -1);
       },
       {2, 5},
       {0.5, 2, -0.3, 1, 2, -1.2, 1.5, 0.8, 3, 4}},
      {"stack dim 0",
       {a(), b()},
       [](const OpInputs& in) {
         return stack({in[0], in[1]}, 0);
       },
       {2, 2, 3},
       {0.5, -1.2, 2, 1.5, -0.3, 0.8, 1.1, 0.4, -0.7, 2.2, -1.6, 0.9}},
      {"stack dim 1",
       {a(), b()},
       [](const OpInputs& in) {
         return stack({in[0], in[1]}, 1);
       },
       {2, 2, 3},
       {0.5, -1.2, 2, 1.1, 0.4, -0.7, 1.5, -0.3, 0.8, 2.2, -1.6, 0.9}},
      {"stack dim -1",
       {a(), b()},
       [](const OpInputs& in) {
         return stack({in[0], in[1]}, -1);
       },
       {2, 3, 2},
       {0.5, 1.1, -1.2, 0.4, 2, -0.7, 1.5, 2.2, -0.3, -1.6, 0.8, 0.9}},

      // ---- Softmax ----
      {"softmax dim -1",
       {input({2, 3}, s23)},
       [](const OpInputs& in) { return softmax(in[0]); },
       {2, 3},
       {0.2011873725, 0.0605964721, 0.7382161554, 0.4992034885, 0.3346261054, 0.1661704062}},
      {"softmax dim 0",
       {input({2, 3}, s23)},
       [](const OpInputs& in) { return softmax(in[0], 0); },
       {2, 3},
       {0.3775406688, 0.214165017, 0.8698915256, 0.6224593312, 0.785834983, 0.1301084744}},
      {"log_softmax dim -1",
       {input({2, 3}, s23)},
       [](const OpInputs& in) { return log_softmax(in[0]); },
       {2, 3},
       {-1.603518604, -2.803518604, -0.3035186037, -0.6947414739, -1.094741474, -1.794741474}},
      {"softmax middle dim of 3-d",
       {x()},
       [](const OpInputs& in) { return softmax(in[0], 1); },
       {2, 3, 4},
       {0.09003057317, 0.09003057317,  0.09003057317, 0.9755587549,  0.2447284711, 0.2447284711,
        0.2447284711,  0.006573263185, 0.6652409558,  0.6652409558,  0.6652409558, 0.01786798187,
        0.09003057317, 0.2676231541,   0.09003057317, 0.09003057317, 0.2447284711, 0.7274751568,
        0.2447284711,  0.2447284711,   0.6652409558,  0.00490168905, 0.6652409558, 0.6652409558}},
      {"log_softmax dim 0 of 3-d",
       {x()},
       [](const OpInputs& in) { return log_softmax(in[0], 0); },
       {2, 3, 4},
       {-3.048587352,   -3.048587352,   -0.04858735157, -0.04858735157, -3.048587352,
        -3.048587352,   -0.04858735157, -3.048587352,   -3.048587352,   -0.04858735157,
        -0.04858735157, -3.048587352,   -0.04858735157, -0.04858735157, -3.048587352,
        -3.048587352,   -0.04858735157, -0.04858735157, -3.048587352,   -0.04858735157,
        -0.04858735157, -3.048587352,   -3.048587352,   -0.04858735157}},
      {"softmax of large logits is stable",
       {input({1, 3}, {1000.0, 1001.0, 1002.0})},
       [](const OpInputs& in) { return softmax(in[0]); },
       {1, 3},
       {0.09003057317, 0.2447284711, 0.6652409558}},
  };
}

}  // namespace mpigrad::test
