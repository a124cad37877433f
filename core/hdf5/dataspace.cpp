// Dataspaces (core/hdf5/dataspace.h): extents, and the block selections that reads and writes of
// part of a dataset go through, each checked against the extents before HDF5 sees it.
#include "mpigrad/core/hdf5/dataspace.h"

#include <string>
#include <vector>

#include "mpigrad/core/error.h"
#include "mpigrad/core/hdf5/internal.h"
#include "mpigrad/core/shape.h"

namespace mpigrad::core::hdf5 {

namespace detail {

void rows_block(const std::vector<int64_t>& extents, int64_t row, int64_t rows,
                std::vector<int64_t>& start, std::vector<int64_t>& count) {
  start.assign(extents.size(), 0);
  count = extents;
  if (!extents.empty()) {
    start[0] = row;
    count[0] = rows;
  }
}

}  // namespace detail

using namespace detail;

Dataspace Dataspace::simple(const std::vector<int64_t>& dims) {
  silence_errors();
  if (dims.empty()) return Dataspace(owned(H5Screate(H5S_SCALAR), "H5Screate", "scalar"), "memory");
  std::vector<hsize_t> extents(dims.begin(), dims.end());
  return Dataspace(owned(H5Screate_simple(int(extents.size()), extents.data(), nullptr),
                         "H5Screate_simple", "memory space " + Shape(dims).str()),
                   "memory");
}

std::vector<int64_t> Dataspace::dims() const {
  silence_errors();
  int rank = check(H5Sget_simple_extent_ndims(id()), "H5Sget_simple_extent_ndims", where_);
  std::vector<hsize_t> extents(size_t(rank), 0);
  if (rank > 0)
    check(H5Sget_simple_extent_dims(id(), extents.data(), nullptr), "H5Sget_simple_extent_dims",
          where_);
  return {extents.begin(), extents.end()};
}

void Dataspace::block(bool replace, const std::vector<int64_t>& start,
                      const std::vector<int64_t>& count) {
  silence_errors();
  std::vector<int64_t> extents = dims();
  MPIGRAD_CHECK(start.size() == extents.size() && count.size() == extents.size(),
                "HDF5 selection in ", where_, ": block of rank ", start.size(),
                " for a space of rank ", extents.size());
  for (size_t d = 0; d < extents.size(); ++d) {
    MPIGRAD_CHECK(start[d] >= 0 && count[d] >= 0 && start[d] + count[d] <= extents[d],
                  "HDF5 selection in ", where_, ": block start ", Shape(start), " count ",
                  Shape(count), " exceeds extents ", Shape(extents));
  }
  std::vector<hsize_t> offsets(start.begin(), start.end()), counts(count.begin(), count.end());
  check(H5Sselect_hyperslab(id(), replace ? H5S_SELECT_SET : H5S_SELECT_OR, offsets.data(), nullptr,
                            counts.data(), nullptr),
        "H5Sselect_hyperslab", where_);
}

void Dataspace::select_block(const std::vector<int64_t>& start, const std::vector<int64_t>& count) {
  block(true, start, count);
}
void Dataspace::add_block(const std::vector<int64_t>& start, const std::vector<int64_t>& count) {
  block(false, start, count);
}

void Dataspace::select_rows(int64_t row, int64_t rows) {
  std::vector<int64_t> start, count;
  rows_block(dims(), row, rows, start, count);
  select_block(start, count);
}

void Dataspace::add_rows(int64_t row, int64_t rows) {
  std::vector<int64_t> start, count;
  rows_block(dims(), row, rows, start, count);
  add_block(start, count);
}

int64_t Dataspace::selected_elements() const {
  silence_errors();
  return check(H5Sget_select_npoints(id()), "H5Sget_select_npoints", where_);
}

}  // namespace mpigrad::core::hdf5
