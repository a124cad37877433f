// mpigrad-bench-data: data loading throughput against raw HDF5 reads of the same bytes, and the
// trainer's wait on data per step with and without prefetching.
//
// It writes a contiguous HDF5 file (uint8 x [N, C, H, W], int64 y [N]) into a temporary
// directory, then measures, each as the best of --repeats epochs:
//   slice mode:  raw = one H5Dread per field per batch of consecutive rows (the C API, reused
//                buffer); loader = Hdf5Dataset in slice mode + DataLoader (sequential batches),
//                on demand and from memory
//   shuffled:    raw = per batch, one H5Dread per field of the union of the batch's sorted rows
//                into a reused buffer, then a scatter into batch order; loader = DataLoader with
//                shuffle
// and reports samples/s, GB/s and loader/raw ratios (target >= 0.9 in slice mode). Then, with a
// simulated compute time per step (a sleep, as a GPU step leaves the host idle), the mean time
// the trainer waits for each batch with 0 workers (no prefetch) and with prefetching workers.
// The file was just written, so reads come from the page cache: this measures the software
// path (HDF5, copies, the loader), not the disk.
//
// Usage: mpigrad-bench-data [--json FILE] [--samples N] [--shape C,H,W] [--batch-size B]
//                           [--workers W] [--compute-ms T] [--repeats R] [--quick]
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "../common/bench_util.h"
#include "mpigrad/core/hdf5.h"
#include "mpigrad/data/data_loader.h"
#include "mpigrad/data/hdf5_dataset.h"
#include "mpigrad/data/sampler.h"

namespace {

using namespace mpigrad;  // NOLINT
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Best of `repeats` timings of fn (after one warm-up run).
template <typename Fn>
double best_of(int repeats, Fn&& fn) {
  fn();
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    auto start = Clock::now();
    fn();
    best = std::min(best, seconds_since(start));
  }
  return best;
}

void write_file(const std::string& path, int64_t n, const std::vector<int64_t>& shape) {
  int64_t features = 1;
  for (int64_t e : shape) features *= e;
  core::hdf5::AtomicFileWriter writer(path);
  std::vector<int64_t> dims = shape;
  dims.insert(dims.begin(), n);
  core::hdf5::Dataset x = writer.file().create_dataset("x", core::kUInt8, dims);
  core::hdf5::Dataset y = writer.file().create_dataset("y", core::kInt64, {n});
  const int64_t block = 4096;
  std::vector<uint8_t> xs;
  std::vector<int64_t> ys;
  for (int64_t row = 0; row < n; row += block) {
    int64_t rows = std::min(block, n - row);
    xs.resize(size_t(rows * features));
    ys.resize(size_t(rows));
    for (int64_t i = 0; i < rows; ++i) {
      ys[size_t(i)] = (row + i) % 10;
      for (int64_t j = 0; j < features; ++j)
        xs[size_t(i * features + j)] = uint8_t((row + i + j) * 31);
    }
    x.write_rows(row, rows, xs.data(), core::kUInt8);
    y.write_rows(row, rows, ys.data(), core::kInt64);
  }
  writer.commit();
}

// The raw baseline: plain HDF5 C calls, no mpigrad.
class RawReader {
 public:
  explicit RawReader(const std::string& path) {
    core::hdf5::silence_errors();
    file_ = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    x_ = H5Dopen2(file_, "/x", H5P_DEFAULT);
    y_ = H5Dopen2(file_, "/y", H5P_DEFAULT);
    x_space_ = H5Dget_space(x_);
    y_space_ = H5Dget_space(y_);
    rank_ = H5Sget_simple_extent_ndims(x_space_);
    H5Sget_simple_extent_dims(x_space_, dims_, nullptr);
    row_bytes_ = 1;
    for (int d = 1; d < rank_; ++d) row_bytes_ *= int64_t(dims_[d]);
  }
  ~RawReader() {
    H5Sclose(x_space_);
    H5Sclose(y_space_);
    H5Dclose(x_);
    H5Dclose(y_);
    H5Fclose(file_);
  }
  int64_t row_bytes() const { return row_bytes_; }

