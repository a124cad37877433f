// Handles and errors (core/hdf5/handle.h, core/hdf5/internal.h): closing each kind of identifier
// with its own H5*close, and turning a failed call into a core::Error that carries the messages
// HDF5 left on its error stack.
#include "mpigrad/core/hdf5/handle.h"

#include <algorithm>
#include <string>
#include <vector>

#include "mpigrad/core/error.h"
#include "mpigrad/core/hdf5/internal.h"

namespace mpigrad::core::hdf5 {

namespace detail {

namespace {

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

}  // namespace

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

}  // namespace detail

using namespace detail;

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

namespace {
herr_t close_id(hid_t id) {
  switch (H5Iget_type(id)) {
    case H5I_FILE:
      return H5Fclose(id);
    case H5I_GROUP:
      return H5Gclose(id);
    case H5I_DATASET:
      return H5Dclose(id);
    case H5I_DATASPACE:
      return H5Sclose(id);
    case H5I_DATATYPE:
      return H5Tclose(id);
    case H5I_ATTR:
      return H5Aclose(id);
    case H5I_GENPROP_LST:
      return H5Pclose(id);
    case H5I_ERROR_STACK:
      return H5Eclose_stack(id);
    default:
      return H5Idec_ref(id) < 0 ? -1 : 0;
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

}  // namespace mpigrad::core::hdf5
