#include "mpigrad/nn/functional/padding.h"

#include <vector>

#include "mpigrad/core/error.h"
#include "mpigrad/core/ops/indexing.h"

namespace mpigrad::nn::functional {

namespace {
// Positions -pad .. extent + pad - 1, wrapped into [0, extent).
core::Tensor wrapped_indices(int64_t extent, int64_t pad, core::Device device) {
  std::vector<int64_t> index;
  index.reserve(size_t(extent + 2 * pad));
  for (int64_t i = -pad; i < extent + pad; ++i) index.push_back(((i % extent) + extent) % extent);
  return core::Tensor::from_vector<int64_t>(index, {int64_t(index.size())}).to(device);
}
}  // namespace

core::Tensor pad_circular(const core::Tensor& input, std::array<int64_t, 2> padding) {
  MPIGRAD_CHECK(input.dim() == 4, "pad_circular: expected NCHW input, got shape ", input.shape());
  core::Tensor out = input;
  for (int axis = 0; axis < 2; ++axis) {
    const int64_t dim = 2 + axis, extent = input.size(dim), pad = padding[size_t(axis)];
    MPIGRAD_CHECK(pad >= 0 && pad <= extent, "pad_circular: padding ", pad, " of dim ", dim,
                  " must be in [0, ", extent, "] for input ", input.shape());
    if (pad > 0) out = core::index_select(out, dim, wrapped_indices(extent, pad, input.device()));
  }
  return out;
}

}  // namespace mpigrad::nn::functional
