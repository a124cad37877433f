#include "mpigrad/launch/train/lr_finder.h"

#include <algorithm>
#include <cmath>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/error.h"
#include "mpigrad/core/ops/elementwise.h"

namespace mpigrad::launch {

LRFinder::LRFinder(LRFinderSettings settings) : settings_(settings) {
  MPIGRAD_CHECK(settings.start_lr > 0 && std::isfinite(settings.start_lr),
                "lr-find: --start "
                "must be a positive number, got ",
                settings.start_lr);
  MPIGRAD_CHECK(settings.end_lr > settings.start_lr && std::isfinite(settings.end_lr),
                "lr-find: --end (", settings.end_lr, ") must be above --start (", settings.start_lr,
                ")");
  MPIGRAD_CHECK(settings.steps >= 2, "lr-find: --steps must be at least 2, got ", settings.steps);
  MPIGRAD_CHECK(settings.beta >= 0 && settings.beta < 1,
                "lr-find: smoothing beta must be in "
                "[0, 1), got ",
                settings.beta);
  MPIGRAD_CHECK(settings.divergence > 1, "lr-find: the divergence factor must be above 1, got ",
                settings.divergence);
}

double LRFinder::lr(int64_t step) const {
  const double fraction = double(std::min(step, settings_.steps - 1)) / double(settings_.steps - 1);
  return settings_.start_lr * std::pow(settings_.end_lr / settings_.start_lr, fraction);
}

bool LRFinder::record(double loss) {
  const int64_t step = int64_t(points_.size());
  average_ = settings_.beta * average_ + (1 - settings_.beta) * loss;
  const double smoothed = average_ / (1 - std::pow(settings_.beta, double(step + 1)));
  points_.push_back({lr(step), loss, smoothed});
  if (!std::isfinite(smoothed)) {
    diverged_ = true;
    return false;
  }
  if (step == 0 || smoothed < best_) best_ = smoothed;
  if (smoothed > settings_.divergence * best_) {
    diverged_ = true;
    return false;
  }
  return true;
}

LRSuggestion suggest_lr(const std::vector<LRFinderPoint>& all) {
  std::vector<LRFinderPoint> points;
  for (const LRFinderPoint& point : all) {
    if (std::isfinite(point.smoothed_loss)) points.push_back(point);
  }
  LRSuggestion suggestion;
  const int64_t n = int64_t(points.size());
  if (n < 3) return suggestion;
  const int64_t skip_start = n > 20 ? 10 : 0, skip_end = n > 20 ? 5 : 0;
  const int64_t first = skip_start, last = n - 1 - skip_end;
  for (int64_t i = first; i <= last; ++i) {
    // The slope against ln(lr) within the kept window, as numpy.gradient takes it.
    const int64_t lo = i == first ? i : i - 1, hi = i == last ? i : i + 1;
    const double slope = (points[size_t(hi)].smoothed_loss - points[size_t(lo)].smoothed_loss) /
                         (std::log(points[size_t(hi)].lr) - std::log(points[size_t(lo)].lr));
    if (!suggestion.found || slope < suggestion.slope) {
      suggestion.found = true;
      suggestion.index = i;
      suggestion.lr = points[size_t(i)].lr;
      suggestion.slope = slope;
    }
  }
  return suggestion;
}

}  // namespace mpigrad::launch
