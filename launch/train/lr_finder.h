// The learning-rate range test (Smith 2017, as fastai's lr_find and torch-lr-finder run it):
// optimizer step i (0-based) of n runs at lr_i = start * (end / start)^(i / (n - 1)), and the
// loss of the forward pass before that step is recorded with lr_i. The record keeps a smoothed
// loss, an exponential moving average with bias correction,
//   avg_i = beta * avg_(i-1) + (1 - beta) * loss_i,   smoothed_i = avg_i / (1 - beta^(i+1)),
// with beta = 0.98, and the sweep stops early once smoothed_i exceeds 4x the smallest smoothed
// loss so far (or a loss is not finite): past that point the run has diverged.
//
// The suggestion (suggest_lr) is the lr of steepest descent of the smoothed loss against
// log(lr): the point with the most negative slope (central differences, one-sided at the
// ends), after leaving out the first 10 and the last 5 points when there are more than 20
// (torch-lr-finder's skip_start / skip_end), since the ends are dominated by the average's
// warm-up and by the divergence.
//
// LRFinderHook (launch/train/hooks/lr_finder_hook.h) drives a TrainingStrategy through the sweep.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mpigrad/core/tensor.h"

namespace mpigrad::launch {

struct LRFinderSettings {
  double start_lr = 1e-7;
  double end_lr = 10.0;
  int64_t steps = 100;
  double beta = 0.98;       // smoothing of the loss
  double divergence = 4.0;  // stop once the smoothed loss exceeds this times its minimum
};

struct LRFinderPoint {
  double lr = 0, loss = 0, smoothed_loss = 0;
};

class LRFinder {
 public:
  // core::Error unless 0 < start_lr < end_lr, steps >= 2, beta in [0, 1), divergence > 1.
  explicit LRFinder(LRFinderSettings settings);
  double lr(int64_t step) const;  // the lr of optimizer step `step` (0-based)
  // Records the loss of the next step; returns false when the sweep should stop (diverged).
  bool record(double loss);
  const std::vector<LRFinderPoint>& points() const { return points_; }
  const LRFinderSettings& settings() const { return settings_; }
  bool diverged() const { return diverged_; }

 private:
  LRFinderSettings settings_;
  std::vector<LRFinderPoint> points_;
  double average_ = 0, best_ = 0;
  bool diverged_ = false;
};

struct LRSuggestion {
  bool found = false;  // false: fewer than 3 points
  int64_t index = -1;  // into the points
  double lr = 0;
  double slope = 0;  // d smoothed_loss / d ln(lr) there
};
LRSuggestion suggest_lr(const std::vector<LRFinderPoint>& points);

}  // namespace mpigrad::launch
