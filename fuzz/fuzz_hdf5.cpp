// fuzz target fuzz_hdf5: the input is the bytes of one HDF5 file. It is opened in memory (HDF5's
// file-image API, core::hdf5::File::open_image: nothing is written to disk) and goes through
// what `mpigrad data inspect` runs (data::inspect_files) and through the dataset opener
// (data::Hdf5Dataset with the usual fields x and y), which then reads one small batch.
// core::Error is the expected outcome for a corrupt file; anything else (a crash, a hang,
// undefined behaviour, a leak, another exception) is a finding.
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "mpigrad/core/error.h"
#include "mpigrad/core/hdf5.h"
#include "mpigrad/data/data_tool.h"
#include "mpigrad/data/hdf5_dataset.h"

namespace {

using namespace mpigrad;

// A batch is read only when it is small: a valid file may hold big samples, and reading them
// would measure the allocator, not the parser.
constexpr int64_t kMaxBatchBytes = int64_t(1) << 20;

void read_attributes(const core::hdf5::File& file) {
  for (const std::string& name : file.list_attributes("/")) {
    try {
      file.read_double_attribute("/", name);
    } catch (const core::Error&) {
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  if (size == 0) return 0;
  auto open_image = [&](const std::string& name) {
    return core::hdf5::File::open_image(bytes, size, name);
  };
  std::ostringstream out;
  try {
    data::inspect_files({"fuzz.h5"}, {}, open_image, out);
  } catch (const core::Error&) {
  }
  try {
    read_attributes(open_image("fuzz.h5"));
  } catch (const core::Error&) {
  }
  try {
    data::Hdf5DatasetOptions options;
    options.open_file = open_image;
    data::Hdf5Dataset dataset({"fuzz.h5"}, options);
    out << dataset.describe();
    int64_t sample_bytes = 0;
    for (const data::FieldInfo& field : dataset.fields()) sample_bytes += field.sample_bytes();
    if (dataset.size() > 0 && sample_bytes <= kMaxBatchBytes / 2) {
      const std::vector<int64_t> indices = {dataset.size() - 1, 0};
      dataset.get_batch(indices);
    }
  } catch (const core::Error&) {
  }
  return 0;
}
