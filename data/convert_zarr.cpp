#include "mpigrad/data/convert_zarr.h"

#include <algorithm>
#include <boost/program_options.hpp>
#include <iostream>
#include <vector>

#include "mpigrad/core/error.h"
#include "mpigrad/core/hdf5.h"
#include "mpigrad/data/atomic_store.h"

namespace mpigrad::data {

namespace po = boost::program_options;

namespace {

constexpr int64_t kBlockBytes = int64_t(64) << 20;

const char* level_attribute(FieldLevel level) {
  return level == FieldLevel::Atom ? "atom" : level == FieldLevel::Edge ? "edge" : "system";
}

void copy_array(const StoredArray& array, core::hdf5::File& file,
                const core::hdf5::DatasetLayout& layout) {
  const std::vector<int64_t>& dims = array.shape();
  core::hdf5::DatasetLayout used = layout;
  if (dims[0] == 0) used = {};  // nothing to chunk
  core::hdf5::Dataset dataset = file.create_dataset(array.name(), array.dtype(), dims, used);
  const int64_t row_bytes = std::max<int64_t>(array.row_bytes(), 1);
  const int64_t block = std::max<int64_t>(1, kBlockBytes / row_bytes);
  std::vector<char> buffer;
  for (int64_t row = 0; row < array.rows(); row += block) {
    const int64_t rows = std::min(block, array.rows() - row);
    buffer.resize(size_t(rows * array.row_bytes()));
    array.read_rows(row, rows, buffer.data());
    dataset.write_rows(row, rows, buffer.data(), array.dtype());
  }
}

}  // namespace

void convert_atomic_store(const std::string& input, const std::string& output,
                          const ConvertZarrOptions& options, std::ostream& out) {
  MPIGRAD_CHECK(options.chunk_rows >= 0, "convert-zarr: --chunk-rows must be >= 0");
  MPIGRAD_CHECK(options.gzip_level == 0 || options.chunk_rows > 0,
                "convert-zarr: --gzip needs --chunk-rows");
  // The store is checked as a whole before anything is written.
  std::shared_ptr<const AtomicStore> store = AtomicStore::open(input, {.cache_bytes = 0});
  auto cache = std::make_shared<ChunkCache>(0);
  StoreContents contents = store->format() == StoreFormat::Zarr ? read_zarr_contents(input, cache)
                                                                : read_hdf5_contents(input);
  core::hdf5::DatasetLayout layout;
  layout.chunk_rows = options.chunk_rows;
  layout.gzip_level = options.gzip_level;
  core::hdf5::AtomicFileWriter writer(output);
  core::hdf5::File& file = writer.file();
  file.create_group("meta");
  file.create_group("core");
  file.create_group("custom");
  for (const auto& [name, array] : contents.arrays) {
    copy_array(*array, file, layout);
    std::string level;
    if (const StoreField* field = store->find(name.substr(name.find('/') + 1));
        field != nullptr && field->path() == name) {
      level = level_attribute(field->level);
      file.write_attribute(name, "level", level);
    }
    out << "  " << name << "  " << array->stored_type() << " " << core::Shape(array->shape())
        << (level.empty() ? "" : "  (" + level + ")") << "\n";
  }
  file.write_attribute("/", "num_samples", store->num_samples());
  file.write_attribute("/", "created_by", "mpigrad data convert-zarr");
  file.write_attribute("/", "source", input);
  writer.commit();
  out << "wrote " << output << ": " << store->describe() << "\n";
}

int convert_zarr_command(int argc, char** argv) {
  po::options_description options("convert-zarr options");
  options.add_options()("help,h", "show this help")("input", po::value<std::string>()->required(),
                                                    "the Zarr v3 store (a folder)")(
      "output", po::value<std::string>()->required(), "the HDF5 file to write")(
      "chunk-rows", po::value<int64_t>()->default_value(0),
      "rows per HDF5 chunk (0: contiguous layout)")("gzip", po::value<int>()->default_value(0),
                                                    "gzip level 1..9 (needs --chunk-rows)");
  po::positional_options_description positional;
  positional.add("input", 1).add("output", 1);
  po::variables_map values;
  po::store(po::command_line_parser(argc, argv).options(options).positional(positional).run(),
            values);
  if (values.count("help")) {
    std::cout << "Usage: mpigrad data convert-zarr IN.zarr OUT.h5 [--chunk-rows N [--gzip L]]\n"
                 "Rewrites an atomic store written by nvalchemi-toolkit (Zarr v3) as the same "
                 "layout in HDF5:\nmeta/, core/ and custom/ arrays under the same names, each "
                 "field's level as an attribute.\n\n"
              << options << "\n";
    return 0;
  }
  po::notify(values);
  ConvertZarrOptions convert;
  convert.chunk_rows = values["chunk-rows"].as<int64_t>();
  convert.gzip_level = values["gzip"].as<int>();
  MPIGRAD_CHECK(convert.gzip_level >= 0 && convert.gzip_level <= 9,
                "convert-zarr: --gzip must be 0..9");
  convert_atomic_store(values["input"].as<std::string>(), values["output"].as<std::string>(),
                       convert, std::cout);
  return 0;
}

}  // namespace mpigrad::data
