// torch.nn.SyncBatchNorm: batch normalization whose training statistics cover the global batch,
// that is every rank's local batch together. The forward all-reduces one fused [2C+1] float64
// tensor (per-channel sum, per-channel sum of squares, element count) and normalizes with the
// global mean and biased variance; the running statistics take the unbiased global variance, so
// they match a BatchNorm that saw the whole batch in one process. The backward all-reduces the
// per-channel sum of grad and of grad * xhat, which gives the exact gradient of the global batch
// with respect to this rank's input. Weight and bias gradients stay local sums (DDP averages
// them), as in PyTorch.
//
// Parameter and buffer names and layouts are BatchNorm's (weight, bias, running_mean,
// running_var, num_batches_tracked), so checkpoints move freely between the two. Eval mode uses
// the running statistics and never communicates.
//
// Invariant: every rank of the communicator runs the same sequence of SyncBatchNorm forwards and
// backwards (the collectives must match), each with at least one rank holding data.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "mpigrad/launch/comm/communicator.h"
#include "mpigrad/nn/layers/batch_norm.h"
#include "mpigrad/nn/module.h"

namespace mpigrad::launch {

class SyncBatchNorm : public nn::Module {
 public:
  // Fresh parameters (weight ones, bias zeros) and statistics, like BatchNorm.
  SyncBatchNorm(const nn::BatchNormConfig& config, Communicator& communicator);
  // Takes over `batch_norm`'s configuration, parameters, buffers (the same tensors, so an
  // optimizer built on them keeps working) and training mode.
  static std::shared_ptr<SyncBatchNorm> from_batch_norm(nn::BatchNorm& batch_norm,
                                                        Communicator& communicator);

  // [N, C, *]: any input of 2 or more dims.
  nn::Tensor forward(const nn::Tensor& input) override;
  std::string type_name() const override { return "SyncBatchNorm"; }
  std::string extra_repr() const override;

  const nn::BatchNormConfig& config() const { return config_; }
  Communicator& communicator() { return communicator_; }

 private:
  SyncBatchNorm(const nn::BatchNormConfig& config, Communicator& communicator,
                nn::BatchNorm* source);
  nn::Tensor forward_global_statistics(const nn::Tensor& input, double factor);

  nn::BatchNormConfig config_;
  Communicator& communicator_;
  nn::Tensor* weight_ = nullptr;
  nn::Tensor* bias_ = nullptr;
  nn::Tensor* running_mean_ = nullptr;
  nn::Tensor* running_var_ = nullptr;
  nn::Tensor* num_batches_tracked_ = nullptr;
  nn::Tensor none_;
};

// Replaces every BatchNorm1d/BatchNorm2d below `module` (recursively, Sequential included) by a
// SyncBatchNorm over `communicator` that carries its parameters and buffers; returns how many it
// replaced. The root itself cannot be swapped in place: wrap a lone BatchNorm with
// SyncBatchNorm::from_batch_norm instead. A module that calls a BatchNorm child through its own
// pointer rather than through its children is not affected (see nn::Module::replace_child).
int convert_sync_batchnorm(nn::Module& module, Communicator& communicator);

}  // namespace mpigrad::launch
