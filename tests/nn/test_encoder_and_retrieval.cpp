// Two-stage models (nn/encoder_with_head.h, the encoders of nn/models.h) and the retrieval
// metrics (nn/retrieval_metrics.h) on hand-made embeddings with known answers.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "gradcheck.h"
#include "mpigrad/core/autograd.h"
#include "mpigrad/core/error.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/nn/encoder_with_head.h"
#include "mpigrad/nn/models.h"
#include "mpigrad/nn/retrieval_metrics.h"

using namespace mpigrad;  // NOLINT
using core::Tensor;
using mpigrad::test::fd_input;
using mpigrad::test::gradient_mismatch;

namespace {
Tensor embeddings(const std::vector<float>& values, int64_t d) {
  return Tensor::from_vector<float>(values, {int64_t(values.size()) / d, d});
}
Tensor labels(const std::vector<int64_t>& values) {
  return Tensor::from_vector<int64_t>(values, {int64_t(values.size())});
}
}  // namespace

TEST_CASE("retrieval metrics: ties, a lone query, and the mAP@R arithmetic") {
  // Axis-aligned, so every similarity is exact and ties are real ties.
  //   0 (1,0) A   1 (1,0) B   2 (0,1) A   3 (0,1) A   4 (-1,0) C
  // query 0 (A, R = 2): ranked 1(B, sim 1), then 2, 3 tie at 0 (lower index first): 2(A).
  //   precision@1 = 0; AP@R = (0/1 + 1/2) / 2 = 0.25
  // query 1 (B): its class has no other sample (R = 0): left out, as PML's lone queries
  // query 2 (A, R = 2): 3(A, sim 1), then 0, 1, 4 tie at 0: 0(A). p@1 = 1; AP@R = 1
  //   (with the higher index first the second would be 4(C) and AP@R 0.5: the tie rule shows)
  // query 3: as query 2. query 4 (C): lone.
  const Tensor e = embeddings({1, 0, 1, 0, 0, 1, 0, 1, -1, 0}, 2);
  const Tensor y = labels({0, 1, 0, 0, 2});
  const nn::RetrievalMetrics metrics = nn::retrieval_metrics(e, y);
  CHECK(metrics.queries == 3);
  CHECK(metrics.precision_at_1 == doctest::Approx(2.0 / 3.0));
  CHECK(metrics.map_at_r == doctest::Approx(0.75));
  // Normalized first: scaling a row changes nothing.
  const nn::RetrievalMetrics scaled =
      nn::retrieval_metrics(embeddings({3, 0, 0.5f, 0, 0, 2, 0, 7, -4, 0}, 2), y);
  CHECK(scaled.precision_at_1 == doctest::Approx(metrics.precision_at_1));
  CHECK(scaled.map_at_r == doctest::Approx(metrics.map_at_r));
  // Query ranges add up (how ranks split the work).
  nn::RetrievalSums first = nn::retrieval_sums(e, y, 0, 2), rest = nn::retrieval_sums(e, y, 2, 5);
  CHECK(first.queries + rest.queries == 3);
  CHECK(first.average_precision_at_r + rest.average_precision_at_r == doctest::Approx(2.25));
}

TEST_CASE("retrieval metrics: mAP@R rewards the order within the R nearest") {
  // Query 0 of class A (R = 2) on a line of angles: neighbours at 10 (B), 20 (A), 30 (A) degrees.
  // Ranked: B, A -> AP@R = (0 + 1/2) / 2 = 0.25 for query 0; precision@1 = 0.
  auto at = [](double degrees) {
    const double r = degrees * 3.14159265358979 / 180;
    return std::vector<float>{float(std::cos(r)), float(std::sin(r))};
  };
  std::vector<float> values;
  for (double a : {0.0, 10.0, 20.0, 30.0}) {
    std::vector<float> v = at(a);
    values.insert(values.end(), v.begin(), v.end());
  }
  const Tensor e = embeddings(values, 2);
  const Tensor y = labels({0, 1, 0, 0});
  const nn::RetrievalSums query0 = nn::retrieval_sums(e, y, 0, 1);
  CHECK(query0.queries == 1);
  CHECK(query0.precision_at_1 == 0.0);
  CHECK(query0.average_precision_at_r == doctest::Approx(0.25));
  // Query 3 (30 deg, A, R = 2): 20 (A), then 10 (B) -> precision@1 = 1, AP@R = (1/1 + 0) / 2.
  const nn::RetrievalSums query3 = nn::retrieval_sums(e, y, 3, 4);
  CHECK(query3.precision_at_1 == 1.0);
  CHECK(query3.average_precision_at_r == doctest::Approx(0.5));
  // Perfect clusters: both metrics are 1. Only lone queries: nothing counted, both 0.
  const nn::RetrievalMetrics perfect =
      nn::retrieval_metrics(embeddings({1, 0, 1, 0.1f, 0, 1, 0.1f, 1}, 2), labels({4, 4, 9, 9}));
  CHECK(perfect.precision_at_1 == 1.0);
  CHECK(perfect.map_at_r == 1.0);
  const nn::RetrievalMetrics lone =
      nn::retrieval_metrics(embeddings({1, 0, 0, 1}, 2), labels({0, 1}));
  CHECK(lone.queries == 0);
  CHECK(lone.precision_at_1 == 0.0);
  CHECK(lone.map_at_r == 0.0);
  CHECK_THROWS_AS(nn::retrieval_metrics(embeddings({1, 0, 0, 1}, 2), labels({0})), core::Error);
}

