// A dataset held in memory as one tensor per field, each [N, ...]: for tests, benchmarks and
// codes that already have their samples in memory (an in-situ simulation's fields). Batches are
// index_select of each tensor, so they stay on the tensors' device.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "mpigrad/core/tensor.h"
#include "mpigrad/data/dataset.h"

namespace mpigrad::data {

class TensorDataset final : public Dataset {
 public:
  // `fields` in order, e.g. {{"x", x}, {"y", y}}: every tensor has at least one dimension and
  // the same leading size N (else a core::Error naming the field). `description` is describe().
  explicit TensorDataset(std::vector<std::pair<std::string, core::Tensor>> fields,
                         std::string description = "in-memory tensors");

  int64_t size() const override { return size_; }
  const std::vector<FieldInfo>& fields() const override { return infos_; }
  Batch get_batch(std::span<const int64_t> indices) const override;
  std::string describe() const override { return description_; }
  // The whole tensor of field `name`.
  const core::Tensor& tensor(const std::string& name) const;

 private:
  std::vector<std::pair<std::string, core::Tensor>> tensors_;
  std::vector<FieldInfo> infos_;
  std::string description_;
  int64_t size_ = 0;
};

}  // namespace mpigrad::data
