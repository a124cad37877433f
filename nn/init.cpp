#include "mpigrad/nn/init.h"

#include <cmath>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/error.h"

namespace mpigrad::nn::init {

double calculate_gain(Nonlinearity nonlinearity, double param) {
  switch (nonlinearity) {
    case Nonlinearity::Linear:
    case Nonlinearity::Conv:
    case Nonlinearity::Sigmoid:
      return 1.0;
    case Nonlinearity::Tanh:
      return 5.0 / 3.0;
    case Nonlinearity::ReLU:
      return std::sqrt(2.0);
    case Nonlinearity::LeakyReLU:
      return std::sqrt(2.0 / (1.0 + param * param));
    case Nonlinearity::SELU:
      return 3.0 / 4.0;
  }
  return 1.0;
}

Fans compute_fans(const Tensor& tensor) {
  MPIGRAD_CHECK(tensor.dim() >= 2,
                "init: fan in and fan out need a tensor of at least 2 dims, "
                "got shape ",
                tensor.shape());
  int64_t receptive = 1;
  for (int d = 2; d < tensor.dim(); ++d) receptive *= tensor.shape()[d];
  return {tensor.shape()[1] * receptive, tensor.shape()[0] * receptive};
}

Tensor& uniform_(Tensor& tensor, double lo, double hi, Generator& generator) {
  core::NoGradGuard no_grad;
  return core::uniform_(tensor, lo, hi, generator);
}

Tensor& normal_(Tensor& tensor, double mean, double std, Generator& generator) {
  core::NoGradGuard no_grad;
  return core::normal_(tensor, mean, std, generator);
}

Tensor& constant_(Tensor& tensor, double value) {
  core::NoGradGuard no_grad;
  return tensor.fill_(value);
}
Tensor& zeros_(Tensor& tensor) {
  return constant_(tensor, 0.0);
}
Tensor& ones_(Tensor& tensor) {
  return constant_(tensor, 1.0);
}

namespace {
double kaiming_std(const Tensor& tensor, double a, FanMode mode, Nonlinearity nonlinearity) {
  const Fans fans = compute_fans(tensor);
  const int64_t fan = mode == FanMode::FanIn ? fans.fan_in : fans.fan_out;
  MPIGRAD_CHECK(fan > 0, "kaiming init: tensor of shape ", tensor.shape(), " has a zero fan");
  return calculate_gain(nonlinearity, a) / std::sqrt(double(fan));
}
}  // namespace

Tensor& kaiming_uniform_(Tensor& tensor, Generator& generator, double a, FanMode mode,
                         Nonlinearity nonlinearity) {
  const double bound = std::sqrt(3.0) * kaiming_std(tensor, a, mode, nonlinearity);
  return init::uniform_(tensor, -bound, bound, generator);
}

Tensor& kaiming_normal_(Tensor& tensor, Generator& generator, double a, FanMode mode,
                        Nonlinearity nonlinearity) {
  return init::normal_(tensor, 0.0, kaiming_std(tensor, a, mode, nonlinearity), generator);
}

Tensor& xavier_uniform_(Tensor& tensor, Generator& generator, double gain) {
  const Fans fans = compute_fans(tensor);
  const double bound = gain * std::sqrt(6.0 / double(fans.fan_in + fans.fan_out));
  return init::uniform_(tensor, -bound, bound, generator);
}

Tensor& xavier_normal_(Tensor& tensor, Generator& generator, double gain) {
  const Fans fans = compute_fans(tensor);
  return init::normal_(tensor, 0.0, gain * std::sqrt(2.0 / double(fans.fan_in + fans.fan_out)),
                       generator);
}

}  // namespace mpigrad::nn::init