TEST_CASE("l2_normalize: unit rows and finite-difference gradients") {
  Tensor x = fd_input({3, 4}, 7);
  const std::string mismatch = gradient_mismatch({x}, [&] { return nn::l2_normalize(x); });
  CHECK_MESSAGE(mismatch.empty(), mismatch);
  core::NoGradGuard no_grad;
  const std::vector<double> norms =
      core::sum(nn::l2_normalize(x) * nn::l2_normalize(x), {1}).to_vector<double>();
  for (double n : norms) CHECK(n == doctest::Approx(1.0));
}

TEST_CASE("encoders: a classifier is its encoder plus one Linear, drawn in the same order") {
  core::Generator a(4), b(4);
  auto cnn = nn::make_cnn({1, 8, 8}, {4}, {6}, 3, 0.0, a);
  nn::Encoder encoder = nn::make_cnn_encoder({1, 8, 8}, {4}, {6}, 0.0, b);
  CHECK(encoder.features == 6);
  const auto whole = cnn->state_dict().tensors();
  const auto part = encoder.module->state_dict().tensors();
  REQUIRE(whole.size() == part.size() + 2);  // + the last Linear's weight and bias
  for (size_t i = 0; i < part.size(); ++i) {
    CHECK(whole[i].first == part[i].first);
    CHECK(whole[i].second.to_vector<float>() == part[i].second.to_vector<float>());
  }
  core::Generator c(1);
  CHECK(nn::make_mlp_encoder({2, 3}, {}, 0.0, c).features == 6);  // no hidden: the flat input
}

TEST_CASE("EncoderWithHead: names, normalized projections, a frozen encoder") {
  core::Generator generator(2);
  nn::Encoder encoder = nn::make_cnn_encoder({1, 8, 8}, {4}, {}, 0.0, generator);
  auto head = nn::make_head(nn::HeadKind::Mlp, encoder.features, 5, generator);
  nn::EncoderWithHead supcon(encoder.module, encoder.features, head, {.normalize_output = true});
  CHECK(supcon.state_dict().contains("encoder.0.weight"));
  CHECK(supcon.state_dict().contains("head.2.weight"));  // Linear, ReLU, Linear
  core::Generator draws(3);
  const Tensor x = core::randn({6, 1, 8, 8}, draws);
  Tensor projections = supcon(x);
  CHECK(projections.shape() == core::Shape({6, 5}));
  core::NoGradGuard no_grad_check;
  for (double n : core::sum(projections * projections, {1}).to_vector<double>()) {
    CHECK(n == doctest::Approx(1.0).epsilon(1e-5));
  }
}

TEST_CASE("EncoderWithHead: a frozen encoder gets no gradient and keeps its BatchNorm statistics") {
  core::Generator generator(2);
  nn::Encoder encoder = nn::make_cnn_encoder({1, 8, 8}, {4}, {}, 0.0, generator);
  auto head = nn::make_head(nn::HeadKind::Linear, encoder.features, 3, generator);
  nn::EncoderWithHead model(encoder.module, encoder.features, head, {.freeze_encoder = true});
  CHECK(model.num_parameters(/*trainable_only=*/true) == head->num_parameters());
  const std::vector<float> running_mean =
      model.state_dict().at("encoder.1.running_mean").to_vector<float>();
  model.train();  // what the training loop does every epoch
  core::Generator draws(3);
  Tensor out = model(core::randn({6, 1, 8, 8}, draws));
  core::sum(out * out).backward();
  for (const auto& [name, parameter] : model.encoder().named_parameters()) {
    CAPTURE(name);
    CHECK_FALSE(parameter.requires_grad());
    CHECK_FALSE(parameter.grad().defined());
  }
  for (const auto& [name, parameter] : model.head().named_parameters()) {
    CAPTURE(name);
    CHECK(parameter.grad().defined());
  }
  CHECK(model.state_dict().at("encoder.1.running_mean").to_vector<float>() == running_mean);
  CHECK_FALSE(model.encoder().is_training());
}
