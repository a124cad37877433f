// Loss tests: values against hand-computed numbers or a naive loop reference, float64
// finite-difference gradient checks, and the errors for bad labels.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "gradcheck.h"
#include "mpigrad/core/ops/elementwise.h"
#include "mpigrad/core/ops/reduce.h"
#include "mpigrad/nn/loss.h"
#include "mpigrad/nn/supcon_loss.h"

namespace {

using namespace mpigrad;  // NOLINT
using core::Tensor;
using mpigrad::test::fd_input;
using mpigrad::test::gradient_mismatch;

// -log softmax(row)[label]
double row_nll(const std::vector<double>& row, size_t label) {
  double m = row[0];
  for (double v : row) m = std::max(m, v);
  double s = 0;
  for (double v : row) s += std::exp(v - m);
  return -(row[label] - m - std::log(s));
}

// The reference SupCon (HobbitLong/SupContrast losses.py) written as plain loops.
double naive_supcon(const std::vector<double>& f, int64_t batch, int64_t views, int64_t dim,
                    const std::vector<int64_t>& labels, bool all, double t, double bt) {
  auto feature = [&](int64_t row) {  // contrast row = view * batch + sample
    const int64_t view = row / batch, sample = row % batch;
    return &f[size_t((sample * views + view) * dim)];
  };
  const int64_t contrasts = views * batch, anchors = all ? contrasts : batch;
  double total = 0;
  for (int64_t i = 0; i < anchors; ++i) {
    std::vector<double> logits(static_cast<size_t>(contrasts));
    double mx = -1e300;
    for (int64_t j = 0; j < contrasts; ++j) {
      double dot = 0;
      for (int64_t d = 0; d < dim; ++d) dot += feature(i)[d] * feature(j)[d];
      logits[size_t(j)] = dot / t;
      mx = std::max(mx, logits[size_t(j)]);
    }
    double denom = 0;
    for (int64_t j = 0; j < contrasts; ++j) {
      if (j != i) denom += std::exp(logits[size_t(j)] - mx);
    }
    double pos_sum = 0, pos_count = 0;
    for (int64_t j = 0; j < contrasts; ++j) {
      if (j == i) continue;
      const bool positive = labels.empty() ? (i % batch) == (j % batch)
                                           : labels[size_t(i % batch)] == labels[size_t(j % batch)];
      if (!positive) continue;
      pos_sum += logits[size_t(j)] - mx - std::log(denom);
      pos_count += 1;
    }
    if (pos_count < 1e-6) pos_count = 1;
    total += -(t / bt) * pos_sum / pos_count;
  }
  return total / double(anchors);
}

}  // namespace

TEST_CASE("cross_entropy: values with smoothing, ignore_index and reductions") {
  const std::vector<double> logits = {1.0, 2.0, 0.5, -1.0, 0.3, 0.3, 2.0, -0.5, 1.5};
  Tensor x = Tensor::from_vector(logits, {3, 3});
  Tensor labels = Tensor::from_vector<int64_t>({1, 0, 2}, {3});
  const double l0 = row_nll({1.0, 2.0, 0.5}, 1), l1 = row_nll({-1.0, 0.3, 0.3}, 0),
               l2 = row_nll({2.0, -0.5, 1.5}, 2);
  CHECK(nn::cross_entropy(x, labels).item<double>() == doctest::Approx((l0 + l1 + l2) / 3));
  nn::CrossEntropyOptions sum;
  sum.reduction = nn::Reduction::Sum;
  CHECK(nn::cross_entropy(x, labels, sum).item<double>() == doctest::Approx(l0 + l1 + l2));

  // ignore_index drops the row from both the sum and the mean's count.
  nn::CrossEntropyOptions ignore;
  ignore.ignore_index = 0;
  Tensor with_ignored = Tensor::from_vector<int64_t>({1, 0, 2}, {3});
  CHECK(nn::cross_entropy(x, with_ignored, ignore).item<double>() ==
        doctest::Approx((l0 + l2) / 2));

  // Label smoothing eps: (1 - eps) * nll + eps * mean over classes of -log p.
  nn::CrossEntropyOptions smooth;
  smooth.label_smoothing = 0.2;
  double expected = 0;
  for (int r = 0; r < 3; ++r) {
    std::vector<double> row(logits.begin() + r * 3, logits.begin() + r * 3 + 3);
    double uniform = 0;
    for (size_t c = 0; c < 3; ++c) uniform += row_nll(row, c) / 3;
    expected += 0.8 * row_nll(row, size_t(labels.to_vector<int64_t>()[size_t(r)])) + 0.2 * uniform;
  }
  CHECK(nn::cross_entropy(x, labels, smooth).item<double>() == doctest::Approx(expected / 3));

  nn::CrossEntropyOptions none;
  none.reduction = nn::Reduction::None;
  const auto per_row = nn::cross_entropy(x, labels, none).to_vector<double>();
  CHECK(per_row[1] == doctest::Approx(l1));
}

