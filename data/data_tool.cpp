#include "mpigrad/data/data_tool.h"

#include <algorithm>
#include <boost/program_options.hpp>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <sstream>

#include "mpigrad/core/error.h"
#include "mpigrad/core/hdf5.h"
#include "mpigrad/core/isolated.h"
#include "mpigrad/data/convert_zarr.h"
#include "mpigrad/data/hdf5_dataset.h"
#include "mpigrad/data/idx.h"
#include "mpigrad/kernels/philox.h"

namespace mpigrad::data {

namespace po = boost::program_options;
namespace hdf5 = core::hdf5;

std::vector<std::string> shard_paths(const std::string& output, int shards) {
  MPIGRAD_CHECK(shards >= 1, "--shards must be >= 1, got ", shards);
  if (shards == 1) return {output};
  std::filesystem::path path(output);
  std::string extension = path.has_extension() ? path.extension().string() : ".h5";
  std::vector<std::string> paths;
  for (int s = 0; s < shards; ++s) {
    char suffix[64];
    std::snprintf(suffix, sizeof(suffix), "-%05d-of-%05d", s, shards);
    paths.push_back((path.parent_path() / (path.stem().string() + suffix + extension)).string());
  }
  return paths;
}

namespace {

const char* kCommands =
    "Usage: mpigrad-data <command> [options]\n"
    "\n"
    "Commands:\n"
    "  convert-idx  convert IDX files (MNIST, Fashion-MNIST; gzipped or not) to HDF5 shards\n"
    "  convert-zarr rewrite an atomic Zarr store (nvalchemi-toolkit's) as the same layout in "
    "HDF5\n"
    "  inspect      show the fields, dtypes, shapes, N and shards of HDF5 dataset files\n"
    "  synth        write synthetic classification data of a given shape\n"
    "\n"
    "Run 'mpigrad-data <command> --help' for a command's options.\n";

// One field to write: its name, dtype, per-sample shape, and a function filling rows.
struct FieldWriter {
  std::string name;
  core::DType dtype;
  std::vector<int64_t> sample_shape;
  std::function<void(int64_t row, int64_t rows, void* out)> fill;
};

// Writes n samples split into contiguous shards. Every file is written under a temporary name
// and all are renamed only once every shard is complete: a failure leaves no output behind.
std::vector<std::string> write_sharded(
    const std::string& output, int shards, int64_t n, const std::vector<FieldWriter>& fields,
    const hdf5::DatasetLayout& layout,
    const std::vector<std::pair<std::string, std::string>>& attributes) {
  MPIGRAD_CHECK(n >= shards, "cannot split ", n, " samples into ", shards, " shards");
  std::vector<std::string> paths = shard_paths(output, shards);
  std::vector<std::unique_ptr<hdf5::AtomicFileWriter>> writers;
  constexpr int64_t kBlockRows = 8192;
  std::vector<char> buffer;
  for (int s = 0; s < shards; ++s) {
    const int64_t begin = n * s / shards, end = n * (s + 1) / shards;
    writers.push_back(std::make_unique<hdf5::AtomicFileWriter>(paths[size_t(s)]));
    hdf5::File& file = writers.back()->file();
    for (const auto& field : fields) {
      std::vector<int64_t> dims = field.sample_shape;
      dims.insert(dims.begin(), end - begin);
      hdf5::Dataset dataset = file.create_dataset(field.name, field.dtype, dims, layout);
      const int64_t row_bytes =
          core::Shape(field.sample_shape).numel() * core::element_size(field.dtype);
      for (int64_t row = begin; row < end; row += kBlockRows) {
        const int64_t rows = std::min(kBlockRows, end - row);
        buffer.resize(size_t(rows * row_bytes));
        field.fill(row, rows, buffer.data());
        dataset.write_rows(row - begin, rows, buffer.data(), field.dtype);
      }
    }
    for (const auto& [key, value] : attributes) file.write_attribute("/", key, value);
    file.write_attribute("/", "shard_index", int64_t(s));
    file.write_attribute("/", "num_shards", int64_t(shards));
    file.write_attribute("/", "first_sample", begin);
  }
  for (auto& writer : writers) writer->commit();
  return paths;
}

std::vector<int64_t> parse_shape(const std::string& text) {
  std::vector<int64_t> shape;
  std::stringstream stream(text);
  for (std::string item; std::getline(stream, item, ',');) {
    size_t used = 0;
    int64_t extent = -1;
    try {
      extent = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    MPIGRAD_CHECK(used == item.size() && extent >= 1, "--shape: cannot parse '", text,
                  "' (expected positive extents like 1,28,28)");
    shape.push_back(extent);
  }
  MPIGRAD_CHECK(!shape.empty(), "--shape: empty");
  return shape;
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream stream(text);
  for (std::string item; std::getline(stream, item, ',');) {
    if (!item.empty()) items.push_back(item);
  }
  return items;
}

// Parses a subcommand's arguments; returns false when --help was printed.
bool parse(int argc, char** argv, const po::options_description& options,
           const po::positional_options_description* positional, po::variables_map& values,
           const std::string& usage) {
  po::command_line_parser parser(argc, argv);
  parser.options(options);
  if (positional != nullptr) parser.positional(*positional);
  po::store(parser.run(), values);
  if (values.count("help")) {
    std::cout << usage << "\n" << options << "\n";
    return false;
  }
  po::notify(values);
  return true;
}

hdf5::DatasetLayout layout_from(const po::variables_map& values) {
  hdf5::DatasetLayout layout;
  layout.chunk_rows = values["chunk-rows"].as<int64_t>();
  layout.gzip_level = values["gzip"].as<int>();
  MPIGRAD_CHECK(layout.chunk_rows >= 0, "--chunk-rows must be >= 0");
  return layout;
}

void add_layout_options(po::options_description& options) {
  options.add_options()("chunk-rows", po::value<int64_t>()->default_value(0),
                        "samples per HDF5 chunk (0: contiguous layout)")(
      "gzip", po::value<int>()->default_value(0), "gzip level 1..9 (needs --chunk-rows)");
}

void print_written(const std::vector<std::string>& paths, int64_t n) {
  for (const auto& path : paths) {
    std::error_code error;
    auto bytes = std::filesystem::file_size(path, error);
    std::cout << "wrote " << path << " (" << (error ? 0 : bytes) << " bytes)\n";
  }
  std::cout << n << " samples in " << paths.size() << " shard" << (paths.size() == 1 ? "" : "s")
            << "\n";
}

// ---- convert-idx --------------------------------------------------------------------------------

int convert_idx(int argc, char** argv) {
  po::options_description options("convert-idx options");
  options.add_options()("help,h", "show this help")(
      "images", po::value<std::string>()->required(),
      "IDX images file, e.g. train-images-idx3-ubyte.gz")(
      "labels", po::value<std::string>()->required(),
      "IDX labels file, e.g. train-labels-idx1-ubyte.gz")(
      "output,o", po::value<std::string>()->required(),
      "output HDF5 file (shards get -00000-of-0000N)")("shards", po::value<int>()->default_value(1),
                                                       "number of files to split the samples into")(
      "x-name", po::value<std::string>()->default_value("x"), "name of the images field")(
      "y-name", po::value<std::string>()->default_value("y"), "name of the labels field");
  add_layout_options(options);
  po::variables_map values;
  if (!parse(
          argc, argv, options, nullptr, values,
          "Usage: mpigrad-data convert-idx --images FILE --labels FILE --output OUT.h5 [--shards "
          "N]\n"
          "Writes uint8 x [N,1,H,W] and int64 y [N]; gzipped inputs are detected automatically.")) {
    return 0;
  }
  const std::string images_path = values["images"].as<std::string>();
  const std::string labels_path = values["labels"].as<std::string>();
  IdxArray images = read_idx(images_path);
  IdxArray labels = read_idx(labels_path);
  MPIGRAD_CHECK(images.dtype == core::kUInt8 && images.dims.size() == 3, "IDX file ", images_path,
                ": expected uint8 images [N, H, W], got ", images.dtype, " ",
                core::Shape(images.dims));
  MPIGRAD_CHECK(labels.dtype == core::kUInt8 && labels.dims.size() == 1, "IDX file ", labels_path,
                ": expected uint8 labels [N], got ", labels.dtype, " ", core::Shape(labels.dims));
  const int64_t n = images.dims[0];
  MPIGRAD_CHECK(labels.dims[0] == n, "IDX files ", images_path, " (", n, " images) and ",
                labels_path, " (", labels.dims[0], " labels) disagree on N");
  const int64_t height = images.dims[1], width = images.dims[2], pixels = height * width;

  std::vector<FieldWriter> fields;
  fields.push_back({values["x-name"].as<std::string>(),
                    core::kUInt8,
                    {1, height, width},
                    [&](int64_t row, int64_t rows, void* out) {
                      std::memcpy(out, images.bytes.data() + row * pixels, size_t(rows * pixels));
                    }});
  fields.push_back({values["y-name"].as<std::string>(),
                    core::kInt64,
                    {},
                    [&](int64_t row, int64_t rows, void* out) {
                      auto* y = static_cast<int64_t*>(out);
                      for (int64_t i = 0; i < rows; ++i) y[i] = labels.bytes[size_t(row + i)];
                    }});
  MPIGRAD_CHECK(fields[0].name != fields[1].name, "--x-name and --y-name must differ");
  auto paths =
      write_sharded(values["output"].as<std::string>(), values["shards"].as<int>(), n, fields,
                    layout_from(values),
                    {{"source_images", std::filesystem::path(images_path).filename().string()},
                     {"source_labels", std::filesystem::path(labels_path).filename().string()},
                     {"created_by", "mpigrad-data convert-idx"}});
  print_written(paths, n);
  return 0;
}

// ---- synth --------------------------------------------------------------------------------------

core::DType parse_synth_dtype(const std::string& text, const char* option,
                              std::initializer_list<core::DType> allowed) {
  std::string names;
  for (core::DType dtype : allowed) {
    if (text == core::dtype_name(dtype)) return dtype;
    names += (names.empty() ? "" : ", ") + std::string(core::dtype_name(dtype));
  }
  core::fail(option, ": unsupported '", text, "' (", names, ")");
}

int synth(int argc, char** argv) {
  po::options_description options("synth options");
  options.add_options()("help,h", "show this help")(
      "output,o", po::value<std::string>()->required(),
      "output HDF5 file (shards get -00000-of-0000N)")(
      "samples,n", po::value<int64_t>()->required(), "number of samples N")(
      "shape", po::value<std::string>()->default_value("1,28,28"),
      "per-sample shape of x, comma-separated")("classes", po::value<int64_t>()->default_value(10),
                                                "number of classes (y in [0, classes))")(
      "dtype", po::value<std::string>()->default_value("uint8"),
      "dtype of x: uint8, float32, float64, float16 or bfloat16")(
      "range", po::value<std::string>()->default_value("0,1"),
      "LO,HI: float inputs lie in [LO, HI) (uint8 inputs always span 0..255)")(
      "label-dtype", po::value<std::string>()->default_value("int64"),
      "dtype of y: int64, int32 or uint8")("shards", po::value<int>()->default_value(1),
                                           "number of files to split the samples into")(
      "seed", po::value<uint64_t>()->default_value(0), "random seed")(
      "x-name", po::value<std::string>()->default_value("x"), "name of the inputs field")(
      "y-name", po::value<std::string>()->default_value("y"), "name of the labels field");
  add_layout_options(options);
  po::variables_map values;
  if (!parse(
          argc, argv, options, nullptr, values,
          "Usage: mpigrad-data synth --output OUT.h5 --samples N [--shape 1,28,28] [--classes 10]\n"
          "Each class has a random prototype; a sample is its class's prototype plus noise, so a "
          "model\n"
          "can learn it. The same seed gives the same bytes on every machine.")) {
    return 0;
  }
  const int64_t n = values["samples"].as<int64_t>();
  const int64_t classes = values["classes"].as<int64_t>();
  const uint64_t seed = values["seed"].as<uint64_t>();
  const std::vector<int64_t> shape = parse_shape(values["shape"].as<std::string>());
  const std::string dtype_text = values["dtype"].as<std::string>();
  MPIGRAD_CHECK(n >= 1, "--samples must be >= 1, got ", n);
  MPIGRAD_CHECK(classes >= 1, "--classes must be >= 1, got ", classes);
  const core::DType dtype = parse_synth_dtype(
      dtype_text, "--dtype",
      {core::kUInt8, core::kFloat32, core::kFloat64, core::kFloat16, core::kBFloat16});
  const core::DType label_dtype =
      parse_synth_dtype(values["label-dtype"].as<std::string>(), "--label-dtype",
                        {core::kInt64, core::kInt32, core::kUInt8});
  MPIGRAD_CHECK(label_dtype != core::kUInt8 || classes <= 256,
                "--label-dtype uint8 holds at most "
                "256 classes, not ",
                classes);
  const std::vector<std::string> range = split_list(values["range"].as<std::string>());
  MPIGRAD_CHECK(range.size() == 2, "--range: expected LO,HI, got '",
                values["range"].as<std::string>(), "'");
  float bounds[2] = {0, 0};
  for (int i = 0; i < 2; ++i) {
    const std::string& text = range[size_t(i)];
    auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), bounds[i]);
    MPIGRAD_CHECK(
        error == std::errc() && end == text.data() + text.size() && std::isfinite(bounds[i]),
        "--range: '", text, "' is not a number (expected LO,HI, e.g. 0,16)");
  }
  const float lo = bounds[0], hi = bounds[1];
  MPIGRAD_CHECK(lo < hi, "--range: LO must be below HI, got ", lo, ",", hi);
  const int64_t features = core::Shape(shape).numel();

