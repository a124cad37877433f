// Optimizer, clipping, scheduler and weight-averaging tests: three steps against hand-computed
// values, PyTorch's closed-form schedules, and state_dict round trips.
#include <doctest/doctest.h>

#include <cmath>
#include <numbers>
#include <vector>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/nn/layers/batch_norm.h"
#include "mpigrad/nn/layers/container.h"
#include "mpigrad/nn/layers/linear.h"
#include "mpigrad/nn/optim/adam.h"
#include "mpigrad/nn/optim/clip_grad.h"
#include "mpigrad/nn/optim/lr_scheduler.h"
#include "mpigrad/nn/optim/sgd.h"
#include "mpigrad/nn/weight_averaging.h"

namespace {

using namespace mpigrad;  // NOLINT
using core::Tensor;

Tensor param(std::vector<double> values) {
  const int64_t n = int64_t(values.size());
  return Tensor::from_vector(values, {n}).set_requires_grad(true);
}

void set_grad(Tensor& p, std::vector<double> values) {
  p.set_grad(Tensor::from_vector(values, p.shape()));
}

// torch.optim.SGD's documented algorithm, one scalar at a time.
struct ScalarSgd {
  double lr, momentum, dampening, wd;
  bool nesterov;
  double buf = 0;
  int t = 0;
  double step(double p, double g) {
    double d = g + wd * p;
    if (momentum != 0) {
      buf = t == 0 ? d : momentum * buf + (1 - dampening) * d;
      d = nesterov ? d + momentum * buf : buf;
    }
    ++t;
    return p - lr * d;
  }
};

// torch.optim.Adam / AdamW's documented algorithm.
struct ScalarAdam {
  double lr, b1, b2, eps, wd;
  bool decoupled;
  double m = 0, v = 0;
  int t = 0;
  double step(double p, double g) {
    ++t;
    if (decoupled) {
      p *= 1 - lr * wd;
    } else {
      g += wd * p;
    }
    m = b1 * m + (1 - b1) * g;
    v = b2 * v + (1 - b2) * g * g;
    const double mhat = m / (1 - std::pow(b1, t)), vhat = v / (1 - std::pow(b2, t));
    return p - lr * mhat / (std::sqrt(vhat) + eps);
  }
};

const std::vector<std::vector<double>> kGrads = {{0.5, -1.0}, {0.25, 2.0}, {-0.75, 0.1}};

}  // namespace

TEST_CASE("SGD: three steps equal hand-computed values") {
  // Literal: p = 1, g = 0.5 each step, lr 0.1, momentum 0.9 -> 0.95, 0.855, 0.7195.
  Tensor p = param({1.0});
  nn::SGDOptions o;
  o.lr = 0.1;
  o.momentum = 0.9;
  nn::SGD literal({p}, o);
  const std::vector<double> expected = {0.95, 0.855, 0.7195};
  for (double e : expected) {
    set_grad(p, {0.5});
    literal.step();
    CHECK(p.item<double>() == doctest::Approx(e).epsilon(1e-14));
  }

  struct Config {
    double momentum, dampening, wd;
    bool nesterov;
  };
  for (Config c : {Config{0, 0, 0, false}, Config{0.9, 0, 0.01, false},
                   Config{0.9, 0.3, 0.0, false}, Config{0.8, 0, 0.05, true}}) {
    INFO("momentum ", c.momentum, " dampening ", c.dampening, " wd ", c.wd, " nesterov ",
         c.nesterov);
    Tensor q = param({1.0, -2.0});
    nn::SGDOptions so{0.05, c.momentum, c.dampening, c.wd, c.nesterov};
    nn::SGD sgd({q}, so);
    std::vector<ScalarSgd> ref(2, ScalarSgd{0.05, c.momentum, c.dampening, c.wd, c.nesterov});
    std::vector<double> values = {1.0, -2.0};
    for (const auto& g : kGrads) {
      set_grad(q, g);
      sgd.step();
      for (size_t i = 0; i < 2; ++i) values[i] = ref[i].step(values[i], g[i]);
      const auto got = q.to_vector<double>();
      for (size_t i = 0; i < 2; ++i) CHECK(got[i] == doctest::Approx(values[i]).epsilon(1e-14));
    }
  }
  nn::SGDOptions bad;
  bad.nesterov = true;
  CHECK_THROWS_AS(nn::SGD({param({1.0})}, bad), core::Error);
}

