#include "mpigrad/nn/optim/lr_scheduler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>

namespace mpigrad::nn {

// ---- LRScheduler ------------------------------------------------------------------------------

LRScheduler::LRScheduler(Optimizer& optimizer) : optimizer_(optimizer) {
  for (const ParamGroup& group : optimizer_.param_groups()) base_lrs_.push_back(group.initial_lr);
}

void LRScheduler::initialize() {
  last_epoch_ = 0;
  apply(0);
}

void LRScheduler::step() {
  apply(++last_epoch_);
}

void LRScheduler::apply(int64_t epoch) {
  auto& groups = optimizer_.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) groups[g].lr = lr_at(g, epoch);
}

std::vector<double> LRScheduler::last_lr() const {
  std::vector<double> out;
  for (const ParamGroup& group : optimizer_.param_groups()) out.push_back(group.lr);
  return out;
}

StateDict LRScheduler::state_dict() const {
  StateDict out;
  out.set_scalar("last_epoch", double(last_epoch_));
  for (size_t g = 0; g < base_lrs_.size(); ++g) {
    out.set_scalar("base_lrs/" + std::to_string(g), base_lrs_[g]);
  }
  return out;
}

void LRScheduler::load_state_dict(const StateDict& state) {
  const std::string owner = type_name() + ".load_state_dict";
  std::vector<double> base;
  for (size_t g = 0; g < base_lrs_.size(); ++g) {
    base.push_back(state.scalar("base_lrs/" + std::to_string(g), owner.c_str()));
  }
  MPIGRAD_CHECK(!state.contains_scalar("base_lrs/" + std::to_string(base_lrs_.size())), owner,
                ": the state dict has more parameter groups than the optimizer (", base_lrs_.size(),
                ")");
  base_lrs_ = base;
  last_epoch_ = int64_t(state.scalar("last_epoch", owner.c_str()));
  apply(last_epoch_);
}

// ---- Closed-form schedules --------------------------------------------------------------------

StepLR::StepLR(Optimizer& optimizer, int64_t step_size, double gamma)
    : LRScheduler(optimizer), step_size_(step_size), gamma_(gamma) {
  MPIGRAD_CHECK(step_size >= 1, "StepLR: step_size must be >= 1, got ", step_size);
  initialize();
}

double StepLR::lr_at(size_t group, int64_t epoch) const {
  return base_lrs_[group] * std::pow(gamma_, double(epoch / step_size_));
}

MultiStepLR::MultiStepLR(Optimizer& optimizer, std::vector<int64_t> milestones, double gamma)
    : LRScheduler(optimizer), milestones_(std::move(milestones)), gamma_(gamma) {
  std::sort(milestones_.begin(), milestones_.end());
  initialize();
}

double MultiStepLR::lr_at(size_t group, int64_t epoch) const {
  const auto passed =
      std::upper_bound(milestones_.begin(), milestones_.end(), epoch) - milestones_.begin();
  return base_lrs_[group] * std::pow(gamma_, double(passed));
}

CosineAnnealingLR::CosineAnnealingLR(Optimizer& optimizer, int64_t t_max, double eta_min)
    : LRScheduler(optimizer), t_max_(t_max), eta_min_(eta_min) {
  MPIGRAD_CHECK(t_max >= 1, "CosineAnnealingLR: t_max must be >= 1, got ", t_max);
  initialize();
}

double CosineAnnealingLR::lr_at(size_t group, int64_t epoch) const {
  return eta_min_ + (base_lrs_[group] - eta_min_) *
                        (1.0 + std::cos(std::numbers::pi * double(epoch) / double(t_max_))) / 2.0;
}

WarmupCosineLR::WarmupCosineLR(Optimizer& optimizer, int64_t warmup_steps, int64_t total_steps,
                               double start_factor, double eta_min)
    : LRScheduler(optimizer),
      warmup_steps_(warmup_steps),
      total_steps_(total_steps),
      start_factor_(start_factor),
      eta_min_(eta_min) {
  MPIGRAD_CHECK(warmup_steps >= 0 && total_steps > warmup_steps,
                "WarmupCosineLR: need 0 <= "
                "warmup_steps < total_steps, got ",
                warmup_steps, " and ", total_steps);
  MPIGRAD_CHECK(start_factor >= 0.0 && start_factor <= 1.0,
                "WarmupCosineLR: start_factor must be in [0, 1], got ", start_factor);
  initialize();
}