  // Two independent Philox streams: labels and noise per sample; prototypes per class.
  auto label_of = [=](int64_t row) {
    return int64_t(kernels::philox_word(seed, uint64_t(row)) % uint64_t(classes));
  };
  const uint64_t prototype_seed = seed ^ 0x5DEECE66Dull, noise_seed = seed + 0x9E3779B97F4A7C15ull;
  auto value_of = [=](int64_t row, int64_t j) {
    float prototype = kernels::uniform_from_bits(
        kernels::philox_word(prototype_seed, uint64_t(label_of(row) * features + j)));
    float noise =
        kernels::uniform_from_bits(kernels::philox_word(noise_seed, uint64_t(row * features + j)));
    return 0.7f * prototype + 0.3f * noise;  // in [0, 1)
  };
  std::vector<FieldWriter> fields;
  fields.push_back(
      {values["x-name"].as<std::string>(), dtype, shape, [=](int64_t row, int64_t rows, void* out) {
         kernels::visit_dtype(dtype, [&](auto zero) {
           using T = decltype(zero);
           T* x = static_cast<T*>(out);
           for (int64_t i = 0; i < rows; ++i) {
             for (int64_t j = 0; j < features; ++j) {
               float v = value_of(row + i, j);
               if constexpr (std::is_same_v<T, uint8_t>) {
                 x[i * features + j] = uint8_t(std::lround(v * 255.0f));
               } else {
                 x[i * features + j] = T(lo + v * (hi - lo));
               }
             }
           }
         });
       }});
  fields.push_back({values["y-name"].as<std::string>(),
                    label_dtype,
                    {},
                    [=](int64_t row, int64_t rows, void* out) {
                      kernels::visit_dtype(label_dtype, [&](auto zero) {
                        using T = decltype(zero);
                        T* y = static_cast<T*>(out);
                        for (int64_t i = 0; i < rows; ++i) y[i] = T(label_of(row + i));
                      });
                    }});
  MPIGRAD_CHECK(fields[0].name != fields[1].name, "--x-name and --y-name must differ");
  auto paths = write_sharded(values["output"].as<std::string>(), values["shards"].as<int>(), n,
                             fields, layout_from(values),
                             {{"created_by", "mpigrad-data synth"},
                              {"seed", std::to_string(seed)},
                              {"classes", std::to_string(classes)}});
  print_written(paths, n);
  return 0;
}

// ---- inspect ------------------------------------------------------------------------------------

std::string layout_text(const hdf5::Dataset& dataset) {
  int64_t rows = dataset.chunk_rows();
  return rows > 0 ? "chunked (" + std::to_string(rows) + " rows per chunk)" : "contiguous";
}

int inspect(int argc, char** argv) {
  po::options_description options("inspect options");
  options.add_options()("help,h", "show this help")(
      "files", po::value<std::vector<std::string>>()->required(),
      "HDF5 files: the shards, in order")(
      "fields", po::value<std::string>(),
      "comma-separated fields (default: every dataset at the root)")(
      "timeout", po::value<double>()->default_value(60),
      "seconds the HDF5 reading may take before it is stopped");
  po::positional_options_description positional;
  positional.add("files", -1);
  po::variables_map values;
  if (!parse(argc, argv, options, &positional, values,
             "Usage: mpigrad-data inspect FILE... [--fields x,y]\n"
             "Lists each file's datasets and attributes, then checks the files as one sharded "
             "dataset.")) {
    return 0;
  }
  std::vector<std::string> fields;
  if (values.count("fields")) fields = split_list(values["fields"].as<std::string>());
  const double timeout = values["timeout"].as<double>();
  MPIGRAD_CHECK(std::isfinite(timeout) && timeout > 0 && timeout <= 1e6,
                "inspect: --timeout must be a number of seconds in (0, 1e6], got ", timeout);
  inspect_files(
      values["files"].as<std::vector<std::string>>(), fields,
      [](const std::string& path) { return hdf5::File::open(path); },
      std::chrono::milliseconds(static_cast<int64_t>(std::ceil(timeout * 1000))), std::cout);
  return 0;
}

}  // namespace

