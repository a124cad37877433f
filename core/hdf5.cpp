#include "mpigrad/core/hdf5.h"

#include <fcntl.h>
#include <hdf5.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <system_error>

#include "mpigrad/core/checked_math.h"
#include "mpigrad/core/error.h"

static_assert(sizeof(hid_t) == sizeof(mpigrad::core::hdf5::Hid),
              "core/hdf5.h carries hid_t as int64_t; this HDF5 uses another width");

namespace mpigrad::core::hdf5 {

namespace {

// ---- Errors -------------------------------------------------------------------------------------

herr_t collect_error(unsigned index, const H5E_error2_t* error, void* data) {
  auto* messages = static_cast<std::vector<std::string>*>(data);
  if (index < 8 && error->desc != nullptr && error->desc[0] != '\0') {
    std::string text = error->desc;
    if (std::find(messages->begin(), messages->end(), text) == messages->end()) {
      messages->push_back(std::move(text));
    }
  }
  return 0;
}

// The messages on this thread's HDF5 error stack, innermost cause last; clears the stack.
std::string take_error_stack() {
  std::vector<std::string> messages;
  hid_t stack = H5Eget_current_stack();
  if (stack >= 0) {
    H5Ewalk2(stack, H5E_WALK_DOWNWARD, collect_error, &messages);
    H5Eclose_stack(stack);
  }
  std::string text;
  for (const auto& message : messages) text += (text.empty() ? "" : "; ") + message;
  return text.empty() ? "no detail from HDF5" : text;
}

[[noreturn]] void fail_call(const char* call, const std::string& where) {
  fail("HDF5 ", call, " failed for ", where, ": ", take_error_stack());
}

// Checks an HDF5 return value (negative means failure).
template <typename T>
T check(T result, const char* call, const std::string& where) {
  if (result < 0) [[unlikely]] fail_call(call, where);
  return result;
}

Handle owned(hid_t id, const char* call, const std::string& where) {
  return Handle(check(id, call, where));
}

std::string absolute_path(const std::string& object_path) {
  if (object_path.empty()) return "/";
  return object_path[0] == '/' ? object_path : "/" + object_path;
}

std::string join_where(const std::string& file, const std::string& object) {
  return file + ":" + object;
}

// ---- Types --------------------------------------------------------------------------------------

hid_t make_16bit_float(size_t exponent_bits, size_t mantissa_bits, size_t bias) {
  // As h5py builds its float16: start from IEEE float32 and narrow the fields.
  hid_t type = H5Tcopy(H5T_IEEE_F32LE);
  if (type < 0) return type;
  if (H5Tset_fields(type, 15, mantissa_bits, exponent_bits, 0, mantissa_bits) < 0 ||
      H5Tset_size(type, 2) < 0 || H5Tset_precision(type, 16) < 0 || H5Tset_ebias(type, bias) < 0) {
    H5Tclose(type);
    return -1;
  }
  return type;
}

hid_t make_type(DType dtype) {
  switch (dtype) {
    case DType::Float32: return H5Tcopy(H5T_NATIVE_FLOAT);
    case DType::Float64: return H5Tcopy(H5T_NATIVE_DOUBLE);
    case DType::Int32: return H5Tcopy(H5T_NATIVE_INT32);
    case DType::Int64: return H5Tcopy(H5T_NATIVE_INT64);
    case DType::UInt8: return H5Tcopy(H5T_NATIVE_UINT8);
    case DType::Float16: return make_16bit_float(5, 10, 15);
    case DType::BFloat16: return make_16bit_float(8, 7, 127);
    case DType::Bool: {
      hid_t type = H5Tenum_create(H5T_NATIVE_INT8);
      if (type < 0) return type;
      int8_t no = 0, yes = 1;
      if (H5Tenum_insert(type, "FALSE", &no) < 0 || H5Tenum_insert(type, "TRUE", &yes) < 0) {
        H5Tclose(type);
        return -1;
      }
      return type;
    }
  }
  return -1;
}

// In-memory types are built once per process and shared: reads are hot and a type is immutable.
hid_t memory_type(DType dtype) {
  static std::once_flag once;
  static std::array<hid_t, kernels::kNumDTypes> types{};
  std::call_once(once, [] {
    silence_errors();
    for (int d = 0; d < kernels::kNumDTypes; ++d) types[size_t(d)] = make_type(DType(d));
  });
  hid_t type = types[size_t(dtype)];
  if (type < 0) fail("HDF5: could not build the in-memory type for ", dtype, ": ", take_error_stack());
  return type;
}

}  // namespace

void silence_errors() {
  thread_local bool silenced = false;
  if (!silenced) {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    silenced = true;
  }
}

std::string library_version() {
  unsigned major = 0, minor = 0, release = 0;
  H5get_libversion(&major, &minor, &release);
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(release);
}

// ---- Handle -------------------------------------------------------------------------------------

namespace {
herr_t close_id(hid_t id) {
  switch (H5Iget_type(id)) {
    case H5I_FILE: return H5Fclose(id);
    case H5I_GROUP: return H5Gclose(id);
    case H5I_DATASET: return H5Dclose(id);
    case H5I_DATASPACE: return H5Sclose(id);
    case H5I_DATATYPE: return H5Tclose(id);
    case H5I_ATTR: return H5Aclose(id);
    case H5I_GENPROP_LST: return H5Pclose(id);
    case H5I_ERROR_STACK: return H5Eclose_stack(id);
    default: return H5Idec_ref(id) < 0 ? -1 : 0;
  }
}
}  // namespace

Handle::~Handle() {
  if (id_ >= 0) {
    silence_errors();
    if (close_id(id_) < 0) H5Eclear2(H5E_DEFAULT);
  }
}

Handle& Handle::operator=(Handle&& other) noexcept {
  if (this != &other) {
    Handle dying(id_);
    id_ = other.id_;
    other.id_ = -1;
  }
  return *this;
}

void Handle::close() {
  if (id_ < 0) return;
  silence_errors();
  hid_t id = id_;
  id_ = -1;
  check(close_id(id), "H5*close", "identifier " + std::to_string(id));
}

// ---- Datatype -----------------------------------------------------------------------------------

Datatype Datatype::of(DType dtype) {
  silence_errors();
  return Datatype(owned(make_type(dtype), "H5Tcopy", std::string("type ") + std::string(dtype_name(dtype))));
}

Datatype Datatype::fixed_string(size_t length) {
  silence_errors();
  Handle type = owned(H5Tcopy(H5T_C_S1), "H5Tcopy", "string type");
  check(H5Tset_size(type.id(), std::max<size_t>(length, 1)), "H5Tset_size", "string type");
  check(H5Tset_strpad(type.id(), H5T_STR_NULLTERM), "H5Tset_strpad", "string type");
  check(H5Tset_cset(type.id(), H5T_CSET_UTF8), "H5Tset_cset", "string type");
  return Datatype(std::move(type));
}

std::optional<DType> Datatype::to_dtype() const {
  silence_errors();
  hid_t type = id();
  size_t size = H5Tget_size(type);
  switch (H5Tget_class(type)) {
    case H5T_INTEGER: {
      bool is_signed = H5Tget_sign(type) == H5T_SGN_2;
      if (size == 1 && !is_signed) return DType::UInt8;
      if (size == 4 && is_signed) return DType::Int32;
      if (size == 8 && is_signed) return DType::Int64;
      return std::nullopt;
    }
    case H5T_FLOAT: {
      if (size == 4) return DType::Float32;
      if (size == 8) return DType::Float64;
      if (size == 2) {
        size_t bias = H5Tget_ebias(type);
        if (bias == 15) return DType::Float16;
        if (bias == 127) return DType::BFloat16;
      }
      return std::nullopt;
    }
    case H5T_ENUM: {
      // h5py's bool: an enum over a 1-byte integer with the two members FALSE and TRUE.
      if (size == 1 && H5Tget_nmembers(type) == 2) return DType::Bool;
      return std::nullopt;
    }
    default: return std::nullopt;
  }
}

std::optional<DType> Datatype::read_as() const {
  if (std::optional<DType> exact = to_dtype()) return exact;
  silence_errors();
  hid_t type = id();
  if (H5Tget_class(type) != H5T_INTEGER) return std::nullopt;
  size_t size = H5Tget_size(type);
  // int8, int16 and uint16 fit in int32; uint32 and uint64 go to int64.
  if (size < 4) return DType::Int32;
  if (size <= 8) return DType::Int64;
  return std::nullopt;
}

std::string Datatype::describe() const {
  silence_errors();
  hid_t type = id();
  size_t size = H5Tget_size(type);
  std::string text;
  switch (H5Tget_class(type)) {
    case H5T_INTEGER:
      text = (H5Tget_sign(type) == H5T_SGN_2 ? "int" : "uint") + std::to_string(size * 8);
      break;
    case H5T_FLOAT: text = "float" + std::to_string(size * 8); break;
    case H5T_STRING: return "string";
    case H5T_COMPOUND: return "compound";
    case H5T_ENUM: return "enum of " + std::to_string(H5Tget_nmembers(type)) + " members";
    case H5T_ARRAY: return "array";
    case H5T_VLEN: return "variable-length sequence";
    case H5T_OPAQUE: return "opaque";
    case H5T_REFERENCE: return "reference";
    case H5T_BITFIELD: return "bitfield" + std::to_string(size * 8);
    default: return "unknown HDF5 type";
  }
  if (H5Tget_order(type) == H5T_ORDER_BE) text += " (big-endian)";
  return text;
}

// ---- Dataspace ----------------------------------------------------------------------------------

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
  if (rank > 0) check(H5Sget_simple_extent_dims(id(), extents.data(), nullptr), "H5Sget_simple_extent_dims", where_);
  return {extents.begin(), extents.end()};
}

