// Weight averaging for evaluation models. ModelEMA keeps an exponential moving average of a
// model's parameters (buffers such as BatchNorm statistics are copied, as timm's ModelEmaV2
// does for non-float entries; float buffers are averaged too). SWA averages weights either as a
// running mean over updates (SWAAverager) or over the state dicts of the last k checkpoints
// (average_state_dicts); after either, update_bn recomputes BatchNorm's running statistics with
// a cumulative average over a pass of training data, as torch.optim.swa_utils.update_bn does.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "mpigrad/nn/module.h"
#include "mpigrad/nn/state_dict.h"

namespace mpigrad::nn {

class ModelEMA {
 public:
  // warmup: the effective decay is min(decay, (1 + n) / (10 + n)) after n updates, so early
  // averages are not dominated by the random initialization.
  explicit ModelEMA(const Module& model, double decay = 0.9999, bool warmup = false);
  // shadow = d * shadow + (1 - d) * model for floating entries; integer entries are copied.
  void update(const Module& model);
  // Loads the averaged weights into `model` (same architecture).
  void copy_to(Module& model) const;
  const StateDict& shadow() const { return shadow_; }
  int64_t num_updates() const { return num_updates_; }
  double decay() const { return decay_; }

  StateDict state_dict() const;  // the shadow entries plus the scalar num_updates
  void load_state_dict(const StateDict& state);

 private:
  StateDict shadow_;
  double decay_;
  bool warmup_;
  int64_t num_updates_ = 0;
};

// Running equal-weight average: after n updates, average = mean of the n models seen.
class SWAAverager {
 public:
  void update(const Module& model);
  void copy_to(Module& model) const;
  int64_t count() const { return count_; }
  const StateDict& average() const { return average_; }
  // The averaged entries plus the scalar count (present even before the first update, so a
  // checkpoint always carries it); load_state_dict takes that form back.
  StateDict state_dict() const;
  void load_state_dict(const StateDict& state);

 private:
  StateDict average_;
  int64_t count_ = 0;
};

// The element-wise mean of floating entries over the state dicts (same keys and shapes; a
// mismatch is an error naming the key); integer entries come from the last one.
StateDict average_state_dicts(const std::vector<StateDict>& states);

// Resets every BatchNorm's running statistics, then runs `model` in training mode with grad
// off on each batch that `next_batch` returns until it returns an undefined tensor, using a
// cumulative average (momentum unset). Momenta and each module's training flag are restored.
void update_bn(Module& model, const std::function<core::Tensor()>& next_batch);

}  // namespace mpigrad::nn
