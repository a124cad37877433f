// Circular (periodic) padding of NCHW input, torch.nn.functional.pad(mode="circular"): the
// input wraps around, so a convolution over the padded input sees a periodic domain, as a
// stencil on a periodic grid does (Conv2d's padding_mode = circular). Built from index_select
// along H and W with wrapped indices, so its gradient (index_add) needs no code of its own and
// it runs on every device index_select runs on.
#pragma once

#include <array>
#include <cstdint>

#include "mpigrad/core/tensor.h"

namespace mpigrad::nn::functional {

// Pads H by padding[0] and W by padding[1] on both sides. Each padding must be at most the
// extent it wraps (as in torch); input is [N, C, H, W].
core::Tensor pad_circular(const core::Tensor& input, std::array<int64_t, 2> padding);

}  // namespace mpigrad::nn::functional
