// An attribute's value as one line of text, for listings such as `mpigrad data inspect`
// (File::attribute_text in core/hdf5/file.h): read by its real type and shape, bounded in size,
// escaped so that a hostile string cannot drive the terminal, and never an exception for a value
// that HDF5 cannot read.
#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "mpigrad/core/error.h"
#include "mpigrad/core/hdf5/attribute_values.h"
#include "mpigrad/core/hdf5/file.h"
#include "mpigrad/core/hdf5/internal.h"
#include "mpigrad/core/shape.h"

namespace mpigrad::core::hdf5 {

using namespace detail;  // the family's shared helpers (core/hdf5/internal.h)

namespace {

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
  MPIGRAD_CHECK(type_class != H5T_NO_CLASS, "HDF5 ", where,
                ": unreadable type: ", take_error_stack());
  const std::string shape = Shape(space.dims).str();
  const std::string unsupported = "unsupported (" + type.describe() + ", shape " + shape;
  if (type_class != H5T_STRING && type_class != H5T_INTEGER && type_class != H5T_FLOAT) {
    return unsupported + ")";
  }
  const bool variable = type_class == H5T_STRING && H5Tis_variable_str(type.id()) > 0;
  const int64_t element_bytes =
      variable ? int64_t(sizeof(char*)) : std::max<int64_t>(int64_t(H5Tget_size(type.id())), 8);
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

std::string File::attribute_text(const std::string& object_path, const std::string& name) const {
  std::string where = attribute_where(path_, absolute_path(object_path), name);
  Handle attribute = open_attribute(object_path, name);
  try {
    return attribute_value_text(attribute.id(), where);
  } catch (const Error& error) {
    return std::string("unreadable (") + error.what() + ")";
  }
}

}  // namespace mpigrad::core::hdf5
