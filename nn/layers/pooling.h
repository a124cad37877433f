// Module forms of nn/functional/pooling.h with torch.nn's constructor defaults.
#pragma once

#include <array>

#include "mpigrad/nn/functional/pooling.h"
#include "mpigrad/nn/module.h"

namespace mpigrad::nn {

class MaxPool2d : public Module {
 public:
  // stride 0 means "same as kernel_size", like torch's stride=None.
  explicit MaxPool2d(int64_t kernel_size, int64_t stride = 0, int64_t padding = 0,
                     int64_t dilation = 1);
  explicit MaxPool2d(const functional::Pool2dOptions& options) : options_(options) {}
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "MaxPool2d"; }
  const functional::Pool2dOptions& options() const { return options_; }
  std::string extra_repr() const override;

 private:
  functional::Pool2dOptions options_;
};

class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(int64_t kernel_size, int64_t stride = 0, int64_t padding = 0,
                     bool count_include_pad = true);
  explicit AvgPool2d(const functional::Pool2dOptions& options) : options_(options) {}
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "AvgPool2d"; }
  std::string extra_repr() const override;

 private:
  functional::Pool2dOptions options_;
};

class AdaptiveAvgPool2d : public Module {
 public:
  explicit AdaptiveAvgPool2d(std::array<int64_t, 2> output_size) : output_size_(output_size) {}
  explicit AdaptiveAvgPool2d(int64_t output_size) : output_size_{output_size, output_size} {}
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "AdaptiveAvgPool2d"; }
  std::string extra_repr() const override;

 private:
  std::array<int64_t, 2> output_size_;
};

}  // namespace mpigrad::nn