TEST_CASE("cross_entropy: an out-of-range label names the value and num_classes") {
  Tensor x = core::zeros({2, 4}, core::kFloat32);
  CHECK_THROWS_WITH_AS(
      nn::cross_entropy(x, Tensor::from_vector<int64_t>({1, 7}, {2})),
      doctest::Contains("label 7 at position 1 is out of range for num_classes = 4"), core::Error);
  CHECK_THROWS_WITH_AS(nn::cross_entropy(x, Tensor::from_vector<int64_t>({-1, 0}, {2})),
                       doctest::Contains("label -1"), core::Error);
  CHECK_THROWS_AS(nn::cross_entropy(x, Tensor::from_vector<int64_t>({1, 0, 2}, {3})), core::Error);
  // The error names the labels when the caller says what they are, with and without smoothing.
  nn::CrossEntropyOptions named;
  named.labels_name = "label field 'y'";
  CHECK_THROWS_WITH_AS(nn::cross_entropy(x, Tensor::from_vector<int64_t>({1, 9}, {2}), named),
                       doctest::Contains("label 9 at position 1 of label field 'y' is out of "
                                         "range for num_classes = 4"),
                       core::Error);
  named.label_smoothing = 0.1;
  CHECK_THROWS_WITH_AS(nn::cross_entropy(x, Tensor::from_vector<int64_t>({5, 0}, {2}), named),
                       doctest::Contains("label 5 at position 0 of label field 'y'"), core::Error);
}