double WarmupCosineLR::lr_at(size_t group, int64_t epoch) const {
  const double base = base_lrs_[group];
  if (epoch < warmup_steps_) {
    return base * (start_factor_ + (1.0 - start_factor_) * double(epoch) / double(warmup_steps_));
  }
  const int64_t into = std::min(epoch, total_steps_) - warmup_steps_;
  const double span = double(total_steps_ - warmup_steps_);
  return eta_min_ +
         (base - eta_min_) * (1.0 + std::cos(std::numbers::pi * double(into) / span)) / 2.0;
}

LinearLR::LinearLR(Optimizer& optimizer, double start_factor, double end_factor,
                   int64_t total_iters)
    : LRScheduler(optimizer),
      start_factor_(start_factor),
      end_factor_(end_factor),
      total_iters_(total_iters) {
  MPIGRAD_CHECK(total_iters >= 1, "LinearLR: total_iters must be >= 1, got ", total_iters);
  MPIGRAD_CHECK(start_factor >= 0.0 && end_factor >= 0.0,
                "LinearLR: the factors must be >= 0, "
                "got ",
                start_factor, " and ", end_factor);
  initialize();
}

double LinearLR::lr_at(size_t group, int64_t epoch) const {
  const double done = double(std::min(epoch, total_iters_)) / double(total_iters_);
  return base_lrs_[group] * (start_factor_ + (end_factor_ - start_factor_) * done);
}

PolynomialLR::PolynomialLR(Optimizer& optimizer, int64_t total_iters, double power)
    : LRScheduler(optimizer), total_iters_(total_iters), power_(power) {
  MPIGRAD_CHECK(total_iters >= 1, "PolynomialLR: total_iters must be >= 1, got ", total_iters);
  MPIGRAD_CHECK(power > 0.0, "PolynomialLR: power must be > 0, got ", power);
  initialize();
}

double PolynomialLR::lr_at(size_t group, int64_t epoch) const {
  const double left = 1.0 - double(std::min(epoch, total_iters_)) / double(total_iters_);
  return base_lrs_[group] * std::pow(left, power_);
}

// ---- OneCycleLR -------------------------------------------------------------------------------

OneCycleLR::OneCycleLR(Optimizer& optimizer, const OneCycleOptions& options)
    : LRScheduler(optimizer), options_(options) {
  const auto& o = options_;
  MPIGRAD_CHECK(o.total_steps >= 2, "OneCycleLR: total_steps must be >= 2, got ", o.total_steps);
  MPIGRAD_CHECK(o.pct_start > 0.0 && o.pct_start < 1.0,
                "OneCycleLR: pct_start must be in (0, 1), got ", o.pct_start);
  initial_lr_ = o.max_lr / o.div_factor;
  min_lr_ = initial_lr_ / o.final_div_factor;
  const double up_end = o.pct_start * double(o.total_steps) - 1.0;
  const double last = double(o.total_steps) - 1.0;
  const double peak = o.max_lr / initial_lr_, floor = min_lr_ / initial_lr_;
  if (o.three_phase) {
    phases_ = {{up_end, 1.0, peak, false},
               {2.0 * o.pct_start * double(o.total_steps) - 2.0, peak, 1.0, true},
               {last, 1.0, floor, true}};
  } else {
    phases_ = {{up_end, 1.0, peak, false}, {last, peak, floor, true}};
  }
  for (ParamGroup& group : optimizer_.param_groups()) group.initial_lr = initial_lr_;
  base_lrs_.assign(optimizer_.param_groups().size(), initial_lr_);
  initialize();
}

double OneCycleLR::anneal(double start, double end, double pct) const {
  if (options_.cosine) return end + (start - end) / 2.0 * (std::cos(std::numbers::pi * pct) + 1.0);
  return (end - start) * pct + start;
}

