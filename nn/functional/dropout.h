// Inverted dropout: in training each element is zeroed with probability p and the survivors
// are scaled by 1/(1-p), so evaluation needs no rescaling. The mask comes from the given
// counter-based Philox generator: the same generator state gives the same mask on any device.
#pragma once

#include "mpigrad/core/rng.h"
#include "mpigrad/core/tensor.h"

namespace mpigrad::nn::functional {

// Returns input itself when !training or p == 0. p must lie in [0, 1].
core::Tensor dropout(const core::Tensor& input, double p, bool training,
                     core::Generator& generator);

}  // namespace mpigrad::nn::functional
