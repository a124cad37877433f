// What an opened dataset holds (core/hdf5/dataset.h): its extents, its element type and how its
// data is stored (layout, bytes allocated, chunks), checked so that a corrupt file's sizes cannot
// overflow. Moving the elements themselves is in dataset_io.cpp.
#include "mpigrad/core/hdf5/dataset.h"

#include <array>
#include <optional>
#include <string>

#include "mpigrad/core/checked_math.h"
#include "mpigrad/core/error.h"
#include "mpigrad/core/hdf5/internal.h"

namespace mpigrad::core::hdf5 {

using namespace detail;  // the family's shared helpers (core/hdf5/internal.h)

Dataset::Dataset(Handle handle, std::string file_path, std::string name)
    : handle_(std::move(handle)), file_path_(std::move(file_path)), name_(std::move(name)) {
  if (handle_.valid()) dims_ = space().dims();
}

Hid Dataset::memory_space(int64_t elements) const {
  if (memory_elements_ != elements) {
    hsize_t extent = hsize_t(elements);
    if (memory_space_.valid()) {
      check(H5Sset_extent_simple(memory_space_.id(), 1, &extent, nullptr), "H5Sset_extent_simple",
            where());
    } else {
      memory_space_ = owned(H5Screate_simple(1, &extent, nullptr), "H5Screate_simple", where());
    }
    memory_elements_ = elements;
  }
  return memory_space_.id();
}

std::string Dataset::where() const {
  return join_where(file_path_, name_);
}

Dataspace Dataset::space() const {
  silence_errors();
  return Dataspace(owned(H5Dget_space(id()), "H5Dget_space", where()), where());
}

int64_t Dataset::num_elements() const {
  // The extents are the file's: a corrupt one may make their product overflow.
  int64_t elements = 1;
  for (int64_t extent : dims_) {
    elements = checked_mul(elements, extent, "HDF5 dataset ", where(), ": its extents ",
                           Shape(dims_), " hold more elements than int64 counts");
  }
  return elements;
}

Datatype Dataset::file_type() const {
  silence_errors();
  return Datatype(owned(H5Dget_type(id()), "H5Dget_type", where()));
}

DType Dataset::dtype() const {
  Datatype type = file_type();
  std::optional<DType> dtype = type.to_dtype();
  MPIGRAD_CHECK(dtype.has_value(), "HDF5 dataset ", where(), ": unsupported element type ",
                type.describe(),
                " (supported: float32, float64, float16, bfloat16, int32, int64, uint8, bool)");
  return *dtype;
}

DType Dataset::read_dtype() const {
  Datatype type = file_type();
  std::optional<DType> dtype = type.read_as();
  MPIGRAD_CHECK(dtype.has_value(), "HDF5 dataset ", where(), ": unsupported element type ",
                type.describe(),
                " (supported: floats of 16, 32 and 64 bits and integers of up "
                "to 64 bits; strings, compounds and other types cannot be read as tensors)");
  return *dtype;
}

Dataset::Storage Dataset::storage() const {
  silence_errors();
  Storage out;
  Handle plist = owned(H5Dget_create_plist(id()), "H5Dget_create_plist", where());
  out.declared_bytes =
      checked_mul(num_elements(), int64_t(H5Tget_size(file_type().id())), "HDF5 dataset ", where(),
                  ": the bytes of its extents ", Shape(dims_));
  out.stored_bytes = int64_t(H5Dget_storage_size(id()));
  switch (check(H5Pget_layout(plist.id()), "H5Pget_layout", where())) {
    case H5D_COMPACT:
      out.layout = Storage::Layout::Compact;
      break;
    case H5D_VIRTUAL:
      out.layout = Storage::Layout::Virtual;
      break;
    case H5D_CHUNKED:
      out.layout = Storage::Layout::Chunked;
      break;
    default:
      out.layout = Storage::Layout::Contiguous;
      break;
  }
  if (out.layout == Storage::Layout::Contiguous &&
      check(H5Pget_external_count(plist.id()), "H5Pget_external_count", where()) > 0) {
    out.layout = Storage::Layout::External;
  }
  if (out.layout == Storage::Layout::Contiguous) {
    haddr_t offset = H5Dget_offset(id());  // HADDR_UNDEF until the data is allocated
    if (offset != HADDR_UNDEF) out.end_offset = int64_t(offset) + out.stored_bytes;
  }
  if (out.layout == Storage::Layout::Chunked) {
    std::array<hsize_t, H5S_MAX_RANK> chunk{};
    int rank = check(H5Pget_chunk(plist.id(), H5S_MAX_RANK, chunk.data()), "H5Pget_chunk", where());
    out.chunks_needed = 1;
    for (int d = 0; d < rank && d < int(dims_.size()); ++d) {
      int64_t extent = dims_[size_t(d)], per_chunk = int64_t(chunk[size_t(d)]);
      out.chunks_needed =
          checked_mul(out.chunks_needed, per_chunk > 0 ? ceil_div(extent, per_chunk) : 0,
                      "HDF5 dataset ", where(), ": the chunks of its extents");
    }
    // Counting walks the chunk index, so it is done only when the bytes alone do not settle it
    // (filtered data, or chunks that were never written).
    if (out.stored_bytes < out.declared_bytes) {
      hsize_t stored = 0;
      Dataspace all = space();
      check(H5Dget_num_chunks(id(), all.id(), &stored), "H5Dget_num_chunks", where());
      out.chunks_stored = int64_t(stored);
    }
  }
  return out;
}

int64_t Dataset::chunk_rows() const {
  silence_errors();
  Handle plist = owned(H5Dget_create_plist(id()), "H5Dget_create_plist", where());
  if (H5Pget_layout(plist.id()) != H5D_CHUNKED) return 0;
  std::array<hsize_t, H5S_MAX_RANK> chunk{};
  int rank = check(H5Pget_chunk(plist.id(), H5S_MAX_RANK, chunk.data()), "H5Pget_chunk", where());
  return rank > 0 ? int64_t(chunk[0]) : 0;
}

int64_t Dataset::chunk_bytes() const {
  silence_errors();
  Handle plist = owned(H5Dget_create_plist(id()), "H5Dget_create_plist", where());
  if (H5Pget_layout(plist.id()) != H5D_CHUNKED) return 0;
  std::array<hsize_t, H5S_MAX_RANK> chunk{};
  int rank = check(H5Pget_chunk(plist.id(), H5S_MAX_RANK, chunk.data()), "H5Pget_chunk", where());
  int64_t bytes = int64_t(H5Tget_size(file_type().id()));
  for (int d = 0; d < rank; ++d) {
    bytes = checked_mul(bytes, int64_t(chunk[size_t(d)]), "HDF5 dataset ", where(),
                        ": the bytes of one chunk");
  }
  return bytes;
}

}  // namespace mpigrad::core::hdf5