void Dataspace::block(bool replace, const std::vector<int64_t>& start, const std::vector<int64_t>& count) {
  silence_errors();
  std::vector<int64_t> extents = dims();
  MPIGRAD_CHECK(start.size() == extents.size() && count.size() == extents.size(), "HDF5 selection in ",
                where_, ": block of rank ", start.size(), " for a space of rank ", extents.size());
  for (size_t d = 0; d < extents.size(); ++d) {
    MPIGRAD_CHECK(start[d] >= 0 && count[d] >= 0 && start[d] + count[d] <= extents[d], "HDF5 selection in ",
                  where_, ": block start ", Shape(start), " count ", Shape(count), " exceeds extents ",
                  Shape(extents));
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

namespace {
void rows_block(const std::vector<int64_t>& extents, int64_t row, int64_t rows, std::vector<int64_t>& start,
                std::vector<int64_t>& count) {
  start.assign(extents.size(), 0);
  count = extents;
  if (!extents.empty()) {
    start[0] = row;
    count[0] = rows;
  }
}
}  // namespace

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

// ---- Dataset ------------------------------------------------------------------------------------

Dataset::Dataset(Handle handle, std::string file_path, std::string name)
    : handle_(std::move(handle)), file_path_(std::move(file_path)), name_(std::move(name)) {
  if (handle_.valid()) dims_ = space().dims();
}

Hid Dataset::memory_space(int64_t elements) const {
  if (memory_elements_ != elements) {
    hsize_t extent = hsize_t(elements);
    if (memory_space_.valid()) {
      check(H5Sset_extent_simple(memory_space_.id(), 1, &extent, nullptr), "H5Sset_extent_simple", where());
    } else {
      memory_space_ = owned(H5Screate_simple(1, &extent, nullptr), "H5Screate_simple", where());
    }
    memory_elements_ = elements;
  }
  return memory_space_.id();
}

std::string Dataset::where() const { return join_where(file_path_, name_); }

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
  MPIGRAD_CHECK(dtype.has_value(), "HDF5 dataset ", where(), ": unsupported element type ", type.describe(),
                " (supported: float32, float64, float16, bfloat16, int32, int64, uint8, bool)");
  return *dtype;
}

DType Dataset::read_dtype() const {
  Datatype type = file_type();
  std::optional<DType> dtype = type.read_as();
  MPIGRAD_CHECK(dtype.has_value(), "HDF5 dataset ", where(), ": unsupported element type ",
                type.describe(), " (supported: floats of 16, 32 and 64 bits and integers of up "
                "to 64 bits; strings, compounds and other types cannot be read as tensors)");
  return *dtype;
}

Dataset::Storage Dataset::storage() const {
  silence_errors();
  Storage out;
  Handle plist = owned(H5Dget_create_plist(id()), "H5Dget_create_plist", where());
  out.declared_bytes = checked_mul(num_elements(), int64_t(H5Tget_size(file_type().id())),
                                   "HDF5 dataset ", where(), ": the bytes of its extents ",
                                   Shape(dims_));
  out.stored_bytes = int64_t(H5Dget_storage_size(id()));
  switch (check(H5Pget_layout(plist.id()), "H5Pget_layout", where())) {
    case H5D_COMPACT: out.layout = Storage::Layout::Compact; break;
    case H5D_VIRTUAL: out.layout = Storage::Layout::Virtual; break;
    case H5D_CHUNKED: out.layout = Storage::Layout::Chunked; break;
    default: out.layout = Storage::Layout::Contiguous; break;
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
      out.chunks_needed = checked_mul(out.chunks_needed,
                                      per_chunk > 0 ? ceil_div(extent, per_chunk) : 0,
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

void Dataset::read(void* out, DType memory_dtype) const {
  silence_errors();
  check(H5Dread(id(), memory_type(memory_dtype), H5S_ALL, H5S_ALL, H5P_DEFAULT, out), "H5Dread", where());
}

void Dataset::write(const void* data, DType memory_dtype) {
  silence_errors();
  check(H5Dwrite(id(), memory_type(memory_dtype), H5S_ALL, H5S_ALL, H5P_DEFAULT, data), "H5Dwrite", where());
}

void Dataset::read_selection(const Dataspace& file_space, void* out, DType memory_dtype) const {
  silence_errors();
  int64_t n = file_space.selected_elements();
  if (n == 0) return;
  check(H5Dread(id(), memory_type(memory_dtype), memory_space(n), file_space.id(), H5P_DEFAULT, out), "H5Dread",
        where());
}

void Dataset::read_block(const std::vector<int64_t>& start, const std::vector<int64_t>& count, void* out,
                         DType memory_dtype) const {
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
  MPIGRAD_CHECK(row >= 0 && rows >= 0 && row + rows <= dims_[0], "HDF5 dataset ", where(), ": rows [", row, ", ",
                row + rows, ") exceed the extents ", Shape(dims_));
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
  check(H5Sselect_hyperslab(read_space_.id(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr),
        "H5Sselect_hyperslab", where());
  check(H5Dread(id(), memory_type(memory_dtype), memory_space(elements), read_space_.id(), H5P_DEFAULT, out),
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

// ---- File ---------------------------------------------------------------------------------------

File File::open(const std::string& path, Mode mode) {
  silence_errors();
  std::error_code error;
  MPIGRAD_CHECK(std::filesystem::exists(path, error), "HDF5 file ", path, ": no such file");
  MPIGRAD_CHECK(!std::filesystem::is_directory(path, error), "HDF5 file ", path, ": is a directory");
  htri_t is_hdf5 = H5Fis_hdf5(path.c_str());
  if (is_hdf5 == 0) fail("HDF5 file ", path, ": not an HDF5 file (no HDF5 signature; corrupt or another format)");
  if (is_hdf5 < 0) fail_call("H5Fis_hdf5", path);
  hid_t id = H5Fopen(path.c_str(), mode == Mode::ReadOnly ? H5F_ACC_RDONLY : H5F_ACC_RDWR, H5P_DEFAULT);
  if (id < 0) {
    std::string detail = take_error_stack();
    fail("HDF5 H5Fopen failed for ", path, " (truncated or corrupt file?): ", detail);
  }
  return File(Handle(id), path);
}

File File::open_image(const void* bytes, size_t size, const std::string& name) {
  silence_errors();
  MPIGRAD_CHECK(bytes != nullptr && size > 0, "HDF5 file image ", name, ": empty");
  Handle access = owned(H5Pcreate(H5P_FILE_ACCESS), "H5Pcreate", name);
  check(H5Pset_fapl_core(access.id(), 64 << 10, /*backing_store=*/false), "H5Pset_fapl_core", name);
  // HDF5 copies the image; it never writes through the pointer, despite the non-const type.
  check(H5Pset_file_image(access.id(), const_cast<void*>(bytes), size), "H5Pset_file_image", name);
  hid_t id = H5Fopen(name.c_str(), H5F_ACC_RDONLY, access.id());
  if (id < 0) {
    std::string detail = take_error_stack();
    fail("HDF5 H5Fopen failed for the in-memory image ", name, " of ", size,
         " bytes (not HDF5, truncated or corrupt?): ", detail);
  }
  return File(Handle(id), name);
}

File File::create(const std::string& path) {
  silence_errors();
  return File(owned(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), "H5Fcreate", path),
              path);
}

void File::close() {
  if (!handle_.valid()) return;
  flush();
  handle_.close();
}

int64_t File::size_on_disk() const {
  silence_errors();
  hsize_t size = 0;
  check(H5Fget_filesize(id(), &size), "H5Fget_filesize", path_);
  return int64_t(size);
}

void File::flush() {
  silence_errors();
  MPIGRAD_CHECK(handle_.valid(), "HDF5: flush on a closed file ", path_);
  check(H5Fflush(id(), H5F_SCOPE_LOCAL), "H5Fflush", path_);
}

ObjectKind File::kind(const std::string& object_path) const {
  silence_errors();
  std::string path = absolute_path(object_path);
  if (path == "/") return ObjectKind::Group;
  // H5Lexists fails (rather than answering no) when a parent is missing, so walk the parents.
  for (size_t slash = path.find('/', 1);; slash = path.find('/', slash + 1)) {
    std::string prefix = path.substr(0, slash);
    htri_t exists = check(H5Lexists(id(), prefix.c_str(), H5P_DEFAULT), "H5Lexists", join_where(path_, prefix));
    if (exists == 0) return ObjectKind::Missing;
    if (slash == std::string::npos) break;
  }
  Handle object = owned(H5Oopen(id(), path.c_str(), H5P_DEFAULT), "H5Oopen", join_where(path_, path));
  switch (H5Iget_type(object.id())) {
    case H5I_GROUP: return ObjectKind::Group;
    case H5I_DATASET: return ObjectKind::Dataset;
    default: return ObjectKind::Other;
  }
}

void File::create_group(const std::string& group_path) {
  silence_errors();
  std::string path = absolute_path(group_path);
  ObjectKind existing = kind(path);
  if (existing == ObjectKind::Group) return;
  MPIGRAD_CHECK(existing == ObjectKind::Missing, "HDF5 file ", path_, ": cannot create group ", path,
                ": a non-group object has that name");
  Handle lcpl = owned(H5Pcreate(H5P_LINK_CREATE), "H5Pcreate", path_);
  check(H5Pset_create_intermediate_group(lcpl.id(), 1), "H5Pset_create_intermediate_group", path_);
  Handle group = owned(H5Gcreate2(id(), path.c_str(), lcpl.id(), H5P_DEFAULT, H5P_DEFAULT), "H5Gcreate2",
                       join_where(path_, path));
}

std::vector<std::string> File::list(const std::string& group_path) const {
  silence_errors();
  std::string path = absolute_path(group_path);
  MPIGRAD_CHECK(kind(path) == ObjectKind::Group, "HDF5 file ", path_, ": no group ", path);
  std::string where = join_where(path_, path);
  Handle group = owned(H5Gopen2(id(), path.c_str(), H5P_DEFAULT), "H5Gopen2", where);
  H5G_info_t info;
  check(H5Gget_info(group.id(), &info), "H5Gget_info", where);
  std::vector<std::string> names;
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    ssize_t length = check(H5Lget_name_by_idx(group.id(), ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0,
                                              H5P_DEFAULT),
                           "H5Lget_name_by_idx", where);
    std::string name(size_t(length) + 1, '\0');
    check(H5Lget_name_by_idx(group.id(), ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(), name.size(),
                             H5P_DEFAULT),
          "H5Lget_name_by_idx", where);
    name.resize(size_t(length));
    names.push_back(std::move(name));
  }
  std::sort(names.begin(), names.end());
  return names;
}

namespace {
// Where an object lives: its file and its address there (a token from HDF5 1.12 on). Two links
// lead to the same group exactly when these are equal.
using ObjectKey = std::pair<unsigned long, std::string>;

ObjectKey object_key(hid_t object, const std::string& where) {
#if H5_VERSION_GE(1, 12, 0)
  H5O_info2_t info;
  check(H5Oget_info3(object, &info, H5O_INFO_BASIC), "H5Oget_info3", where);
  return {info.fileno, std::string(reinterpret_cast<const char*>(&info.token), sizeof(info.token))};
#else
  H5O_info_t info;
  check(H5Oget_info2(object, &info, H5O_INFO_BASIC), "H5Oget_info2", where);
  return {info.fileno, std::string(reinterpret_cast<const char*>(&info.addr), sizeof(info.addr))};
#endif
}
}  // namespace

std::vector<std::string> File::list_datasets_recursive(const std::string& group_path) const {
  return walk_groups(group_path).datasets;
}

File::GroupWalk File::walk_groups(const std::string& group_path) const {
  silence_errors();
  GroupWalk walk;
  std::vector<ObjectKey> ancestors;  // the groups on the current path, the root first
  std::set<ObjectKey> walked;
  auto key_of = [&](const std::string& path) {
    std::string where = join_where(path_, path);
    Handle object = owned(H5Oopen(id(), path.c_str(), H5P_DEFAULT), "H5Oopen", where);
    return object_key(object.id(), where);
  };
  // Recursion is bounded by kMaxGroupDepth, so the stack is too.
  auto visit = [&](auto& self, const std::string& path, int depth) -> void {
    MPIGRAD_CHECK(depth <= kMaxGroupDepth, "HDF5 file ", path_, ": groups nested deeper than ",
                  kMaxGroupDepth, " levels, at ", path.substr(0, 200),
                  path.size() > 200 ? "..." : "", " (a corrupt or hostile file?)");
    ancestors.push_back(key_of(path));
    walked.insert(ancestors.back());
    for (const std::string& name : list(path)) {
      std::string child = (path == "/" ? "/" : path + "/") + name;
      ObjectKind child_kind = kind(child);
      if (child_kind == ObjectKind::Dataset) {
        walk.datasets.push_back(child);
      } else if (child_kind == ObjectKind::Group) {
        ObjectKey key = key_of(child);
        if (std::find(ancestors.begin(), ancestors.end(), key) != ancestors.end()) {
          walk.ancestor_links.push_back(child);
        } else if (walked.count(key) > 0) {
          walk.repeated_links.push_back(child);
        } else {
          self(self, child, depth + 1);
        }
      }
    }
    ancestors.pop_back();
  };
  std::string path = absolute_path(group_path);
  MPIGRAD_CHECK(kind(path) == ObjectKind::Group, "HDF5 file ", path_, ": no group ", path);
  visit(visit, path, 0);
  std::sort(walk.datasets.begin(), walk.datasets.end());
  return walk;
}

Dataset File::open_dataset(const std::string& name, const DatasetAccess& access) const {
  silence_errors();
  std::string path = absolute_path(name);
  ObjectKind object = kind(path);
  if (object != ObjectKind::Dataset) {
    std::string present;
    std::string parent = path.substr(0, path.rfind('/'));
    if (kind(parent.empty() ? "/" : parent) == ObjectKind::Group) {
      for (const auto& member : list(parent.empty() ? "/" : parent)) present += (present.empty() ? "" : ", ") + member;
    }
    fail("HDF5 file ", path_, ": ", object == ObjectKind::Missing ? "no dataset " : "not a dataset: ", path,
         " (present: ", present.empty() ? "nothing" : present, ")");
  }
  std::string where = join_where(path_, path);
  Handle dapl = owned(H5Pcreate(H5P_DATASET_ACCESS), "H5Pcreate", where);
  if (access.chunk_cache_bytes > 0) {
    size_t slots = access.chunk_cache_slots > 0 ? size_t(access.chunk_cache_slots) : H5D_CHUNK_CACHE_NSLOTS_DEFAULT;
    check(H5Pset_chunk_cache(dapl.id(), slots, size_t(access.chunk_cache_bytes), access.chunk_cache_w0),
          "H5Pset_chunk_cache", where);
  }
  return Dataset(owned(H5Dopen2(id(), path.c_str(), dapl.id()), "H5Dopen2", where), path_, path);
}

Dataset File::create_dataset(const std::string& name, DType dtype, const std::vector<int64_t>& dims,
                             const DatasetLayout& layout) {
  silence_errors();
  std::string path = absolute_path(name);
  std::string where = join_where(path_, path);
  MPIGRAD_CHECK(kind(path) == ObjectKind::Missing, "HDF5 file ", path_, ": cannot create dataset ", path,
                ": it already exists");
  MPIGRAD_CHECK(layout.gzip_level == 0 || layout.chunk_rows > 0, "HDF5 dataset ", where,
                ": gzip compression needs a chunked layout (chunk_rows > 0)");
  MPIGRAD_CHECK(layout.gzip_level >= 0 && layout.gzip_level <= 9, "HDF5 dataset ", where,
                ": gzip level must be 0..9, got ", layout.gzip_level);
  for (int64_t extent : dims) MPIGRAD_CHECK(extent >= 0, "HDF5 dataset ", where, ": negative extent in ", Shape(dims));

  Handle dcpl = owned(H5Pcreate(H5P_DATASET_CREATE), "H5Pcreate", where);
  Handle space;
  bool chunked = layout.chunk_rows > 0 && !dims.empty();
  if (chunked) {
    // Chunked datasets get an unlimited leading dimension so they can be appended to later.
    std::vector<hsize_t> extents(dims.begin(), dims.end()), max_extents = extents, chunk = extents;
    max_extents[0] = H5S_UNLIMITED;
    chunk[0] = hsize_t(layout.chunk_rows);
    for (auto& c : chunk) c = std::max<hsize_t>(c, 1);
    check(H5Pset_chunk(dcpl.id(), int(chunk.size()), chunk.data()), "H5Pset_chunk", where);
    if (layout.gzip_level > 0) check(H5Pset_deflate(dcpl.id(), unsigned(layout.gzip_level)), "H5Pset_deflate", where);
    space = owned(H5Screate_simple(int(extents.size()), extents.data(), max_extents.data()), "H5Screate_simple",
                  where);
  } else if (dims.empty()) {
    space = owned(H5Screate(H5S_SCALAR), "H5Screate", where);
  } else {
    std::vector<hsize_t> extents(dims.begin(), dims.end());
    space = owned(H5Screate_simple(int(extents.size()), extents.data(), nullptr), "H5Screate_simple", where);
  }
  Handle lcpl = owned(H5Pcreate(H5P_LINK_CREATE), "H5Pcreate", where);
  check(H5Pset_create_intermediate_group(lcpl.id(), 1), "H5Pset_create_intermediate_group", where);
  Datatype type = Datatype::of(dtype);
  return Dataset(owned(H5Dcreate2(id(), path.c_str(), type.id(), space.id(), lcpl.id(), dcpl.id(), H5P_DEFAULT),
                       "H5Dcreate2", where),
                 path_, path);
}

Dataset File::write_tensor(const std::string& name, const Tensor& tensor, const DatasetLayout& layout) {
  Dataset dataset = create_dataset(name, tensor.dtype(), tensor.shape().vec(), layout);
  dataset.write_tensor(tensor);
  return dataset;
}

// ---- Attributes ---------------------------------------------------------------------------------

Handle File::open_object(const std::string& object_path) const {
  silence_errors();
  std::string path = absolute_path(object_path);
  MPIGRAD_CHECK(kind(path) != ObjectKind::Missing, "HDF5 file ", path_, ": no object ", path);
  return owned(H5Oopen(id(), path.c_str(), H5P_DEFAULT), "H5Oopen", join_where(path_, path));
}

bool File::has_attribute(const std::string& object_path, const std::string& name) const {
  Handle object = open_object(object_path);
  return check(H5Aexists(object.id(), name.c_str()), "H5Aexists",
               join_where(path_, absolute_path(object_path)) + " attribute " + name) > 0;
}

namespace {
herr_t collect_attribute(hid_t, const char* name, const H5A_info_t*, void* data) {
  static_cast<std::vector<std::string>*>(data)->emplace_back(name);
  return 0;
}
}  // namespace

std::vector<std::string> File::list_attributes(const std::string& object_path) const {
  Handle object = open_object(object_path);
  std::vector<std::string> names;
  hsize_t position = 0;
  check(H5Aiterate2(object.id(), H5_INDEX_NAME, H5_ITER_INC, &position, collect_attribute, &names), "H5Aiterate2",
        join_where(path_, absolute_path(object_path)));
  return names;
}

Handle File::open_attribute(const std::string& object_path, const std::string& name) const {
  std::string where = join_where(path_, absolute_path(object_path)) + " attribute '" + name + "'";
  MPIGRAD_CHECK(has_attribute(object_path, name), "HDF5 ", where, ": no such attribute");
  Handle object = open_object(object_path);
  return owned(H5Aopen(object.id(), name.c_str(), H5P_DEFAULT), "H5Aopen", where);
}

void File::write_scalar_attribute(const std::string& object_path, const std::string& name, const Datatype& type,
                                  const void* value) {
  std::string where = join_where(path_, absolute_path(object_path)) + " attribute '" + name + "'";
  Handle object = open_object(object_path);
  if (check(H5Aexists(object.id(), name.c_str()), "H5Aexists", where) > 0) {
    check(H5Adelete(object.id(), name.c_str()), "H5Adelete", where);
  }
  Handle space = owned(H5Screate(H5S_SCALAR), "H5Screate", where);
  Handle attribute = owned(H5Acreate2(object.id(), name.c_str(), type.id(), space.id(), H5P_DEFAULT, H5P_DEFAULT),
                           "H5Acreate2", where);
  check(H5Awrite(attribute.id(), type.id(), value), "H5Awrite", where);
}

void File::write_attribute(const std::string& object_path, const std::string& name, const std::string& value) {
  // Variable-length UTF-8, which h5py reads back as str.
  silence_errors();
  Handle type = owned(H5Tcopy(H5T_C_S1), "H5Tcopy", path_);
  check(H5Tset_size(type.id(), H5T_VARIABLE), "H5Tset_size", path_);
  check(H5Tset_cset(type.id(), H5T_CSET_UTF8), "H5Tset_cset", path_);
  const char* text = value.c_str();
  write_scalar_attribute(object_path, name, Datatype(std::move(type)), &text);
}

void File::write_attribute(const std::string& object_path, const std::string& name, int64_t value) {
  write_scalar_attribute(object_path, name, Datatype::of(kInt64), &value);
}

void File::write_attribute(const std::string& object_path, const std::string& name, double value) {
  write_scalar_attribute(object_path, name, Datatype::of(kFloat64), &value);
}

namespace {

// An attribute's dataspace: its extents and element count (0 for HDF5's null dataspace).
struct AttributeSpace {
  Handle handle;
  std::vector<int64_t> dims;
  int64_t elements = 0;
  bool null = false;
};

AttributeSpace attribute_space(hid_t attribute, const std::string& where) {
  AttributeSpace space;
  space.handle = owned(H5Aget_space(attribute), "H5Aget_space", where);
  const H5S_class_t space_class = H5Sget_simple_extent_type(space.handle.id());
  MPIGRAD_CHECK(space_class != H5S_NO_CLASS, "HDF5 ", where, ": unreadable dataspace: ",
                take_error_stack());
  if (space_class == H5S_NULL) {
    space.null = true;
    return space;
  }
  const int rank = check(H5Sget_simple_extent_ndims(space.handle.id()),
                         "H5Sget_simple_extent_ndims", where);
  std::vector<hsize_t> extents(size_t(rank), 0);
  if (rank > 0) {
    check(H5Sget_simple_extent_dims(space.handle.id(), extents.data(), nullptr),
          "H5Sget_simple_extent_dims", where);
  }
  space.dims.assign(extents.begin(), extents.end());
  space.elements = check(H5Sget_simple_extent_npoints(space.handle.id()),
                         "H5Sget_simple_extent_npoints", where);
  return space;
}

// Frees the strings HDF5 allocated for a variable-length read, whatever happens after the read.
class VariableStrings {
 public:
  VariableStrings(hid_t memory_type, hid_t space, size_t count)
      : memory_type_(memory_type), space_(space), pointers_(count, nullptr) {}
  ~VariableStrings() {
    if (!read_) return;
#if H5_VERSION_GE(1, 12, 0)
    if (H5Treclaim(memory_type_, space_, H5P_DEFAULT, pointers_.data()) < 0) H5Eclear2(H5E_DEFAULT);
#else
    if (H5Dvlen_reclaim(memory_type_, space_, H5P_DEFAULT, pointers_.data()) < 0) {
      H5Eclear2(H5E_DEFAULT);
    }
#endif
  }
  VariableStrings(const VariableStrings&) = delete;
  VariableStrings& operator=(const VariableStrings&) = delete;
  void* buffer() { return pointers_.data(); }
  void mark_read() { read_ = true; }
  const std::vector<char*>& pointers() const { return pointers_; }

 private:
  hid_t memory_type_, space_;
  std::vector<char*> pointers_;
  bool read_ = false;
};

uint64_t little_endian(const unsigned char* bytes, int count) {
  uint64_t value = 0;
  for (int i = count - 1; i >= 0; --i) value = (value << 8) | bytes[i];
  return value;
}

// What is wrong with the global heap collections ("GCOL" blocks, where variable-length strings
// live) of the file at `path`, or "" when nothing is. HDF5 1.10 trusts the object sizes recorded
// there: H5HG_read copies an object's recorded size into a buffer sized for the string, so a
// garbage size is a heap overflow inside the library (a segfault in its memcpy, seen on a
// mutated file) that no return code can report. So before reading variable-length strings the
// file's collections are walked once: every object must fit inside its collection. Each
// collection begins "GCOL", version 1, 3 reserved bytes and its 8-byte size (at least 4096);
// then objects: a 2-byte index, 2-byte reference count, 4 reserved bytes, an 8-byte size and the
// data padded to 8 bytes; index 0 is the free space, whose size counts its own header. The
// answer is cached per path, size and modification time.
std::string global_heap_problem(const std::string& path) {
  struct stat status {};
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";  // HDF5 itself will say why the file cannot be read
  if (::fstat(fd, &status) != 0 || status.st_size < 16) {
    ::close(fd);
    return "";
  }
  const std::string key = path + "\n" + std::to_string(status.st_size) + "\n" +
                          std::to_string(status.st_mtim.tv_sec) + "." +
                          std::to_string(status.st_mtim.tv_nsec);
  static std::mutex mutex;
  static std::map<std::string, std::string> checked;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto found = checked.find(key);
    if (found != checked.end()) {
      ::close(fd);
      return found->second;
    }
  }
  const size_t size = size_t(status.st_size);
  void* mapped = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (mapped == MAP_FAILED) return "";
  const auto* bytes = static_cast<const unsigned char*>(mapped);
  std::string problem;
  for (size_t at = 0; problem.empty() && at + 16 <= size; ++at) {
    const void* hit = ::memmem(bytes + at, size - at, "GCOL", 4);
    if (hit == nullptr) break;
    at = size_t(static_cast<const unsigned char*>(hit) - bytes);
    if (at + 16 > size || bytes[at + 4] != 1) continue;  // not a collection header
    const uint64_t collection = little_endian(bytes + at + 8, 8);
    if (collection < 4096 || collection > size - at) continue;
    for (uint64_t offset = 16; offset + 16 <= collection;) {
      const uint64_t index = little_endian(bytes + at + offset, 2);
      const uint64_t object = little_endian(bytes + at + offset + 8, 8);
      const uint64_t room = collection - offset;
      const uint64_t need = index == 0   ? object
                            : object > room ? room + 1  // cannot fit, and no overflow below
                                            : 16 + (object + 7) / 8 * 8;
      if (need > room) {
        problem = "the global heap collection at byte " + std::to_string(at) + " records object " +
                  std::to_string(index) + " of " + std::to_string(object) +
                  " bytes, more than the collection's " + std::to_string(room) +
                  " remaining bytes (a corrupt file)";
        break;
      }
      if (index == 0 || need == 0) break;  // the free space ends the collection
      offset += need;
    }
  }
  ::munmap(mapped, size);
  std::lock_guard<std::mutex> lock(mutex);
  checked[key] = problem;
  return problem;
}

// The path of the file `object` lives in ("" when HDF5 cannot say).
std::string file_name_of(hid_t object) {
  ssize_t length = H5Fget_name(object, nullptr, 0);
  if (length <= 0) return "";
  std::string name(size_t(length) + 1, '\0');
  if (H5Fget_name(object, name.data(), name.size()) < 0) return "";
  name.resize(size_t(length));
  return name;
}

// Every string of a string attribute, in row-major order, into buffers sized from the
// attribute's own type and dataspace.
std::vector<std::string> read_strings(hid_t attribute, hid_t file_type, const AttributeSpace& space,
                                      const std::string& where) {
  std::vector<std::string> strings;
  if (space.elements == 0) return strings;
  if (check(H5Tis_variable_str(file_type), "H5Tis_variable_str", where) > 0) {
    Handle memory = owned(H5Tcopy(H5T_C_S1), "H5Tcopy", where);
    check(H5Tset_size(memory.id(), H5T_VARIABLE), "H5Tset_size", where);
    check(H5Tset_cset(memory.id(), H5Tget_cset(file_type)), "H5Tset_cset", where);
    const std::string problem = global_heap_problem(file_name_of(attribute));
    MPIGRAD_CHECK(problem.empty(), "HDF5 ", where, ": not read: ", problem);
    VariableStrings values(memory.id(), space.handle.id(), size_t(space.elements));
    check(H5Aread(attribute, memory.id(), values.buffer()), "H5Aread", where);
    values.mark_read();
    for (const char* text : values.pointers()) strings.emplace_back(text != nullptr ? text : "");
    return strings;
  }
  const size_t size = H5Tget_size(file_type);
  MPIGRAD_CHECK(size > 0, "HDF5 ", where, ": string type of size 0: ", take_error_stack());
  std::vector<char> buffer(size_t(checked_mul(space.elements, int64_t(size), "HDF5 ", where)));
  check(H5Aread(attribute, file_type, buffer.data()), "H5Aread", where);
  for (int64_t i = 0; i < space.elements; ++i) {
    const char* text = buffer.data() + size_t(i) * size;
    strings.emplace_back(text, strnlen(text, size));
  }
  return strings;
}

std::string attribute_where(const std::string& file, const std::string& object,
                            const std::string& name) {
  return join_where(file, object) + " attribute '" + name + "'";
}

// Control characters as escapes, so that a listing stays one line and a hostile string cannot
// drive the terminal; inside quotes, quotes and backslashes are escaped too.
std::string printable(const std::string& text, bool quoted) {
  std::string out = quoted ? "\"" : "";
  for (unsigned char c : text) {
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "\\x%02x", c);
      out += hex;
    } else if (quoted && (c == '"' || c == '\\')) {
      out += '\\';
      out += char(c);
    } else {
      out += char(c);
    }
  }
  return quoted ? out + "\"" : out;
}

std::string attribute_value_text(hid_t attribute, const std::string& where) {
  constexpr int64_t kMaxBytesRead = int64_t(1) << 20;
  constexpr int64_t kMaxListed = 16;
  Datatype type(owned(H5Aget_type(attribute), "H5Aget_type", where));
  AttributeSpace space = attribute_space(attribute, where);
  if (space.null) return "empty (no value)";
  const H5T_class_t type_class = H5Tget_class(type.id());
  MPIGRAD_CHECK(type_class != H5T_NO_CLASS, "HDF5 ", where, ": unreadable type: ",
                take_error_stack());
  const std::string shape = Shape(space.dims).str();
  const std::string unsupported = "unsupported (" + type.describe() + ", shape " + shape;
  if (type_class != H5T_STRING && type_class != H5T_INTEGER && type_class != H5T_FLOAT) {
    return unsupported + ")";
  }
  const bool variable = type_class == H5T_STRING && H5Tis_variable_str(type.id()) > 0;
  const int64_t element_bytes = variable ? int64_t(sizeof(char*))
                                         : std::max<int64_t>(int64_t(H5Tget_size(type.id())), 8);
  if (space.elements > kMaxBytesRead / element_bytes) return unsupported + ", over 1 MiB)";

  std::vector<std::string> values;
  const bool strings = type_class == H5T_STRING;
  if (strings) {
    for (const std::string& text : read_strings(attribute, type.id(), space, where)) {
      values.push_back(printable(text, space.elements != 1));
    }
  } else if (space.elements > 0) {
    if (type_class == H5T_FLOAT) {
      std::vector<double> numbers(size_t(space.elements));
      check(H5Aread(attribute, H5T_NATIVE_DOUBLE, numbers.data()), "H5Aread", where);
      for (double number : numbers) {
        std::ostringstream text;
        text.precision(15);
        text << number;
        values.push_back(text.str());
      }
    } else if (H5Tget_sign(type.id()) == H5T_SGN_NONE && H5Tget_size(type.id()) >= 8) {
      std::vector<uint64_t> numbers(size_t(space.elements));
      check(H5Aread(attribute, H5T_NATIVE_UINT64, numbers.data()), "H5Aread", where);
      for (uint64_t number : numbers) values.push_back(std::to_string(number));
    } else {
      std::vector<int64_t> numbers(size_t(space.elements));
      check(H5Aread(attribute, H5T_NATIVE_INT64, numbers.data()), "H5Aread", where);
      for (int64_t number : numbers) values.push_back(std::to_string(number));
    }
  }
  if (space.elements == 1) return values[0];
  std::string list = space.dims.size() > 1 ? shape + ": [" : "[";
  for (int64_t i = 0; i < std::min<int64_t>(int64_t(values.size()), kMaxListed); ++i) {
    list += (i > 0 ? ", " : "") + values[size_t(i)];
  }
  if (space.elements > kMaxListed) {
    list += ", ... (" + std::to_string(space.elements) + " values)";
  }
  return list + "]";
}

}  // namespace

std::string File::read_string_attribute(const std::string& object_path, const std::string& name) const {
  std::string where = attribute_where(path_, absolute_path(object_path), name);
  Handle attribute = open_attribute(object_path, name);
  Handle type = owned(H5Aget_type(attribute.id()), "H5Aget_type", where);
  MPIGRAD_CHECK(H5Tget_class(type.id()) == H5T_STRING, "HDF5 ", where, ": not a string attribute");
  AttributeSpace space = attribute_space(attribute.id(), where);
  MPIGRAD_CHECK(!space.null && space.elements == 1, "HDF5 ", where, ": holds ",
                space.null ? 0 : space.elements, " strings (shape ", Shape(space.dims),
                "), not one");
  return read_strings(attribute.id(), type.id(), space, where).at(0);
}

std::string File::attribute_text(const std::string& object_path, const std::string& name) const {
  std::string where = attribute_where(path_, absolute_path(object_path), name);
  Handle attribute = open_attribute(object_path, name);
  try {
    return attribute_value_text(attribute.id(), where);
  } catch (const Error& error) {
    return std::string("unreadable (") + error.what() + ")";
  }
}

namespace {
void read_numeric_attribute(hid_t attribute, hid_t memory_type_id, void* out, const std::string& where) {
  Handle type = owned(H5Aget_type(attribute), "H5Aget_type", where);
  H5T_class_t type_class = H5Tget_class(type.id());
  MPIGRAD_CHECK(type_class == H5T_INTEGER || type_class == H5T_FLOAT, "HDF5 ", where, ": not a numeric attribute");
  Handle space = owned(H5Aget_space(attribute), "H5Aget_space", where);
  MPIGRAD_CHECK(check(H5Sget_simple_extent_npoints(space.id()), "H5Sget_simple_extent_npoints", where) == 1,
                "HDF5 ", where, ": expected a single value");
  check(H5Aread(attribute, memory_type_id, out), "H5Aread", where);
}
}  // namespace

int64_t File::read_int_attribute(const std::string& object_path, const std::string& name) const {
  std::string where = join_where(path_, absolute_path(object_path)) + " attribute '" + name + "'";
  Handle attribute = open_attribute(object_path, name);
  int64_t value = 0;
  read_numeric_attribute(attribute.id(), H5T_NATIVE_INT64, &value, where);
  return value;
}

double File::read_double_attribute(const std::string& object_path, const std::string& name) const {
  std::string where = join_where(path_, absolute_path(object_path)) + " attribute '" + name + "'";
  Handle attribute = open_attribute(object_path, name);
  double value = 0;
  read_numeric_attribute(attribute.id(), H5T_NATIVE_DOUBLE, &value, where);
  return value;
}

// ---- AtomicFileWriter ---------------------------------------------------------------------------

AtomicFileWriter::AtomicFileWriter(std::string path)
    : path_(std::move(path)), temp_path_(path_ + ".tmp." + std::to_string(::getpid())) {
  file_ = File::create(temp_path_);
}

AtomicFileWriter::~AtomicFileWriter() {
  if (committed_) return;
  file_ = File();
  std::error_code ignored;
  std::filesystem::remove(temp_path_, ignored);
}

void AtomicFileWriter::commit() {
  MPIGRAD_CHECK(!committed_, "HDF5 file ", path_, ": committed twice");
  file_.close();
  std::error_code error;
  std::filesystem::rename(temp_path_, path_, error);
  MPIGRAD_CHECK(!error, "HDF5 file ", path_, ": renaming ", temp_path_, " into place failed: ", error.message());
  committed_ = true;
}

}  // namespace mpigrad::core::hdf5
