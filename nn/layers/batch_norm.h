// torch.nn.BatchNorm1d/2d: per-channel normalization with affine weight (ones) and bias
// (zeros), buffers running_mean (zeros), running_var (ones) and num_batches_tracked (Int64).
// Training normalizes with batch statistics and updates the running ones with `momentum`
// (unbiased variance); with momentum unset it keeps a cumulative average instead (1/batches),
// which is what SWA's statistics recomputation uses. Eval normalizes with the running ones.
#pragma once

#include <optional>
#include <string>

#include "mpigrad/nn/functional/pooling.h"
#include "mpigrad/nn/module.h"

namespace mpigrad::nn {

struct BatchNormConfig {
  int64_t num_features = 0;
  double eps = 1e-5;
  std::optional<double> momentum = 0.1;
  bool affine = true;
  bool track_running_stats = true;
};

// "4, eps=1e-05, momentum=0.1, affine=True, track_running_stats=True", as PyTorch prints it;
// shared by BatchNorm and SyncBatchNorm.
std::string batch_norm_repr(const BatchNormConfig& config);

class BatchNorm : public Module {
 public:
  // expected_dims: the input ranks this flavour accepts (1d: 2 or 3, 2d: 4).
  BatchNorm(const BatchNormConfig& config, std::string type_name, int min_dims, int max_dims);
  Tensor forward(const Tensor& input) override;
  // relu(forward(input)), as one op where the backend fuses the pair
  // (functional::batch_norm_relu): bitwise the same output, gradients and running statistics.
  // Sequential calls it for a BatchNorm followed by a ReLU.
  Tensor forward_relu(const Tensor& input);
  // max_pool2d(relu(forward(input)), pool), as one op where the backend fuses the three
  // (functional::batch_norm_relu_max_pool2d): bitwise the same output, gradients and running
  // statistics. Sequential calls it for a BatchNorm2d, a ReLU and a 2x2 MaxPool2d.
  Tensor forward_relu_max_pool(const Tensor& input, const functional::Pool2dOptions& pool);
  std::string type_name() const override { return type_name_; }
  std::string extra_repr() const override;

  // Zeroes running_mean and num_batches_tracked and sets running_var to one.
  void reset_running_stats();
  std::optional<double> momentum() const { return config_.momentum; }
  void set_momentum(std::optional<double> momentum) { config_.momentum = momentum; }
  const BatchNormConfig& config() const { return config_; }

 private:
  Tensor normalize(const Tensor& input, bool relu, const functional::Pool2dOptions* pool = nullptr);

  BatchNormConfig config_;
  std::string type_name_;
  int min_dims_, max_dims_;
  Tensor* weight_ = nullptr;
  Tensor* bias_ = nullptr;
  Tensor* running_mean_ = nullptr;
  Tensor* running_var_ = nullptr;
  Tensor* num_batches_tracked_ = nullptr;
  Tensor none_;
};

// [N, C] or [N, C, L].
class BatchNorm1d : public BatchNorm {
 public:
  explicit BatchNorm1d(int64_t num_features, double eps = 1e-5,
                       std::optional<double> momentum = 0.1, bool affine = true,
                       bool track_running_stats = true);
};

// [N, C, H, W].
class BatchNorm2d : public BatchNorm {
 public:
  explicit BatchNorm2d(int64_t num_features, double eps = 1e-5,
                       std::optional<double> momentum = 0.1, bool affine = true,
                       bool track_running_stats = true);
};

// Whether `module` is exactly a BatchNorm, BatchNorm1d or BatchNorm2d (an ONNX graph's layers
// are the first), whose forward_relu may stand in for it and the ReLU after it (a subclass may
// forward differently, and a SyncBatchNorm is none: a model converted for multi-rank runs keeps
// the two ops apart).
bool is_plain_batch_norm(const Module& module);

// relu(module(input)): BatchNorm::forward_relu where is_plain_batch_norm, else the module, then
// core::relu. Bitwise the same results either way.
Tensor batch_norm_then_relu(Module& module, const Tensor& input);

}  // namespace mpigrad::nn