namespace {

// The inspection itself, run in the child: every HDF5 call on the files happens here.
std::string inspect_in_child(const std::vector<std::string>& files, std::vector<std::string> fields,
                             const std::function<hdf5::File(const std::string&)>& open_file,
                             core::IsolatedProgress& progress) {
  std::ostringstream out;
  const bool fields_given = !fields.empty();
  for (const std::string& path : files) {
    progress.at("opening " + path);
    hdf5::File file = open_file(path);
    std::error_code error;
    uintmax_t bytes = std::filesystem::file_size(path, error);
    out << "file " << path << " (" << (error ? file.size_on_disk() : int64_t(bytes)) << " bytes)\n";
    progress.at("listing the groups of " + path);
    const hdf5::File::GroupWalk walk = file.walk_groups("/");
    for (const std::string& name : walk.datasets) {
      progress.at("reading dataset " + name + " of " + path);
      hdf5::Dataset dataset = file.open_dataset(name);
      hdf5::Datatype type = dataset.file_type();
      auto dtype = type.to_dtype();
      out << "  " << name << "  "
          << (dtype ? std::string(core::dtype_name(*dtype)) : type.describe() + " (unsupported)")
          << "  " << dataset.shape() << "  " << layout_text(dataset) << "\n";
      if (!fields_given && path == files[0] && name.rfind('/') == 0)
        fields.push_back(name.substr(1));
    }
    for (const std::string& link : walk.ancestor_links) {
      out << "  " << link << "  (link to an ancestor group, not followed)\n";
    }
    for (const std::string& link : walk.repeated_links) {
      out << "  " << link << "  (another link to a group listed above, not followed)\n";
    }
    // Each attribute by its own type and shape; one HDF5 cannot read is listed as unreadable.
    progress.at("listing the root attributes of " + path);
    for (const std::string& attribute : file.list_attributes("/")) {
      progress.at("reading attribute @" + attribute + " of " + path);
      out << "  @" << attribute << " = " << file.attribute_text("/", attribute) << "\n";
    }
  }
  MPIGRAD_CHECK(!fields.empty(), "inspect: ", files[0],
                " has no datasets at its root; name them with --fields");
  progress.at("checking the files as one dataset");
  Hdf5DatasetOptions dataset_options;
  dataset_options.fields = fields;
  dataset_options.open_file = open_file;
  Hdf5Dataset dataset(files, dataset_options);
  out << "dataset: N = " << dataset.total_size() << " samples, " << dataset.fields().size()
      << " fields, " << dataset.num_shards() << " shard" << (dataset.num_shards() == 1 ? "" : "s")
      << "\n";
  for (const FieldInfo& field : dataset.fields()) {
    out << "  field " << field.name << "  " << field.dtype << "  per-sample " << field.sample_shape
        << "  (" << field.sample_bytes() << " bytes)\n";
  }
  int64_t begin = 0;
  for (int s = 0; s < dataset.num_shards(); ++s) {
    out << "  shard " << s << "  " << dataset.shard_path(s) << "  samples [" << begin << ", "
        << begin + dataset.shard_size(s) << ")\n";
    begin += dataset.shard_size(s);
  }
  return out.str();
}

}  // namespace

