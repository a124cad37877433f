// torch.optim.SGD: momentum, dampening, nesterov and (coupled) weight decay; the first momentum
// step initializes the buffer to the gradient, as torch does. The update of each parameter is
// one pass of the sgd_step kernel (kernels/optimizer.h).
#pragma once

#include "mpigrad/nn/optim/optimizer.h"

namespace mpigrad::nn {

struct SGDOptions {
  double lr = 0.01;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

class SGD : public Optimizer {
 public:
  SGD(std::vector<ParamGroupSpec> groups, const SGDOptions& options);
  SGD(std::vector<Tensor> params, const SGDOptions& options)
      : SGD(std::vector<ParamGroupSpec>{ParamGroupSpec{std::move(params), {}, {}, {}}}, options) {}
  std::string type_name() const override { return "SGD"; }
  void step() override;
  const SGDOptions& options() const { return options_; }

 private:
  SGDOptions options_;
};

}  // namespace mpigrad::nn
