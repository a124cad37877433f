// Helpers for the data tests: a temporary directory and writers of small, recognisable HDF5
// datasets (sample g has x = pattern(g) and y = g, so any read can be checked exactly).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "mpigrad/core/hdf5.h"
#include "mpigrad/data/batch.h"

namespace mpigrad::data::test {

class TempDir {
 public:
  TempDir() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "mpigrad-data-test-XXXXXX").string();
    char* made = ::mkdtemp(pattern.data());
    if (made == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = made;
  }
  explicit TempDir(std::string existing) : path_(std::move(existing)), owned_(false) {}
  ~TempDir() {
    if (!owned_) return;
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
  bool owned_ = true;
};

// The x value of element j of global sample g (x is uint8 [N, 2, 3]).
inline uint8_t pattern(int64_t g, int64_t j) {
  return uint8_t((g * 7 + j * 13) % 251);
}
constexpr int64_t kSampleElements = 6;

// Writes samples [first, first + n) as uint8 x [n, 2, 3] and int64 y [n] (y = g).
inline void write_pattern_file(const std::string& path, int64_t first, int64_t n,
                               const std::string& x_name = "x", const std::string& y_name = "y",
                               core::hdf5::DatasetLayout layout = {}) {
  core::hdf5::AtomicFileWriter writer(path);
  std::vector<uint8_t> x(static_cast<size_t>(n * kSampleElements));
  std::vector<int64_t> y(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    y[size_t(i)] = first + i;
    for (int64_t j = 0; j < kSampleElements; ++j)
      x[size_t(i * kSampleElements + j)] = pattern(first + i, j);
  }
  writer.file()
      .create_dataset(x_name, core::kUInt8, {n, 2, 3}, layout)
      .write(x.data(), core::kUInt8);
  writer.file().create_dataset(y_name, core::kInt64, {n}, layout).write(y.data(), core::kInt64);
  writer.commit();
}

// Writes the samples split into shards of the given sizes; returns the paths.
inline std::vector<std::string> write_pattern_shards(const TempDir& dir,
                                                     const std::vector<int64_t>& sizes,
                                                     core::hdf5::DatasetLayout layout = {},
                                                     const std::string& stem = "shard") {
  std::vector<std::string> paths;
  int64_t first = 0;
  for (size_t s = 0; s < sizes.size(); ++s) {
    paths.push_back(dir.file(stem + std::to_string(s) + ".h5"));
    write_pattern_file(paths.back(), first, sizes[s], "x", "y", layout);
    first += sizes[s];
  }
  return paths;
}

// True when every sample of the batch holds the pattern of the index it claims (offset: the
// global index of the batch's index 0, e.g. a MultiDataset child's first sample).
inline bool batch_matches(const Batch& batch, const std::vector<int64_t>& expected_globals) {
  if (batch.size() != int64_t(expected_globals.size())) return false;
  const core::Tensor& x = batch["x"];
  const core::Tensor& y = batch["y"];
  if (x.dtype() != core::kUInt8 || y.dtype() != core::kInt64) return false;
  const uint8_t* xs = x.data<uint8_t>();
  const int64_t* ys = y.data<int64_t>();
  for (size_t i = 0; i < expected_globals.size(); ++i) {
    int64_t g = expected_globals[i];
    if (ys[i] != g) return false;
    for (int64_t j = 0; j < kSampleElements; ++j) {
      if (xs[int64_t(i) * kSampleElements + j] != pattern(g, j)) return false;
    }
  }
  return true;
}

}  // namespace mpigrad::data::test
