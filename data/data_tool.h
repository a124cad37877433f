// The data tool: `mpigrad-data <subcommand>` (and later `mpigrad data <subcommand>`).
//   convert-idx  IDX files (MNIST / Fashion-MNIST, gzipped or not) -> HDF5 shards of
//                uint8 x [N,1,H,W] and int64 y [N]
//   convert-zarr an atomic Zarr v3 store (nvalchemi-toolkit's) -> the same layout in HDF5
//                (data/convert_zarr.h)
//   inspect      the fields, dtypes, shapes, N and shards of HDF5 dataset files
//   synth        synthetic classification data of a given shape, for benchmarks and tests
// Every subcommand has --help. Files are written to a temporary name and renamed when complete.
#pragma once

#include <chrono>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "mpigrad/core/hdf5.h"

namespace mpigrad::data {

// argv[0] is the program (or "data"), argv[1] the subcommand. Returns the process exit code:
// 0 on success or --help, 1 on any error (printed as one line on stderr).
int run_data_command(int argc, char** argv);

// The file names the tool writes for `output` split into `shards`: output itself for one shard,
// else "<stem>-00000-of-00004.h5", ... next to it.
std::vector<std::string> shard_paths(const std::string& output, int shards);

// What `inspect` does once its options are parsed, with the files opened by `open_file` (the
// fuzz target hands in-memory images): lists each file's datasets and root attributes on `out`,
// then checks the files as one sharded dataset of `fields` (empty: every dataset at the root of
// the first file). The HDF5 calls run in a child process (core/isolated.h), so a file that
// crashes HDF5, or keeps it busy past `timeout`, ends in a core::Error like any other problem.
void inspect_files(const std::vector<std::string>& files, std::vector<std::string> fields,
                   const std::function<core::hdf5::File(const std::string&)>& open_file,
                   std::chrono::milliseconds timeout, std::ostream& out);

}  // namespace mpigrad::data
