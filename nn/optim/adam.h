// torch.optim.Adam and AdamW (amsgrad off) with bias correction. Adam adds weight decay to the
// gradient (L2); AdamW decays the parameter directly, p *= 1 - lr*wd, before the moment update
// (decoupled, Loshchilov & Hutter). Each group's `momentum` is beta1. The step count is kept
// per parameter, as torch does, and saved as "state/<i>/step".
#pragma once

#include "mpigrad/nn/optim/optimizer.h"

namespace mpigrad::nn {

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

class Adam : public Optimizer {
 public:
  Adam(std::vector<ParamGroupSpec> groups, const AdamOptions& options,
       bool decoupled_weight_decay = false);
  Adam(std::vector<Tensor> params, const AdamOptions& options)
      : Adam(std::vector<ParamGroupSpec>{ParamGroupSpec{std::move(params), {}, {}, {}}}, options) {}
  std::string type_name() const override { return decoupled_ ? "AdamW" : "Adam"; }
  void step() override;
  const AdamOptions& options() const { return options_; }

 private:
  AdamOptions options_;
  bool decoupled_;
};

// AdamW: torch's default weight decay is 1e-2.
class AdamW : public Adam {
 public:
  static AdamOptions default_options() {
    AdamOptions o;
    o.weight_decay = 1e-2;
    return o;
  }
  AdamW(std::vector<ParamGroupSpec> groups, const AdamOptions& options = default_options())
      : Adam(std::move(groups), options, true) {}
  AdamW(std::vector<Tensor> params, const AdamOptions& options = default_options())
      : Adam(std::vector<ParamGroupSpec>{ParamGroupSpec{std::move(params), {}, {}, {}}}, options,
             true) {}
};

}  // namespace mpigrad::nn
