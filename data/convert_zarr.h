// `mpigrad data convert-zarr IN.zarr OUT.h5`: an atomic store (data/atomic_store.h), as
// nvalchemi-toolkit writes it in Zarr v3, rewritten as the same layout in one HDF5 file: the
// arrays of meta/, core/ and custom/ under the same names, each field with its "level" attribute,
// and num_samples on the root. Soft-deleted structures and the masks are kept as they are.
// The input is checked as a store first (a bad one is an error before anything is written), each
// array is copied in blocks of rows (memory stays bounded whatever the store's size), and the
// output is written under a temporary name and renamed when complete.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

namespace mpigrad::data {

struct ConvertZarrOptions {
  int64_t chunk_rows = 0;  // > 0: chunked HDF5 datasets of this many rows (0: contiguous)
  int gzip_level = 0;      // 1..9: deflate (needs chunk_rows)
};

// Writes `output` from the store at `input`; prints one line per array to `out`.
void convert_atomic_store(const std::string& input, const std::string& output,
                          const ConvertZarrOptions& options, std::ostream& out);

// The subcommand: argv[0] is "convert-zarr". Returns 0, or throws (run_data_command prints).
int convert_zarr_command(int argc, char** argv);

}  // namespace mpigrad::data