void inspect_files(const std::vector<std::string>& files, std::vector<std::string> fields,
                   const std::function<hdf5::File(const std::string&)>& open_file,
                   std::chrono::milliseconds timeout, std::ostream& out) {
  MPIGRAD_CHECK(!files.empty(), "inspect: no files given");
  // HDF5 1.10 can crash or hang decoding a corrupt file (core/isolated.h): the walk runs in a
  // child, so such a file ends in one error naming what was being read.
  out << core::run_isolated(
      [&](core::IsolatedProgress& progress) {
        return inspect_in_child(files, fields, open_file, progress);
      },
      timeout, "inspect: HDF5");
}

int run_data_command(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << kCommands;
    return 1;
  }
  const std::string command = argv[1];
  if (command == "--help" || command == "-h" || command == "help") {
    std::cout << kCommands;
    return 0;
  }
  // The subcommand's own arguments follow it; argv[1] plays the program name for the parser.
  int sub_argc = argc - 1;
  char** sub_argv = argv + 1;
  try {
    if (command == "convert-idx") return convert_idx(sub_argc, sub_argv);
    if (command == "convert-zarr") return convert_zarr_command(sub_argc, sub_argv);
    if (command == "inspect") return inspect(sub_argc, sub_argv);
    if (command == "synth") return synth(sub_argc, sub_argv);
    std::cerr << "mpigrad-data: unknown command '" << command << "'\n\n" << kCommands;
    return 1;
  } catch (const po::error& error) {
    std::cerr << "mpigrad-data " << command << ": " << error.what() << " (see --help)\n";
  } catch (const std::exception& error) {
    std::cerr << "mpigrad-data " << command << ": error: " << error.what() << "\n";
  }
  return 1;
}

}  // namespace mpigrad::data
