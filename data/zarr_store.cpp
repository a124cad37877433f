// The Zarr v3 reader of atomic stores (data/atomic_store.h): the root group's attributes and the
// arrays of meta/, core/ and custom/, each opened as a ZarrArray (its zarr.json only).
#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "mpigrad/core/error.h"
#include "mpigrad/data/atomic_store.h"
#include "mpigrad/data/zarr_array.h"

namespace mpigrad::data {

namespace fs = std::filesystem;
using nlohmann::json;

StoreContents read_zarr_contents(const std::string& path,
                                 const std::shared_ptr<ChunkCache>& cache) {
  const std::string what = "Zarr store " + path;
  StoreContents contents;
  json attributes;
  try {
    attributes = json::parse(zarr_group_attributes(path));
  } catch (const json::exception& error) {
    core::fail(what, ": root attributes: ", error.what());
  }
  MPIGRAD_CHECK(!attributes.contains("levels") && !fs::exists(fs::path(path) / "levels"), what,
                ": uses ALCHEMI's custom levels (root attribute 'levels'), which this reader "
                "does not read");
  if (attributes.contains("num_samples")) {
    const json& count = attributes.at("num_samples");
    MPIGRAD_CHECK(count.is_number_integer() && count.get<int64_t>() >= 0, what,
                  ": root attribute num_samples is ", count.dump(), ", not a count");
    contents.num_samples = count.get<int64_t>();
  }
  if (attributes.contains("fields")) {
    const json& fields = attributes.at("fields");
    MPIGRAD_CHECK(fields.is_object(), what, ": root attribute fields is ", fields.dump(),
                  ", not {\"core\": {...}, \"custom\": {...}}");
    for (const auto& [group, members] : fields.items()) {
      MPIGRAD_CHECK(members.is_object(), what, ": root attribute fields.", group, " is ",
                    members.dump(), ", not an object of levels");
      for (const auto& [name, level] : members.items()) {
        MPIGRAD_CHECK(level.is_string(), what, ": the level of ", group, "/", name, " is ",
                      level.dump(), ", not a string");
        contents.levels.emplace_back(group + "/" + name, level.get<std::string>());
      }
    }
  }
  for (const char* group : {"meta", "core", "custom"}) {
    const fs::path folder = fs::path(path) / group;
    const ZarrNode kind = zarr_node_kind(folder.string());
    if (kind == ZarrNode::Missing && std::string(group) == "custom") continue;
    MPIGRAD_CHECK(kind == ZarrNode::Group, what, ": ", group,
                  kind == ZarrNode::Missing ? "/ is missing" : " is not a group",
                  " (an atomic store has groups meta/ and core/)");
    std::vector<std::string> names;
    for (const fs::directory_entry& entry : fs::directory_iterator(folder)) {
      if (!entry.is_directory()) continue;
      const std::string child = entry.path().filename().string();
      if (zarr_node_kind(entry.path().string()) == ZarrNode::Array) names.push_back(child);
    }
    std::sort(names.begin(), names.end());  // directory order is the file system's
    for (const std::string& name : names) {
      const std::string key = std::string(group) + "/" + name;
      contents.arrays.emplace_back(key, std::make_shared<const ZarrArray>(path, key, cache));
    }
  }
  return contents;
}

}  // namespace mpigrad::data