TEST_CASE("Adam and AdamW: three steps equal hand-computed values") {
  // Literal AdamW: constant g makes each Adam step ~lr; decay multiplies by 1 - lr*wd first.
  Tensor p = param({1.0});
  nn::AdamOptions o;
  o.lr = 0.1;
  o.weight_decay = 0.1;
  nn::AdamW adamw({p}, o);
  for (double e : {0.89, 0.7811, 0.673289}) {
    set_grad(p, {0.5});
    adamw.step();
    CHECK(p.item<double>() == doctest::Approx(e).epsilon(1e-7));
  }
  for (bool decoupled : {false, true}) {
    INFO("decoupled weight decay: ", decoupled);
    Tensor q = param({1.0, -2.0});
    nn::AdamOptions ao{0.01, 0.8, 0.95, 1e-8, 0.05};
    nn::Adam adam({nn::ParamGroupSpec{{q}, {}, {}, {}}}, ao, decoupled);
    std::vector<ScalarAdam> ref(2, ScalarAdam{0.01, 0.8, 0.95, 1e-8, 0.05, decoupled});
    std::vector<double> values = {1.0, -2.0};
    for (const auto& g : kGrads) {
      set_grad(q, g);
      adam.step();
      for (size_t i = 0; i < 2; ++i) values[i] = ref[i].step(values[i], g[i]);
      const auto got = q.to_vector<double>();
      for (size_t i = 0; i < 2; ++i) CHECK(got[i] == doctest::Approx(values[i]).epsilon(1e-12));
    }
  }
}

TEST_CASE("parameter groups, skipped parameters and optimizer state_dict round trip") {
  Tensor a = param({1.0, 2.0}), b = param({3.0}), unused = param({5.0});
  nn::SGDOptions o;
  o.lr = 0.1;
  o.momentum = 0.5;
  nn::SGD sgd({nn::ParamGroupSpec{{a}, {}, {}, {}}, nn::ParamGroupSpec{{b, unused}, 1.0, 0.5, {}}},
              o);
  CHECK(sgd.param_groups()[1].lr == 1.0);
  set_grad(a, {1.0, 1.0});
  set_grad(b, {1.0});
  sgd.step();
  CHECK(a.to_vector<double>() == std::vector<double>{0.9, 1.9});
  CHECK(b.item<double>() == doctest::Approx(3.0 - 1.0 * (1.0 + 0.5 * 3.0)));
  CHECK(unused.item<double>() == 5.0);  // no gradient, no update

  const nn::StateDict state = sgd.state_dict();
  CHECK(state.contains("state/0/momentum_buffer"));
  CHECK(state.scalar("param_groups/1/lr") == 1.0);
  // A fresh optimizer loading the state continues exactly like the original.
  Tensor a2 = param({0.9, 1.9}), b2 = param({b.item<double>()}), unused2 = param({5.0});
  nn::SGD resumed(
      {nn::ParamGroupSpec{{a2}, {}, {}, {}}, nn::ParamGroupSpec{{b2, unused2}, 7.0, 0.0, {}}}, o);
  resumed.load_state_dict(state);
  CHECK(resumed.param_groups()[1].lr == 1.0);
  for (auto* t : {&a, &a2}) set_grad(*t, {0.5, -0.5});
  for (auto* t : {&b, &b2}) set_grad(*t, {0.25});
  sgd.step();
  resumed.step();
  CHECK(a2.to_vector<double>() == a.to_vector<double>());
  CHECK(b2.to_vector<double>() == b.to_vector<double>());

  nn::SGD one_group({param({1.0})}, o);
  CHECK_THROWS_WITH_AS(one_group.load_state_dict(state), doctest::Contains("more parameter groups"),
                       core::Error);
  nn::StateDict bad = state;
  bad.set("state/0/momentum_buffer", core::zeros({3}, core::kFloat64));
  CHECK_THROWS_WITH_AS(resumed.load_state_dict(bad),
                       doctest::Contains("size mismatch for 'state/0/momentum_buffer'"),
                       core::Error);
}

