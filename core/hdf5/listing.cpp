// Listing a file's groups (core/hdf5/file.h): a group's members, and a walk of the whole tree
// that ends on every file, however its links loop back, by telling groups apart by their
// address in the file rather than by their path.
#include <algorithm>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "mpigrad/core/error.h"
#include "mpigrad/core/hdf5/file.h"
#include "mpigrad/core/hdf5/internal.h"

namespace mpigrad::core::hdf5 {

using namespace detail;  // the family's shared helpers (core/hdf5/internal.h)

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
    ssize_t length = check(
        H5Lget_name_by_idx(group.id(), ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT),
        "H5Lget_name_by_idx", where);
    std::string name(size_t(length) + 1, '\0');
    check(H5Lget_name_by_idx(group.id(), ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(),
                             name.size(), H5P_DEFAULT),
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

}  // namespace mpigrad::core::hdf5
