// The LR range test's bookkeeping (launch/train/lr_finder.h): the geometric lr sweep, the
// bias-corrected smoothing, the early stop at 4x the minimum and the steepest-descent rule.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "mpigrad/core/error.h"
#include "mpigrad/launch/train/lr_finder.h"

using namespace mpigrad;
using launch::LRFinder;
using launch::LRFinderPoint;
using launch::LRFinderSettings;

TEST_CASE("LRFinder: geometric lrs from start to end") {
  LRFinder finder({.start_lr = 1e-4, .end_lr = 1.0, .steps = 5});
  CHECK(finder.lr(0) == doctest::Approx(1e-4));
  CHECK(finder.lr(1) == doctest::Approx(1e-3));
  CHECK(finder.lr(2) == doctest::Approx(1e-2));
  CHECK(finder.lr(4) == doctest::Approx(1.0));
  CHECK(finder.lr(9) == doctest::Approx(1.0));  // past the end: held at end_lr
}

TEST_CASE("LRFinder: the smoothed loss is the bias-corrected EMA, and 4x its minimum stops") {
  LRFinder finder({.start_lr = 1e-3, .end_lr = 1.0, .steps = 100});
  CHECK(finder.record(2.0));
  CHECK(finder.points()[0].smoothed_loss == doctest::Approx(2.0));  // bias correction: no pull to 0
  CHECK(finder.record(1.0));
  // avg = 0.98 * 0.04 + 0.02 * 1 = 0.0592; / (1 - 0.98^2) = 0.0396
  CHECK(finder.points()[1].smoothed_loss == doctest::Approx(0.0592 / 0.0396));
  bool going = true;
  int steps = 2;
  while (going && steps < 100) {
    going = finder.record(100.0);
    ++steps;
  }
  CHECK(finder.diverged());
  CHECK(steps < 10);  // 100 pushes the smoothed loss past 4 x 1.49 within a few steps
  const LRFinderPoint& last = finder.points().back();
  double best = 1e9;
  for (const auto& p : finder.points()) best = std::min(best, p.smoothed_loss);
  CHECK(last.smoothed_loss > 4 * best);

  LRFinder nan({.start_lr = 1e-3, .end_lr = 1.0, .steps = 10});
  CHECK(nan.record(1.0));
  CHECK_FALSE(nan.record(std::nan("")));
  CHECK(nan.diverged());
}

TEST_CASE("suggest_lr: the steepest descent of the smoothed loss against log(lr)") {
  // A sigmoid-shaped fall centred on lr = 1e-2 (index 50 of 101 points from 1e-5 to 10).
  std::vector<LRFinderPoint> points;
  for (int i = 0; i <= 100; ++i) {
    const double lr = 1e-5 * std::pow(1e6, i / 100.0);
    const double loss = 2.0 - 1.5 / (1.0 + std::exp(-(std::log10(lr) + 2.0) * 4.0));
    points.push_back({lr, loss, loss});
  }
  launch::LRSuggestion suggestion = launch::suggest_lr(points);
  REQUIRE(suggestion.found);
  CHECK(suggestion.index == 50);
  CHECK(suggestion.lr == doctest::Approx(1e-2));
  CHECK(suggestion.slope < 0);
  // The first 10 and last 5 points are left out: a cliff there does not count.
  points[2].smoothed_loss = -50;
  points[98].smoothed_loss = -50;
  CHECK(launch::suggest_lr(points).index == 50);
  CHECK_FALSE(launch::suggest_lr({points[0], points[1]}).found);
}

TEST_CASE("LRFinder: bad ranges are errors naming the flag") {
  CHECK_THROWS_WITH_AS(LRFinder({.start_lr = 0}), doctest::Contains("--start"), core::Error);
  CHECK_THROWS_WITH_AS(LRFinder({.start_lr = 1, .end_lr = 0.5}), doctest::Contains("--end"),
                       core::Error);
  CHECK_THROWS_WITH_AS(LRFinder({.steps = 1}), doctest::Contains("--steps"), core::Error);
}
