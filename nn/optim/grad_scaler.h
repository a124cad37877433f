// Dynamic loss scaling for fp16 training, as torch.cuda.amp.GradScaler does it.
//
// fp16 gradients below 2^-24 flush to zero. Multiplying the loss by a large scale S lifts them
// into range; unscale_ divides the float32 gradients by S again before anything reads them
// (clipping, the optimizer). A scale that is too large overflows instead: some gradient becomes
// inf or NaN, the step is skipped and S halves. After growth_interval clean steps in a row S
// doubles, so it hovers just below the overflow point.
//
// Under DDP no extra collective is needed to agree on an overflow: the averaged gradients carry
// it. IEEE sums propagate inf and NaN (inf + x = inf, inf - inf = NaN, NaN + x = NaN), in fp32
// and through bf16/fp16 compression alike, so once any rank's gradient is non-finite, every
// rank's averaged gradient is, and every rank skips the same step. ZeRO-1's reduce-scatter
// leaves each rank one shard of the average, so there DDP carries a found-inf flag into every
// shard (launch/ddp/distributed_data_parallel.h) and the scaler reads the shards.
#pragma once

#include <cstdint>
#include <vector>

#include "mpigrad/core/tensor.h"
#include "mpigrad/nn/optim/optimizer.h"
#include "mpigrad/nn/state_dict.h"

namespace mpigrad::nn {

struct GradScalerOptions {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});

  // loss * scale, to call backward on.
  core::Tensor scale(const core::Tensor& loss) const;
  // Divides every gradient of `parameters` by the scale (once per step) and returns whether one
  // of them holds inf or NaN.
  bool unscale_(const std::vector<core::Tensor>& parameters);
  // The same on the gradients themselves, for a caller whose gradients are not the parameters'
  // .grad (ZeRO-1's shards, launch/ddp/zero_redundancy.h).
  bool unscale_gradients_(const std::vector<core::Tensor>& gradients);
  // Steps `optimizer` unless the unscaled gradients overflowed (unscaling them first if
  // unscale_ was not called); returns whether it stepped.
  bool step(Optimizer& optimizer);
  // Ends the step: halves the scale after an overflow, doubles it after growth_interval clean
  // steps in a row, and forgets this step's unscale.
  void update();

  double get_scale() const { return scale_; }
  int64_t growth_tracker() const { return growth_tracker_; }
  bool found_inf() const { return found_inf_; }
  int64_t skipped_steps() const { return skipped_steps_; }

  // "scale", "growth_tracker" and "skipped_steps": what a resumed run needs to continue with
  // the same scale.
  StateDict state_dict() const;
  void load_state_dict(const StateDict& state);

 private:
  GradScalerOptions options_;
  double scale_;
  int64_t growth_tracker_ = 0;
  int64_t skipped_steps_ = 0;
  bool unscaled_ = false;
  bool found_inf_ = false;
};

}  // namespace mpigrad::nn