TEST_CASE("losses: gradients match finite differences") {
  Tensor x = fd_input({4, 5}, 3, -2, 2);
  Tensor labels = Tensor::from_vector<int64_t>({4, 0, -100, 2}, {4});
  for (double eps : {0.0, 0.1}) {
    for (auto reduction : {nn::Reduction::Mean, nn::Reduction::Sum, nn::Reduction::None}) {
      nn::CrossEntropyOptions o;
      o.label_smoothing = eps;
      o.reduction = reduction;
      INFO("smoothing ", eps, " reduction ", int(reduction));
      const std::string mismatch =
          gradient_mismatch({x}, [&] { return nn::cross_entropy(x, labels, o); });
      CHECK_MESSAGE(mismatch.empty(), mismatch);
    }
  }
  // [N, C, d] logits.
  Tensor x3 = fd_input({2, 3, 2}, 4);
  Tensor labels3 = Tensor::from_vector<int64_t>({0, 2, 1, 1}, {2, 2});
  std::string mismatch = gradient_mismatch({x3}, [&] { return nn::cross_entropy(x3, labels3); });
  CHECK_MESSAGE(mismatch.empty(), mismatch);
  // Agrees with the 2-d form on the same rows.
  const double as3d = nn::cross_entropy(x3, labels3).item<double>();
  Tensor rows = x3.permute({0, 2, 1}).reshape({4, 3});
  CHECK(as3d == doctest::Approx(nn::cross_entropy(rows, labels3.reshape({4})).item<double>()));

  Tensor a = fd_input({3, 2}, 5), b = fd_input({3, 2}, 6);
  mismatch = gradient_mismatch({a, b}, [&] { return nn::mse_loss(a, b); });
  CHECK_MESSAGE(mismatch.empty(), mismatch);
  CHECK(nn::mse_loss(Tensor::from_vector<double>({1, 2}, {2}),
                     Tensor::from_vector<double>({0, 4}, {2}))
            .item<double>() == doctest::Approx(2.5));
  mismatch = gradient_mismatch({a, b}, [&] { return nn::l1_loss(a, b, nn::Reduction::None); });
  CHECK_MESSAGE(mismatch.empty(), mismatch);
  CHECK(nn::l1_loss(Tensor::from_vector<double>({1, 2}, {2}),
                    Tensor::from_vector<double>({0, 4}, {2}))
            .item<double>() == doctest::Approx(1.5));
  CHECK(nn::l1_loss(Tensor::from_vector<double>({1, 2}, {2}),
                    Tensor::from_vector<double>({0, 4}, {2}), nn::Reduction::Sum)
            .item<double>() == doctest::Approx(3.0));

  Tensor logits = fd_input({3, 2}, 7, -3, 3);
  Tensor target = fd_input({3, 2}, 8, 0, 1);
  Tensor pos_weight = Tensor::from_vector<double>({2.0, 0.5}, {2});
  mismatch = gradient_mismatch(
      {logits, target}, [&] { return nn::binary_cross_entropy_with_logits(logits, target); });
  CHECK_MESSAGE(mismatch.empty(), mismatch);
  mismatch = gradient_mismatch({logits}, [&] {
    return nn::binary_cross_entropy_with_logits(logits, target, nn::Reduction::Sum, pos_weight);
  });
  CHECK_MESSAGE(mismatch.empty(), mismatch);
  // -[y log s(x) + (1-y) log(1 - s(x))] at x = 0.5, y = 0.25.
  const double s = 1.0 / (1.0 + std::exp(-0.5));
  CHECK(nn::binary_cross_entropy_with_logits(Tensor::from_vector<double>({0.5}, {1}),
                                             Tensor::from_vector<double>({0.25}, {1}))
            .item<double>() == doctest::Approx(-(0.25 * std::log(s) + 0.75 * std::log(1 - s))));
  // Large logits stay finite.
  CHECK(std::isfinite(
      nn::binary_cross_entropy_with_logits(Tensor::from_vector<double>({-800, 800}, {2}),
                                           Tensor::from_vector<double>({1, 0}, {2}))
          .item<double>()));
}

TEST_CASE("SupConLoss matches the reference loops and finite differences") {
  const int64_t batch = 4, views = 2, dim = 3;
  Tensor features = fd_input({batch, views, dim}, 11);
  const std::vector<int64_t> label_values = {0, 1, 0, 2};
  Tensor labels = Tensor::from_vector(label_values, {batch});
  const auto fv = features.to_vector<double>();
  for (bool all : {true, false}) {
    nn::SupConOptions o;
    o.temperature = 0.5;
    o.base_temperature = 0.07;
    o.contrast_mode = all ? nn::SupConMode::All : nn::SupConMode::One;
    INFO("contrast_mode ", all ? "all" : "one");
    CHECK(nn::supcon_loss(features, labels, Tensor(), o).item<double>() ==
          doctest::Approx(naive_supcon(fv, batch, views, dim, label_values, all, 0.5, 0.07)));
    // Unsupervised (SimCLR): positives are the other views of the same sample.
    CHECK(nn::supcon_loss(features, Tensor(), Tensor(), o).item<double>() ==
          doctest::Approx(naive_supcon(fv, batch, views, dim, {}, all, 0.5, 0.07)));
    const std::string mismatch = gradient_mismatch(
        {features}, [&] { return nn::supcon_loss(features, labels, Tensor(), o); });
    CHECK_MESSAGE(mismatch.empty(), mismatch);
  }
  // Three views per sample.
  Tensor three = fd_input({3, 3, 2}, 12);
  const std::string mismatch = gradient_mismatch({three}, [&] {
    return nn::SupConLoss()(three, Tensor::from_vector<int64_t>({1, 1, 0}, {3}));
  });
  CHECK_MESSAGE(mismatch.empty(), mismatch);
  CHECK(nn::SupConLoss()(three, Tensor::from_vector<int64_t>({1, 1, 0}, {3})).item<double>() ==
        doctest::Approx(
            naive_supcon(three.to_vector<double>(), 3, 3, 2, {1, 1, 0}, true, 0.07, 0.07)));
}
