// The HDF5 reader of atomic stores (data/atomic_store.h): one file with ALCHEMI's names, groups
// meta/, core/ and custom/ of datasets, num_samples on the root and a "level" string attribute on
// each field. h5py writes one in a few lines:
//     f["meta/atoms_ptr"] = ptr; f["core/positions"] = pos; f["core/energy"] = e
//     f["core/energy"].attrs["level"] = "system"    # optional for ALCHEMI's own field names
// HDF5 calls on one file are serialized (core::hdf5::Dataset keeps state between reads).
#include <mutex>

#include "mpigrad/core/error.h"
#include "mpigrad/core/hdf5.h"
#include "mpigrad/data/atomic_store.h"

namespace mpigrad::data {

namespace hdf5 = core::hdf5;

namespace {

struct SharedFile {
  hdf5::File file;
  std::mutex mutex;
};

class Hdf5StoredArray final : public StoredArray {
 public:
  Hdf5StoredArray(std::shared_ptr<SharedFile> shared, const std::string& name)
      : shared_(std::move(shared)), dataset_(shared_->file.open_dataset(name)) {
    name_ = name;
    dtype_ = dataset_.read_dtype();
    stored_type_ = dataset_.file_type().describe();
    shape_ = dataset_.dims();
    using Layout = hdf5::Dataset::Storage::Layout;
    const hdf5::Dataset::Storage storage = dataset_.storage();
    MPIGRAD_CHECK(storage.layout != Layout::Contiguous || storage.stored_bytes == 0 ||
                      storage.end_offset <= shared_->file.size_on_disk(),
                  "HDF5 store ", shared_->file.path(), ": ", name, " is stored up to byte ",
                  storage.end_offset, " but the file has only ", shared_->file.size_on_disk(),
                  " bytes (truncated file)");
  }

  void read_rows(int64_t begin, int64_t count, void* out) const override {
    MPIGRAD_CHECK(begin >= 0 && count >= 0 && begin <= rows() - count, "HDF5 store ",
                  shared_->file.path(), ": ", name_, ": rows [", begin, ", ", begin + count,
                  ") outside its ", rows(), " rows");
    if (count == 0) return;
    std::lock_guard<std::mutex> lock(shared_->mutex);
    dataset_.read_rows(begin, count, out, dtype_);
  }

 private:
  std::shared_ptr<SharedFile> shared_;
  hdf5::Dataset dataset_;
};

}  // namespace

StoreContents read_hdf5_contents(const std::string& path) {
  auto shared = std::make_shared<SharedFile>();
  shared->file = hdf5::File::open(path);
  const hdf5::File& file = shared->file;
  StoreContents contents;
  if (file.has_attribute("/", "num_samples")) {
    contents.num_samples = file.read_int_attribute("/", "num_samples");
  }
  for (const char* group : {"meta", "core", "custom"}) {
    const hdf5::ObjectKind kind = file.kind(group);
    if (kind == hdf5::ObjectKind::Missing && std::string(group) == "custom") continue;
    MPIGRAD_CHECK(kind == hdf5::ObjectKind::Group, "HDF5 store ", path, ": ", group,
                  kind == hdf5::ObjectKind::Missing ? "/ is missing" : " is not a group",
                  " (an atomic store has groups meta/ and core/)");
    for (const std::string& name : file.list(group)) {
      const std::string key = std::string(group) + "/" + name;
      if (file.kind(key) != hdf5::ObjectKind::Dataset) continue;
      contents.arrays.emplace_back(key, std::make_shared<const Hdf5StoredArray>(shared, key));
      if (std::string(group) != "meta" && file.has_attribute(key, "level")) {
        contents.levels.emplace_back(key, file.read_string_attribute(key, "level"));
      }
    }
  }
  return contents;
}

}  // namespace mpigrad::data