std::pair<size_t, double> OneCycleLR::locate(int64_t epoch) const {
  MPIGRAD_CHECK(epoch < options_.total_steps, "OneCycleLR: stepped ", epoch + 1,
                " times, more than total_steps = ", options_.total_steps);
  double start = 0.0;
  for (size_t i = 0; i < phases_.size(); ++i) {
    if (double(epoch) <= phases_[i].end_step || i + 1 == phases_.size()) {
      return {i, (double(epoch) - start) / (phases_[i].end_step - start)};
    }
    start = phases_[i].end_step;
  }
  return {phases_.size() - 1, 1.0};
}

double OneCycleLR::lr_at(size_t /*group*/, int64_t epoch) const {
  const auto [i, pct] = locate(epoch);
  return anneal(phases_[i].start_lr_factor * initial_lr_, phases_[i].end_lr_factor * initial_lr_,
                pct);
}

void OneCycleLR::apply(int64_t epoch) {
  LRScheduler::apply(epoch);
  if (!options_.cycle_momentum) return;
  const auto [i, pct] = locate(epoch);
  const double lo = options_.base_momentum, hi = options_.max_momentum;
  const double momentum = phases_[i].momentum_up ? anneal(lo, hi, pct) : anneal(hi, lo, pct);
  for (ParamGroup& group : optimizer_.param_groups()) group.momentum = momentum;
}

// ---- ReduceLROnPlateau ------------------------------------------------------------------------

ReduceLROnPlateau::ReduceLROnPlateau(Optimizer& optimizer, const PlateauOptions& options)
    : optimizer_(optimizer),
      options_(options),
      best_(options.maximize ? -std::numeric_limits<double>::infinity()
                             : std::numeric_limits<double>::infinity()) {
  MPIGRAD_CHECK(options.factor < 1.0 && options.factor >= 0.0,
                "ReduceLROnPlateau: factor must be in [0, 1), got ", options.factor);
}

bool ReduceLROnPlateau::is_better(double value) const {
  const double t = options_.threshold;
  if (options_.maximize) {
    return options_.relative_threshold ? value > best_ * (1.0 + t) : value > best_ + t;
  }
  return options_.relative_threshold ? value < best_ * (1.0 - t) : value < best_ - t;
}

void ReduceLROnPlateau::step(double metric) {
  ++last_epoch_;
  if (is_better(metric)) {
    best_ = metric;
    num_bad_epochs_ = 0;
  } else {
    ++num_bad_epochs_;
  }
  if (cooldown_counter_ > 0) {
    --cooldown_counter_;
    num_bad_epochs_ = 0;
  }
  if (num_bad_epochs_ > options_.patience) {
    for (ParamGroup& group : optimizer_.param_groups()) {
      const double reduced = std::max(group.lr * options_.factor, options_.min_lr);
      if (group.lr - reduced > options_.eps) group.lr = reduced;
    }
    cooldown_counter_ = options_.cooldown;
    num_bad_epochs_ = 0;
  }
}

std::vector<double> ReduceLROnPlateau::last_lr() const {
  std::vector<double> out;
  for (const ParamGroup& group : optimizer_.param_groups()) out.push_back(group.lr);
  return out;
}

StateDict ReduceLROnPlateau::state_dict() const {
  StateDict out;
  out.set_scalar("best", best_);
  out.set_scalar("num_bad_epochs", double(num_bad_epochs_));
  out.set_scalar("cooldown_counter", double(cooldown_counter_));
  out.set_scalar("last_epoch", double(last_epoch_));
  return out;
}

void ReduceLROnPlateau::load_state_dict(const StateDict& state) {
  const char* owner = "ReduceLROnPlateau.load_state_dict";
  best_ = state.scalar("best", owner);
  num_bad_epochs_ = int64_t(state.scalar("num_bad_epochs", owner));
  cooldown_counter_ = int64_t(state.scalar("cooldown_counter", owner));
  last_epoch_ = int64_t(state.scalar("last_epoch", owner));
}

}  // namespace mpigrad::nn