  // Rows [row, row + rows) of x and y.
  void read_rows(int64_t row, int64_t rows, uint8_t* x, int64_t* y) {
    hsize_t start[8] = {hsize_t(row)}, count[8];
    for (int d = 0; d < rank_; ++d) count[d] = dims_[d];
    count[0] = hsize_t(rows);
    H5Sselect_hyperslab(x_space_, H5S_SELECT_SET, start, nullptr, count, nullptr);
    H5Sselect_hyperslab(y_space_, H5S_SELECT_SET, start, nullptr, count, nullptr);
    hsize_t x_elements = hsize_t(rows * row_bytes_), y_elements = hsize_t(rows);
    hid_t x_memory = H5Screate_simple(1, &x_elements, nullptr),
          y_memory = H5Screate_simple(1, &y_elements, nullptr);
    H5Dread(x_, H5T_NATIVE_UINT8, x_memory, x_space_, H5P_DEFAULT, x);
    H5Dread(y_, H5T_NATIVE_INT64, y_memory, y_space_, H5P_DEFAULT, y);
    H5Sclose(x_memory);
    H5Sclose(y_memory);
  }

  // The rows `indices` in that order: one union selection per field, then a scatter.
  void read_indices(const std::vector<int64_t>& indices, uint8_t* x, int64_t* y,
                    std::vector<uint8_t>& x_scratch, std::vector<int64_t>& y_scratch) {
    std::vector<int64_t> order(indices.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(),
              [&](int64_t a, int64_t b) { return indices[size_t(a)] < indices[size_t(b)]; });
    hsize_t start[8] = {0}, count[8];
    for (int d = 0; d < rank_; ++d) count[d] = dims_[d];
    count[0] = 1;
    for (size_t i = 0; i < order.size(); ++i) {
      start[0] = hsize_t(indices[size_t(order[i])]);
      const H5S_seloper_t op = i == 0 ? H5S_SELECT_SET : H5S_SELECT_OR;
      H5Sselect_hyperslab(x_space_, op, start, nullptr, count, nullptr);
    }
    for (size_t i = 0; i < order.size(); ++i) {
      start[0] = hsize_t(indices[size_t(order[i])]);
      const H5S_seloper_t op = i == 0 ? H5S_SELECT_SET : H5S_SELECT_OR;
      H5Sselect_hyperslab(y_space_, op, start, nullptr, &count[0], nullptr);
    }
    const int64_t n = int64_t(indices.size());
    x_scratch.resize(size_t(n * row_bytes_));
    y_scratch.resize(size_t(n));
    hsize_t x_elements = hsize_t(n * row_bytes_), y_elements = hsize_t(n);
    hid_t x_memory = H5Screate_simple(1, &x_elements, nullptr),
          y_memory = H5Screate_simple(1, &y_elements, nullptr);
    H5Dread(x_, H5T_NATIVE_UINT8, x_memory, x_space_, H5P_DEFAULT, x_scratch.data());
    H5Dread(y_, H5T_NATIVE_INT64, y_memory, y_space_, H5P_DEFAULT, y_scratch.data());
    H5Sclose(x_memory);
    H5Sclose(y_memory);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t k = order[size_t(i)];
      std::memcpy(x + k * row_bytes_, x_scratch.data() + i * row_bytes_, size_t(row_bytes_));
      y[k] = y_scratch[size_t(i)];
    }
  }

 private:
  hid_t file_, x_, y_, x_space_, y_space_;
  int rank_ = 0;
  hsize_t dims_[8] = {};
  int64_t row_bytes_ = 0;
};

std::vector<int64_t> parse_shape(const std::string& text) {
  std::vector<int64_t> shape;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    shape.push_back(std::stoll(text.substr(start, comma - start)));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return shape;
}

