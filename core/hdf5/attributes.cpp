// Attributes (core/hdf5/file.h): listing, writing and reading the scalar attributes that
// checkpoints carry, and reading a string attribute of any shape into buffers sized from its
// own type (core/hdf5/attribute_values.h), after the global heap check of global_heap.h.
#include <cstring>
#include <string>
#include <vector>

#include "mpigrad/core/checked_math.h"
#include "mpigrad/core/error.h"
#include "mpigrad/core/hdf5/attribute_values.h"
#include "mpigrad/core/hdf5/file.h"
#include "mpigrad/core/hdf5/global_heap.h"
#include "mpigrad/core/hdf5/internal.h"
#include "mpigrad/core/shape.h"

namespace mpigrad::core::hdf5 {

namespace detail {

namespace {

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
  void* buffer() {
    return pointers_.data();
  }
  void mark_read() {
    read_ = true;
  }
  const std::vector<char*>& pointers() const {
    return pointers_;
  }

 private:
  hid_t memory_type_, space_;
  std::vector<char*> pointers_;
  bool read_ = false;
};

// The path of the file `object` lives in ("" when HDF5 cannot say).
std::string file_name_of(hid_t object) {
  ssize_t length = H5Fget_name(object, nullptr, 0);
  if (length <= 0) return "";
  std::string name(size_t(length) + 1, '\0');
  if (H5Fget_name(object, name.data(), name.size()) < 0) return "";
  name.resize(size_t(length));
  return name;
}

}  // namespace

AttributeSpace attribute_space(hid_t attribute, const std::string& where) {
  AttributeSpace space;
  space.handle = owned(H5Aget_space(attribute), "H5Aget_space", where);
  const H5S_class_t space_class = H5Sget_simple_extent_type(space.handle.id());
  MPIGRAD_CHECK(space_class != H5S_NO_CLASS, "HDF5 ", where,
                ": unreadable dataspace: ", take_error_stack());
  if (space_class == H5S_NULL) {
    space.null = true;
    return space;
  }
  const int rank =
      check(H5Sget_simple_extent_ndims(space.handle.id()), "H5Sget_simple_extent_ndims", where);
  std::vector<hsize_t> extents(size_t(rank), 0);
  if (rank > 0) {
    check(H5Sget_simple_extent_dims(space.handle.id(), extents.data(), nullptr),
          "H5Sget_simple_extent_dims", where);
  }
  space.dims.assign(extents.begin(), extents.end());
  space.elements =
      check(H5Sget_simple_extent_npoints(space.handle.id()), "H5Sget_simple_extent_npoints", where);
  return space;
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

}  // namespace detail

using namespace detail;

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
  check(H5Aiterate2(object.id(), H5_INDEX_NAME, H5_ITER_INC, &position, collect_attribute, &names),
        "H5Aiterate2", join_where(path_, absolute_path(object_path)));
  return names;
}

Handle File::open_attribute(const std::string& object_path, const std::string& name) const {
  std::string where = join_where(path_, absolute_path(object_path)) + " attribute '" + name + "'";
  MPIGRAD_CHECK(has_attribute(object_path, name), "HDF5 ", where, ": no such attribute");
  Handle object = open_object(object_path);
  return owned(H5Aopen(object.id(), name.c_str(), H5P_DEFAULT), "H5Aopen", where);
}

void File::write_scalar_attribute(const std::string& object_path, const std::string& name,
                                  const Datatype& type, const void* value) {
  std::string where = join_where(path_, absolute_path(object_path)) + " attribute '" + name + "'";
  Handle object = open_object(object_path);
  if (check(H5Aexists(object.id(), name.c_str()), "H5Aexists", where) > 0) {
    check(H5Adelete(object.id(), name.c_str()), "H5Adelete", where);
  }
  Handle space = owned(H5Screate(H5S_SCALAR), "H5Screate", where);
  Handle attribute =
      owned(H5Acreate2(object.id(), name.c_str(), type.id(), space.id(), H5P_DEFAULT, H5P_DEFAULT),
            "H5Acreate2", where);
  check(H5Awrite(attribute.id(), type.id(), value), "H5Awrite", where);
}

void File::write_attribute(const std::string& object_path, const std::string& name,
                           const std::string& value) {
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

std::string File::read_string_attribute(const std::string& object_path,
                                        const std::string& name) const {
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

namespace {
void read_numeric_attribute(hid_t attribute, hid_t memory_type_id, void* out,
                            const std::string& where) {
  Handle type = owned(H5Aget_type(attribute), "H5Aget_type", where);
  H5T_class_t type_class = H5Tget_class(type.id());
  MPIGRAD_CHECK(type_class == H5T_INTEGER || type_class == H5T_FLOAT, "HDF5 ", where,
                ": not a numeric attribute");
  Handle space = owned(H5Aget_space(attribute), "H5Aget_space", where);
  MPIGRAD_CHECK(
      check(H5Sget_simple_extent_npoints(space.id()), "H5Sget_simple_extent_npoints", where) == 1,
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

}  // namespace mpigrad::core::hdf5
