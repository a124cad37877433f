// The interface every map-style dataset implements: a size, a list of fields, and reading a
// batch of arbitrary indices. get_batch is called concurrently from the DataLoader's worker
// threads, so implementations must be thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "mpigrad/data/batch.h"

namespace mpigrad::data {

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual const std::vector<FieldInfo>& fields() const = 0;
  // The samples `indices` (each in [0, size())), stacked per field in the order given. Throws
  // core::Error naming the dataset when an index is out of range.
  virtual Batch get_batch(std::span<const int64_t> indices) const = 0;
  // A short description for messages ("file.h5 (+3 shards)").
  virtual std::string describe() const = 0;

  const FieldInfo& field(const std::string& name) const;
};

// Throws core::Error naming `what` when an index is outside [0, size).
void check_indices(std::span<const int64_t> indices, int64_t size, const std::string& what);

}  // namespace mpigrad::data