// Seconds for one epoch of the loader.
double loader_epoch(data::DataLoader& loader, int64_t& samples) {
  auto start = Clock::now();
  samples = 0;
  for (data::Batch& batch : loader) samples += batch.size();
  return seconds_since(start);
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  int64_t samples = 20000, batch_size = 256;
  std::string shape_text = "3,32,32";
  int workers = 2, repeats = 3;
  double compute_ms = 5.0;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "mpigrad-bench-data: %s needs a value\n", arg.c_str());
        std::exit(1);
      }
      return argv[++i];
    };
    if (arg == "--json")
      json_path = value();
    else if (arg == "--samples")
      samples = std::stoll(value());
    else if (arg == "--shape")
      shape_text = value();
    else if (arg == "--batch-size")
      batch_size = std::stoll(value());
    else if (arg == "--workers")
      workers = std::stoi(value());
    else if (arg == "--compute-ms")
      compute_ms = std::stod(value());
    else if (arg == "--repeats")
      repeats = std::stoi(value());
    else if (arg == "--quick") {
      samples = 4000;
      repeats = 1;
    } else {
      std::printf(
          "usage: %s [--json FILE] [--samples N] [--shape C,H,W] [--batch-size B] [--workers W]\n"
          "          [--compute-ms T] [--repeats R] [--quick]\n",
          argv[0]);
      return arg == "--help" || arg == "-h" ? 0 : 1;
    }
  }

  try {
    const std::vector<int64_t> shape = parse_shape(shape_text);
    std::string pattern =
        (std::filesystem::temp_directory_path() / "mpigrad-bench-data-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    const std::string dir = pattern, path = dir + "/bench.h5";
    struct Cleanup {
      std::string dir;
      ~Cleanup() {
        std::error_code ignored;
        std::filesystem::remove_all(dir, ignored);
      }
    } cleanup{dir};
    write_file(path, samples, shape);

    RawReader raw(path);
    const int64_t row_bytes = raw.row_bytes() + int64_t(sizeof(int64_t));
    const int64_t epoch_bytes = samples * row_bytes;
    std::vector<uint8_t> x(size_t(batch_size * raw.row_bytes())), x_scratch;
    std::vector<int64_t> y(static_cast<size_t>(batch_size)), y_scratch;

    bench::Results results;
    results.add_text("hdf5", core::hdf5::library_version());
    results.add_text("dataset", std::to_string(samples) + " x uint8 [" + shape_text +
                                    "] + int64, batch " + std::to_string(batch_size) + ", " +
                                    std::to_string(workers) + " workers");
    auto add_throughput = [&](const std::string& key, double seconds) {
      results.add(key + "_samples_per_s", double(samples) / seconds, "1/s");
      results.add(key + "_gb_per_s", double(epoch_bytes) / seconds / 1e9, "GB/s");
    };

    // ---- Slice mode ------------------------------------------------------------------------
    const double raw_slice = best_of(repeats, [&] {
      for (int64_t row = 0; row < samples; row += batch_size) {
        raw.read_rows(row, std::min(batch_size, samples - row), x.data(), y.data());
      }
    });
    add_throughput("raw_slice", raw_slice);

    data::Hdf5DatasetOptions sequential;
    sequential.access = data::AccessPattern::Sequential;
    auto on_demand =
        std::make_shared<data::Hdf5Dataset>(std::vector<std::string>{path}, sequential);
    on_demand->set_rank_slice(1, 0);
    double loader_slice = 1e30, loader_slice_workers = 1e30;
    for (int w : {0, workers}) {
      data::DataLoaderOptions options;
      options.batch_size = batch_size;
      options.num_workers = w;
      data::DataLoader loader(on_demand, options);
      int64_t seen = 0;
      double best = best_of(repeats, [&] { loader_epoch(loader, seen); });
      (w == 0 ? loader_slice : loader_slice_workers) = best;
    }
    add_throughput("loader_slice", loader_slice);
    add_throughput("loader_slice_workers", loader_slice_workers);
    results.add("slice_ratio_vs_raw", raw_slice / loader_slice, "x", "target >= 0.9 (0 workers)");
    results.add("slice_workers_ratio_vs_raw", raw_slice / loader_slice_workers, "x");

    auto in_memory =
        std::make_shared<data::Hdf5Dataset>(std::vector<std::string>{path}, sequential);
    auto load_start = Clock::now();
    in_memory->set_rank_slice(1, 0, false, true);
    const double load_seconds = seconds_since(load_start);
    results.add("slice_memory_load_gb_per_s", double(epoch_bytes) / load_seconds / 1e9, "GB/s",
                "one read per field");
    results.add("slice_memory_load_ratio_vs_raw", raw_slice / load_seconds, "x");
    {
      data::DataLoaderOptions options;
      options.batch_size = batch_size;
      data::DataLoader loader(in_memory, options);
      int64_t seen = 0;
      add_throughput("loader_memory", best_of(repeats, [&] { loader_epoch(loader, seen); }));
    }

    // ---- Shuffled ----------------------------------------------------------------------------
    const std::vector<int64_t> permutation = data::random_permutation(samples, 1);
    const double raw_shuffled = best_of(repeats, [&] {
      for (int64_t start = 0; start < samples; start += batch_size) {
        std::vector<int64_t> batch(permutation.begin() + start,
                                   permutation.begin() + std::min(samples, start + batch_size));
        raw.read_indices(batch, x.data(), y.data(), x_scratch, y_scratch);
      }
    });
    add_throughput("raw_shuffled", raw_shuffled);
    auto random_access = std::make_shared<data::Hdf5Dataset>(std::vector<std::string>{path});
    double loader_shuffled = 1e30, loader_shuffled_workers = 1e30;
    for (int w : {0, workers}) {
      data::DataLoaderOptions options;
      options.batch_size = batch_size;
      options.shuffle = true;
      options.seed = 1;
      options.num_workers = w;
      data::DataLoader loader(random_access, options);
      int64_t seen = 0;
      double best = best_of(repeats, [&] { loader_epoch(loader, seen); });
      (w == 0 ? loader_shuffled : loader_shuffled_workers) = best;
    }
    add_throughput("loader_shuffled", loader_shuffled);
    add_throughput("loader_shuffled_workers", loader_shuffled_workers);
    results.add("shuffled_ratio_vs_raw", raw_shuffled / loader_shuffled, "x", "0 workers");
    results.add("shuffled_workers_ratio_vs_raw", raw_shuffled / loader_shuffled_workers, "x");

    // ---- Wait on data per step, with a simulated compute time -------------------------------
    const auto compute = std::chrono::duration<double, std::milli>(compute_ms);
    for (int w : {0, workers}) {
      data::DataLoaderOptions options;
      options.batch_size = batch_size;
      options.shuffle = true;
      options.num_workers = w;
      options.prefetch_factor = 2;
      data::DataLoader loader(random_access, options);
      int64_t steps = 0;
      auto start = Clock::now();
      for (data::Batch& batch : loader) {
        (void)batch;
        std::this_thread::sleep_for(compute);  // the trainer's step: the host waits on the GPU
        ++steps;
      }
      const double step_ms = seconds_since(start) * 1e3 / double(steps);
      const std::string key = w == 0 ? "wait_per_step_no_prefetch" : "wait_per_step_prefetch";
      results.add(key + "_ms", loader.wait_seconds() * 1e3 / double(steps), "ms",
                  "compute " + std::to_string(compute_ms).substr(0, 4) + " ms/step, " +
                      std::to_string(w) + " workers, step " + std::to_string(step_ms).substr(0, 5) +
                      " ms");
    }

    return results.report(json_path, "mpigrad-bench-data");
  } catch (const std::exception& error) {
    std::fprintf(stderr, "mpigrad-bench-data: error: %s\n", error.what());
    return 1;
  }
  return 0;
}
