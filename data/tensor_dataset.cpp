#include "mpigrad/data/tensor_dataset.h"

#include "mpigrad/core/error.h"
#include "mpigrad/core/ops/indexing.h"

namespace mpigrad::data {

TensorDataset::TensorDataset(std::vector<std::pair<std::string, core::Tensor>> fields,
                             std::string description)
    : tensors_(std::move(fields)), description_(std::move(description)) {
  MPIGRAD_CHECK(!tensors_.empty(), "TensorDataset ", description_, ": no fields");
  for (const auto& [name, tensor] : tensors_) {
    MPIGRAD_CHECK(tensor.dim() >= 1, "TensorDataset ", description_, " field '", name,
                  "': a tensor [N, ...] is needed, got shape ", tensor.shape());
  }
  size_ = tensors_.front().second.size(0);
  for (const auto& [name, tensor] : tensors_) {
    const core::Shape shape = tensor.shape();
    MPIGRAD_CHECK(shape[0] == size_, "TensorDataset ", description_, " field '", name, "' has ",
                  shape[0], " samples, field '", tensors_.front().first, "' ", size_);
    infos_.push_back({name, tensor.dtype(), core::Shape(shape.data() + 1, shape.size() - 1)});
  }
}

Batch TensorDataset::get_batch(std::span<const int64_t> indices) const {
  check_indices(indices, size_, describe());
  std::vector<int64_t> picked(indices.begin(), indices.end());
  const core::Tensor index = core::Tensor::from_vector<int64_t>(picked, {int64_t(picked.size())});
  Batch batch;
  batch.indices = std::move(picked);
  for (const auto& [name, tensor] : tensors_) {
    batch.set(name, core::index_select(tensor, 0, index.to(tensor.device())));
  }
  return batch;
}

const core::Tensor& TensorDataset::tensor(const std::string& name) const {
  for (const auto& [field, tensor] : tensors_) {
    if (field == name) return tensor;
  }
  core::fail("TensorDataset ", description_, ": no field '", name, "'");
}

}  // namespace mpigrad::data
