// Parameter initializers with torch.nn.init's formulas, each drawing from an explicit
// core::Generator (there is no hidden global stream), so the same seed gives the same model on
// every rank and every device. They write in place without recording autograd history.
#pragma once

#include <cstdint>

#include "mpigrad/core/rng.h"
#include "mpigrad/core/tensor.h"

namespace mpigrad::nn::init {

using core::Generator;
using core::Tensor;

enum class Nonlinearity { Linear, Conv, Sigmoid, Tanh, ReLU, LeakyReLU, SELU };
enum class FanMode { FanIn, FanOut };

// torch.nn.init.calculate_gain; `param` is LeakyReLU's negative slope.
double calculate_gain(Nonlinearity nonlinearity, double param = 0.01);

struct Fans {
  int64_t fan_in = 0, fan_out = 0;
};
// fan_in = size(1) * receptive field, fan_out = size(0) * receptive field; needs >= 2 dims.
Fans compute_fans(const Tensor& tensor);

Tensor& uniform_(Tensor& tensor, double lo, double hi, Generator& generator);
Tensor& normal_(Tensor& tensor, double mean, double std, Generator& generator);
Tensor& constant_(Tensor& tensor, double value);
Tensor& zeros_(Tensor& tensor);
Tensor& ones_(Tensor& tensor);

// U(-b, b) with b = gain * sqrt(3 / fan); gain from nonlinearity and `a` (LeakyReLU slope).
Tensor& kaiming_uniform_(Tensor& tensor, Generator& generator, double a = 0.0,
                         FanMode mode = FanMode::FanIn,
                         Nonlinearity nonlinearity = Nonlinearity::LeakyReLU);
// N(0, std) with std = gain / sqrt(fan).
Tensor& kaiming_normal_(Tensor& tensor, Generator& generator, double a = 0.0,
                        FanMode mode = FanMode::FanIn,
                        Nonlinearity nonlinearity = Nonlinearity::LeakyReLU);
// U(-b, b) with b = gain * sqrt(6 / (fan_in + fan_out)).
Tensor& xavier_uniform_(Tensor& tensor, Generator& generator, double gain = 1.0);
// N(0, std) with std = gain * sqrt(2 / (fan_in + fan_out)).
Tensor& xavier_normal_(Tensor& tensor, Generator& generator, double gain = 1.0);

}  // namespace mpigrad::nn::init
