// Reading and writing a dataset's elements (core/hdf5/dataset.h): whole, by rows of the leading
// dimension (the data loader's hot path, which reuses its dataspaces between calls), by block or
// by any selection, and as tensors.
#include <array>
#include <string>
#include <vector>

#include "mpigrad/core/checked_math.h"
#include "mpigrad/core/error.h"
#include "mpigrad/core/hdf5/dataset.h"
#include "mpigrad/core/hdf5/internal.h"
#include "mpigrad/core/tensor.h"

namespace mpigrad::core::hdf5 {

using namespace detail;  // the family's shared helpers (core/hdf5/internal.h)

void Dataset::read(void* out, DType memory_dtype) const {
  silence_errors();
  check(H5Dread(id(), memory_type(memory_dtype), H5S_ALL, H5S_ALL, H5P_DEFAULT, out), "H5Dread",
        where());
}

void Dataset::write(const void* data, DType memory_dtype) {
  silence_errors();
  check(H5Dwrite(id(), memory_type(memory_dtype), H5S_ALL, H5S_ALL, H5P_DEFAULT, data), "H5Dwrite",
        where());
}

void Dataset::read_selection(const Dataspace& file_space, void* out, DType memory_dtype) const {
  silence_errors();
  int64_t n = file_space.selected_elements();
  if (n == 0) return;
  check(
      H5Dread(id(), memory_type(memory_dtype), memory_space(n), file_space.id(), H5P_DEFAULT, out),
      "H5Dread", where());
}

void Dataset::read_block(const std::vector<int64_t>& start, const std::vector<int64_t>& count,
                         void* out, DType memory_dtype) const {
  Dataspace file_space = space();
  file_space.select_block(start, count);
  read_selection(file_space, out, memory_dtype);
}

void Dataset::write_block(const std::vector<int64_t>& start, const std::vector<int64_t>& count,
                          const void* data, DType memory_dtype) {
  silence_errors();
  Dataspace file_space = space();
  file_space.select_block(start, count);
  int64_t n = file_space.selected_elements();
  if (n == 0) return;
  Dataspace memory = Dataspace::simple({n});
  check(H5Dwrite(id(), memory_type(memory_dtype), memory.id(), file_space.id(), H5P_DEFAULT, data),
        "H5Dwrite", where());
}

void Dataset::read_rows(int64_t row, int64_t rows, void* out, DType memory_dtype) const {
  silence_errors();
  MPIGRAD_CHECK(!dims_.empty(), "HDF5 dataset ", where(), ": read_rows on a scalar dataset");
  MPIGRAD_CHECK(row >= 0 && rows >= 0 && row + rows <= dims_[0], "HDF5 dataset ", where(),
                ": rows [", row, ", ", row + rows, ") exceed the extents ", Shape(dims_));
  if (rows == 0) return;
  if (!read_space_.valid()) read_space_ = owned(H5Dget_space(id()), "H5Dget_space", where());
  std::array<hsize_t, H5S_MAX_RANK> start{}, count{};
  int64_t elements = rows;
  for (size_t d = 0; d < dims_.size(); ++d) {
    count[d] = hsize_t(dims_[d]);
    if (d > 0) elements = checked_mul(elements, dims_[d], "HDF5 dataset ", where(), ": rows");
  }
  start[0] = hsize_t(row);
  count[0] = hsize_t(rows);
  check(H5Sselect_hyperslab(read_space_.id(), H5S_SELECT_SET, start.data(), nullptr, count.data(),
                            nullptr),
        "H5Sselect_hyperslab", where());
  check(H5Dread(id(), memory_type(memory_dtype), memory_space(elements), read_space_.id(),
                H5P_DEFAULT, out),
        "H5Dread", where());
}

void Dataset::write_rows(int64_t row, int64_t rows, const void* data, DType memory_dtype) {
  if (rows == 0) return;
  std::vector<int64_t> start, count;
  rows_block(dims(), row, rows, start, count);
  write_block(start, count, data, memory_dtype);
}

Tensor Dataset::read_tensor() const {
  DType stored = dtype();
  Tensor tensor = Tensor::empty(shape(), stored);
  if (tensor.numel() > 0) read(tensor.data_ptr(), stored);
  return tensor;
}

void Dataset::write_tensor(const Tensor& tensor) {
  Tensor dense = tensor.to(kCPU).contiguous();
  MPIGRAD_CHECK(dense.shape() == shape(), "HDF5 dataset ", where(), ": writing a tensor of shape ",
                dense.shape(), " into a dataset of shape ", shape());
  if (dense.numel() > 0) write(dense.data_ptr(), dense.dtype());
}

}  // namespace mpigrad::core::hdf5
