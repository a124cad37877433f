// Dataspaces (part of core/hdf5.h): the extents of a dataset and a selection of its elements,
// the blocks of rows and the arbitrary blocks that partial reads and writes go through. Every
// selection is checked against the extents and names the dataset when it does not fit.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mpigrad/core/hdf5/handle.h"

namespace mpigrad::core::hdf5 {

// A dataspace: the extents of a dataset plus a selection of elements in it.
class Dataspace {
 public:
  Dataspace() = default;
  Dataspace(Handle handle, std::string where)
      : handle_(std::move(handle)), where_(std::move(where)) {}
  // A simple dataspace of these extents (a scalar one when dims is empty).
  static Dataspace simple(const std::vector<int64_t>& dims);

  Hid id() const { return handle_.id(); }
  std::vector<int64_t> dims() const;
  // Replaces the selection with the block start[d] .. start[d] + count[d] in every dimension.
  void select_block(const std::vector<int64_t>& start, const std::vector<int64_t>& count);
  // Adds such a block to the selection (union).
  void add_block(const std::vector<int64_t>& start, const std::vector<int64_t>& count);
  // Replaces the selection with rows [row, row + rows) of the leading dimension, all of the rest.
  void select_rows(int64_t row, int64_t rows);
  void add_rows(int64_t row, int64_t rows);
  int64_t selected_elements() const;

 private:
  void block(bool replace, const std::vector<int64_t>& start, const std::vector<int64_t>& count);
  Handle handle_;
  std::string where_;
};

}  // namespace mpigrad::core::hdf5