TEST_CASE("a step batches parameters by dtype; zero_grad clears every group") {
  // Two dtypes make two backend calls, each with its own group's hyperparameters.
  Tensor narrow = param({1.0, -2.0}).to(core::kFloat32).detach().set_requires_grad(true);
  Tensor wide = param({0.5}), idle = param({4.0});
  nn::AdamOptions o{0.01, 0.8, 0.95, 1e-8, 0.0};
  nn::Adam adam(
      {nn::ParamGroupSpec{{narrow}, {}, {}, {}}, nn::ParamGroupSpec{{wide, idle}, 0.1, {}, {}}}, o);
  std::vector<ScalarAdam> ref = {ScalarAdam{0.01, 0.8, 0.95, 1e-8, 0.0, false},
                                 ScalarAdam{0.01, 0.8, 0.95, 1e-8, 0.0, false},
                                 ScalarAdam{0.1, 0.8, 0.95, 1e-8, 0.0, false}};
  std::vector<double> values = {1.0, -2.0, 0.5};
  for (const auto& g : kGrads) {
    narrow.set_grad(Tensor::from_vector(g, {2}, core::kFloat32));
    wide.set_grad(Tensor::from_vector(std::vector<double>{g[0]}, {1}));
    adam.step();
    values[0] = ref[0].step(values[0], double(float(g[0])));
    values[1] = ref[1].step(values[1], double(float(g[1])));
    values[2] = ref[2].step(values[2], g[0]);
  }
  const auto got_narrow = narrow.to_vector<double>();
  CHECK(got_narrow[0] == doctest::Approx(values[0]).epsilon(1e-6));
  CHECK(got_narrow[1] == doctest::Approx(values[1]).epsilon(1e-6));
  CHECK(wide.item<double>() == doctest::Approx(values[2]).epsilon(1e-12));
  CHECK(idle.item<double>() == 4.0);
  CHECK(adam.state_dict().scalar("state/1/step") == 3.0);
  CHECK_FALSE(adam.state_dict().contains_scalar("state/2/step"));

  // Zero-filling keeps each gradient's storage (DDP's bucket views rely on it); set_to_none
  // drops them, in every group.
  const void* kept = wide.grad().data_ptr();
  adam.zero_grad(false);
  CHECK(wide.grad().data_ptr() == kept);
  CHECK(wide.grad().item<double>() == 0.0);
  CHECK(narrow.grad().to_vector<double>() == std::vector<double>{0.0, 0.0});
  adam.zero_grad();
  CHECK_FALSE(narrow.grad().defined());
  CHECK_FALSE(wide.grad().defined());
}

TEST_CASE("clip_grad_norm_ clips to the global norm") {
  Tensor a = param({3.0, 0.0}), b = param({4.0});
  set_grad(a, {3.0, 0.0});
  set_grad(b, {4.0});
  const double total = nn::clip_grad_norm_({a, b}, 1.0);
  CHECK(total == doctest::Approx(5.0));
  CHECK(a.grad().to_vector<double>()[0] == doctest::Approx(3.0 / (5.0 + 1e-6)));
  CHECK(b.grad().item<double>() == doctest::Approx(4.0 / (5.0 + 1e-6)));
  // Under the limit: untouched. Infinity norm: the largest magnitude.
  set_grad(a, {0.1, -0.2});
  CHECK(nn::clip_grad_norm_({a}, 1.0) == doctest::Approx(std::sqrt(0.05)));
  CHECK(a.grad().to_vector<double>() == std::vector<double>{0.1, -0.2});
  CHECK(nn::clip_grad_norm_({a}, 1.0, INFINITY) == doctest::Approx(0.2));
  set_grad(a, {NAN, 1.0});
  CHECK_THROWS_WITH_AS(nn::clip_grad_norm_({a}, 1.0, 2.0, true), doctest::Contains("non-finite"),
                       core::Error);
}

