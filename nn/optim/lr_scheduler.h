// Learning-rate schedules with torch.optim.lr_scheduler's formulas (the closed forms). Building
// a scheduler records each group's initial_lr and applies epoch 0, like torch; each step()
// advances one epoch (or iteration, for per-step schedules) and writes every group's lr.
// state_dict holds last_epoch, the base lrs and each schedule's own counters, as scalars.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mpigrad/nn/optim/optimizer.h"
#include "mpigrad/nn/state_dict.h"

namespace mpigrad::nn {

class LRScheduler {
 public:
  virtual ~LRScheduler() = default;
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  virtual std::string type_name() const = 0;
  void step();
  int64_t last_epoch() const { return last_epoch_; }
  // The lr of every group after the latest step.
  std::vector<double> last_lr() const;

  virtual StateDict state_dict() const;
  virtual void load_state_dict(const StateDict& state);

 protected:
  explicit LRScheduler(Optimizer& optimizer);
  // Derived constructors call this last: it applies epoch 0.
  void initialize();
  // The lr of group g at `epoch` (>= 0).
  virtual double lr_at(size_t group, int64_t epoch) const = 0;
  // Writes the lrs (and anything else a schedule drives) for `epoch`.
  virtual void apply(int64_t epoch);

  Optimizer& optimizer_;
  std::vector<double> base_lrs_;
  int64_t last_epoch_ = -1;
};

// lr = base * gamma^floor(epoch / step_size)
class StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& optimizer, int64_t step_size, double gamma = 0.1);
  std::string type_name() const override { return "StepLR"; }

 protected:
  double lr_at(size_t group, int64_t epoch) const override;

 private:
  int64_t step_size_;
  double gamma_;
};

// lr = base * gamma^(number of milestones <= epoch)
class MultiStepLR : public LRScheduler {
 public:
  MultiStepLR(Optimizer& optimizer, std::vector<int64_t> milestones, double gamma = 0.1);
  std::string type_name() const override { return "MultiStepLR"; }

 protected:
  double lr_at(size_t group, int64_t epoch) const override;

 private:
  std::vector<int64_t> milestones_;
  double gamma_;
};

// lr = eta_min + (base - eta_min) * (1 + cos(pi * epoch / t_max)) / 2
class CosineAnnealingLR : public LRScheduler {
 public:
  CosineAnnealingLR(Optimizer& optimizer, int64_t t_max, double eta_min = 0.0);
  std::string type_name() const override { return "CosineAnnealingLR"; }

 protected:
  double lr_at(size_t group, int64_t epoch) const override;

 private:
  int64_t t_max_;
  double eta_min_;
};

// Linear warmup from base * start_factor to base over warmup_steps, then cosine annealing to
// eta_min at total_steps, and eta_min after that. Equals torch's
// SequentialLR([LinearLR(start_factor, total_iters=warmup), CosineAnnealingLR(total - warmup)],
// milestones=[warmup]) within [0, total_steps].
class WarmupCosineLR : public LRScheduler {
 public:
  WarmupCosineLR(Optimizer& optimizer, int64_t warmup_steps, int64_t total_steps,
                 double start_factor = 0.01, double eta_min = 0.0);
  std::string type_name() const override { return "WarmupCosineLR"; }

 protected:
  double lr_at(size_t group, int64_t epoch) const override;

 private:
  int64_t warmup_steps_, total_steps_;
  double start_factor_, eta_min_;
};

// torch's LinearLR: lr = base * (start_factor + (end_factor - start_factor) *
// min(epoch, total_iters) / total_iters), so the lr moves linearly from base * start_factor to
// base * end_factor over total_iters steps and stays there.
class LinearLR : public LRScheduler {
 public:
  LinearLR(Optimizer& optimizer, double start_factor, double end_factor, int64_t total_iters);
  std::string type_name() const override { return "LinearLR"; }

 protected:
  double lr_at(size_t group, int64_t epoch) const override;

 private:
  double start_factor_, end_factor_;
  int64_t total_iters_;
};

// torch's PolynomialLR: lr = base * (1 - min(epoch, total_iters) / total_iters)^power, decaying
// to zero at total_iters.
class PolynomialLR : public LRScheduler {
 public:
  PolynomialLR(Optimizer& optimizer, int64_t total_iters, double power = 1.0);
  std::string type_name() const override { return "PolynomialLR"; }

 protected:
  double lr_at(size_t group, int64_t epoch) const override;

 private:
  int64_t total_iters_;
  double power_;
};

// torch's OneCycleLR (two phases, or three with three_phase): from max_lr/div_factor up to
// max_lr over pct_start of total_steps, then down to initial/final_div_factor; cosine or
// linear annealing. With cycle_momentum, each group's momentum (SGD momentum / Adam beta1)
// moves inversely between max_momentum and base_momentum.
struct OneCycleOptions {
  double max_lr = 0.1;
  int64_t total_steps = 0;
  double pct_start = 0.3;
  bool cosine = true;  // false: linear annealing
  bool cycle_momentum = true;
  double base_momentum = 0.85, max_momentum = 0.95;
  double div_factor = 25.0, final_div_factor = 1e4;
  bool three_phase = false;
};

class OneCycleLR : public LRScheduler {
 public:
  OneCycleLR(Optimizer& optimizer, const OneCycleOptions& options);
  std::string type_name() const override { return "OneCycleLR"; }

 protected:
  double lr_at(size_t group, int64_t epoch) const override;
  void apply(int64_t epoch) override;

 private:
  struct Phase {
    double end_step;
    double start_lr_factor, end_lr_factor;  // multiples of initial_lr
    bool momentum_up;                       // momentum goes max -> base or base -> max
  };
  double anneal(double start, double end, double pct) const;
  // The phase containing `epoch` and how far into it, as (phase index, pct).
  std::pair<size_t, double> locate(int64_t epoch) const;

  OneCycleOptions options_;
  std::vector<Phase> phases_;
  double initial_lr_, min_lr_;
};

// torch's ReduceLROnPlateau: after `patience` epochs without improvement of the metric (beyond
// `threshold`, relative or absolute), every lr is multiplied by `factor` (not below min_lr),
// followed by `cooldown` epochs in which bad epochs are not counted.
struct PlateauOptions {
  bool maximize = false;  // mode 'max' instead of 'min'
  double factor = 0.1;
  int64_t patience = 10;
  double threshold = 1e-4;
  bool relative_threshold = true;  // threshold_mode 'rel' (else 'abs')
  int64_t cooldown = 0;
  double min_lr = 0.0;
  double eps = 1e-8;
};

class ReduceLROnPlateau {
 public:
  ReduceLROnPlateau(Optimizer& optimizer, const PlateauOptions& options = {});
  void step(double metric);
  std::vector<double> last_lr() const;
  int64_t num_bad_epochs() const { return num_bad_epochs_; }
  StateDict state_dict() const;
  void load_state_dict(const StateDict& state);

 private:
  bool is_better(double value) const;
  Optimizer& optimizer_;
  PlateauOptions options_;
  double best_;
  int64_t num_bad_epochs_ = 0, cooldown_counter_ = 0, last_epoch_ = 0;
};

}  // namespace mpigrad::nn
