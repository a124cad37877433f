// What a dataset yields: one tensor per field (x, y, ...) whose leading dimension is the batch,
// plus the global sample indices and, for a MultiDataset, which child each sample came from.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "mpigrad/core/checked_math.h"
#include "mpigrad/core/dtype.h"
#include "mpigrad/core/shape.h"
#include "mpigrad/core/tensor.h"

namespace mpigrad::data {

// One field of a dataset: its name, element type and the shape of a single sample.
struct FieldInfo {
  std::string name;
  core::DType dtype = core::kFloat32;
  core::Shape sample_shape;  // without the leading N
  // Checked: the shape comes from a file, and its bytes may not fit in int64.
  int64_t sample_bytes() const {
    return core::checked_mul(sample_shape.numel(), int64_t(core::element_size(dtype)), "field '",
                             name, "' per-sample shape ", sample_shape, " in bytes");
  }
  friend bool operator==(const FieldInfo& a, const FieldInfo& b) {
    return a.name == b.name && a.dtype == b.dtype && a.sample_shape == b.sample_shape;
  }
};

struct Batch {
  // Field name -> tensor of shape [batch, sample_shape...], in the dataset's field order.
  std::vector<std::pair<std::string, core::Tensor>> fields;
  // Global index of each sample in the dataset the loader reads.
  std::vector<int64_t> indices;
  // int64 [batch]: the child dataset of each sample; undefined unless read from a MultiDataset.
  core::Tensor dataset_index;
  // The loader's epoch when it read the batch (DataLoader::set_epoch): what per-epoch random
  // transforms draw from (data/augment.h). 0 outside a loader.
  int64_t epoch = 0;

  int64_t size() const { return int64_t(indices.size()); }
  bool has(const std::string& name) const;
  // The field's tensor; throws core::Error naming the field and the fields present.
  const core::Tensor& operator[](const std::string& name) const;
  core::Tensor& operator[](const std::string& name);
  // Replaces or appends a field.
  void set(const std::string& name, core::Tensor tensor);
};

}  // namespace mpigrad::data