TEST_CASE("schedulers follow PyTorch's formulas") {
  auto make = [](double lr) {
    nn::SGDOptions o;
    o.lr = lr;
    o.momentum = 0.9;
    return std::make_unique<nn::SGD>(std::vector<Tensor>{param({1.0})}, o);
  };
  auto sequence = [](nn::LRScheduler& s, nn::Optimizer& opt, int n) {
    std::vector<double> lrs{opt.param_groups()[0].lr};
    for (int i = 1; i < n; ++i) {
      s.step();
      lrs.push_back(opt.param_groups()[0].lr);
    }
    return lrs;
  };
  auto close = [](const std::vector<double>& a, const std::vector<double>& b) {
    REQUIRE(a.size() == b.size());
    for (size_t i = 0; i < a.size(); ++i) CHECK(a[i] == doctest::Approx(b[i]).epsilon(1e-12));
  };
  {
    auto opt = make(0.1);
    nn::StepLR s(*opt, 2, 0.5);
    close(sequence(s, *opt, 6), {0.1, 0.1, 0.05, 0.05, 0.025, 0.025});
  }
  {
    auto opt = make(0.1);
    nn::MultiStepLR s(*opt, {3, 1}, 0.1);
    close(sequence(s, *opt, 5), {0.1, 0.01, 0.01, 0.001, 0.001});
  }
  {
    auto opt = make(0.1);
    nn::CosineAnnealingLR s(*opt, 4, 0.001);
    std::vector<double> expected;
    for (int e = 0; e < 5; ++e)
      expected.push_back(0.001 + 0.099 * (1 + std::cos(std::numbers::pi * e / 4)) / 2);
    close(sequence(s, *opt, 5), expected);
  }
  {
    auto opt = make(1.0);
    nn::WarmupCosineLR s(*opt, 2, 6, 0.25, 0.0);
    // LinearLR(0.25, 2): 0.25, 0.625; then cosine over 4 steps from 1.0.
    std::vector<double> expected = {0.25, 0.625};
    for (int e = 0; e <= 4; ++e) expected.push_back((1 + std::cos(std::numbers::pi * e / 4)) / 2);
    expected.push_back(0.0);  // after total_steps it stays at eta_min
    close(sequence(s, *opt, 8), expected);
  }
  {
    auto opt = make(0.5);
    nn::OneCycleOptions o;
    o.max_lr = 1.0;
    o.total_steps = 10;
    nn::OneCycleLR s(*opt, o);
    const auto lrs = sequence(s, *opt, 10);
    // Phase ends: 0.3 * 10 - 1 = 2 and 9. Warm from 0.04 to 1, anneal to 0.04 / 1e4.
    std::vector<double> expected;
    for (int e = 0; e < 10; ++e) {
      const bool up = e <= 2;
      const double pct = up ? e / 2.0 : (e - 2.0) / 7.0;
      const double start = up ? 0.04 : 1.0, end = up ? 1.0 : 4e-6;
      expected.push_back(end + (start - end) / 2 * (std::cos(std::numbers::pi * pct) + 1));
    }
    close(lrs, expected);
    CHECK(opt->param_groups()[0].momentum == doctest::Approx(0.95));
    CHECK_THROWS_WITH_AS(s.step(), doctest::Contains("more than total_steps"), core::Error);
  }
  {
    auto opt = make(1.0);
    nn::PlateauOptions o;
    o.patience = 2;
    o.factor = 0.5;
    nn::ReduceLROnPlateau s(*opt, o);
    std::vector<double> lrs;
    for (double metric : {1.0, 1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.5}) {
      s.step(metric);
      lrs.push_back(opt->param_groups()[0].lr);
    }
    close(lrs, {1, 1, 1, 0.5, 0.5, 0.5, 0.5, 0.25});
    nn::StateDict state = s.state_dict();
    nn::ReduceLROnPlateau restored(*opt, o);
    restored.load_state_dict(state);
    CHECK(restored.num_bad_epochs() == s.num_bad_epochs());
  }
  {
    // state_dict round trip resumes the sequence.
    auto opt = make(0.1);
    nn::CosineAnnealingLR s(*opt, 10);
    for (int i = 0; i < 4; ++i) s.step();
    const nn::StateDict state = s.state_dict();
    auto opt2 = make(0.1);
    nn::CosineAnnealingLR s2(*opt2, 10);
    s2.load_state_dict(state);
    CHECK(s2.last_epoch() == 4);
    s.step();
    s2.step();
    CHECK(opt2->param_groups()[0].lr == opt->param_groups()[0].lr);
  }
}

TEST_CASE("LinearLR and PolynomialLR follow PyTorch's formulas, and restore from a state dict") {
  nn::SGDOptions options;
  options.lr = 0.1;
  nn::SGD linear_opt(std::vector<Tensor>{param({1.0})}, options);
  nn::SGD polynomial_opt(std::vector<Tensor>{param({1.0})}, options);
  nn::LinearLR linear(linear_opt, 1.0 / 3.0, 1.0, 4);  // torch's defaults, total_iters 4
  nn::PolynomialLR polynomial(polynomial_opt, 4, 2.0);
  const double third = 0.1 / 3.0;
  const std::vector<double> linear_lrs = {
      third, third + 0.1 / 6.0, third + 0.2 / 6.0, third + 0.3 / 6.0, 0.1, 0.1};
  const std::vector<double> polynomial_lrs = {0.1, 0.05625, 0.025, 0.00625, 0.0, 0.0};
  for (size_t e = 0; e < linear_lrs.size(); ++e) {
    CHECK(linear_opt.param_groups()[0].lr == doctest::Approx(linear_lrs[e]).epsilon(1e-12));
    CHECK(polynomial_opt.param_groups()[0].lr == doctest::Approx(polynomial_lrs[e]).epsilon(1e-12));
    linear.step();
    polynomial.step();
  }
  nn::SGD restored_opt(std::vector<Tensor>{param({1.0})}, options);
  nn::LinearLR restored(restored_opt, 1.0 / 3.0, 1.0, 4);
  restored.load_state_dict(linear.state_dict());
  CHECK(restored.last_epoch() == linear.last_epoch());
  CHECK(restored_opt.param_groups()[0].lr == linear_opt.param_groups()[0].lr);
  CHECK_THROWS_AS(nn::PolynomialLR(polynomial_opt, 0), core::Error);
  CHECK_THROWS_AS(nn::LinearLR(linear_opt, 1.0, 0.0, 0), core::Error);
}

TEST_CASE("EMA, SWA running average, checkpoint averaging and update_bn") {
  core::Generator g(1);
  nn::Linear model(2, 1, g);
  model.to(core::kFloat64);
  {
    core::NoGradGuard no_grad;
    model.weight().fill_(1.0);
    model.bias().fill_(0.0);
  }
  nn::ModelEMA ema(model, 0.5);
  {
    core::NoGradGuard no_grad;
    model.weight().fill_(3.0);
  }
  ema.update(model);  // 0.5 * 1 + 0.5 * 3
  CHECK(ema.shadow().at("weight").to_vector<double>() == std::vector<double>{2.0, 2.0});
  ema.update(model);
  CHECK(ema.shadow().at("weight").to_vector<double>() == std::vector<double>{2.5, 2.5});
  nn::Linear copy(2, 1, g);
  copy.to(core::kFloat64);
  ema.copy_to(copy);
  CHECK(copy.weight().to_vector<double>() == std::vector<double>{2.5, 2.5});
  nn::ModelEMA restored(model, 0.5);
  restored.load_state_dict(ema.state_dict());
  CHECK(restored.num_updates() == 2);

  nn::SWAAverager swa;
  nn::StateDict first, second;
  for (double w : {1.0, 2.0, 6.0}) {
    {
      core::NoGradGuard no_grad;
      model.weight().fill_(w);
    }
    swa.update(model);
    if (w == 2.0) first = copy.state_dict(), first.set("weight", model.weight().detach().clone());
  }
  CHECK(swa.count() == 3);
  CHECK(swa.average().at("weight").to_vector<double>() == std::vector<double>{3.0, 3.0});
  nn::StateDict s1, s2;
  s1.set("w", Tensor::from_vector<double>({1, 2}, {2}));
  s2.set("w", Tensor::from_vector<double>({3, 6}, {2}));
  CHECK(nn::average_state_dicts({s1, s2}).at("w").to_vector<double>() == std::vector<double>{2, 4});

  // update_bn: the running statistics become the exact statistics of all batches together.
  auto bn = std::make_shared<nn::BatchNorm1d>(1);
  nn::Sequential net{bn};
  net.to(core::kFloat64);
  net.eval();
  std::vector<Tensor> batches = {Tensor::from_vector<double>({1, 3}, {2, 1}),
                                 Tensor::from_vector<double>({5, 7}, {2, 1})};
  size_t next = 0;
  nn::update_bn(net, [&]() { return next < batches.size() ? batches[next++] : Tensor(); });
  CHECK(bn->buffer("running_mean").item<double>() == doctest::Approx(4.0));
  CHECK(bn->momentum().has_value());
  CHECK_FALSE(bn->is_training());  // mode restored
}
