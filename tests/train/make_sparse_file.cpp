// make-sparse-file OUT.h5 X Y: writes what h5py's
//     f.create_dataset(X, shape=(2**40, 8), chunks=(1024, 8), dtype="f4")[:1024] = 0
//     f.create_dataset(Y, shape=(2**40,), chunks=(65536,), dtype="i8")[:1024] = 0
// writes: datasets that declare 2^40 samples, of which one chunk each was ever written; a few KB
// on disk. Used by train_checks.sh to show that such a file is refused up front.
#include <cstdio>

#include "mpigrad/core/hdf5.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s OUT.h5 X Y\n", argv[0]);
    return 2;
  }
  namespace hdf5 = mpigrad::core::hdf5;
  using namespace mpigrad::core;
  try {
    const int64_t huge = int64_t(1) << 40;
    hdf5::File file = hdf5::File::create(argv[1]);
    hdf5::Dataset x = file.create_dataset(argv[2], kFloat32, {huge, 8}, {.chunk_rows = 1024});
    x.write_rows(0, 1024, zeros({1024, 8}).data_ptr(), kFloat32);
    hdf5::Dataset y = file.create_dataset(argv[3], kInt64, {huge}, {.chunk_rows = 65536});
    y.write_rows(0, 1024, zeros({1024}, kInt64).data_ptr(), kInt64);
    file.close();
  } catch (const std::exception& error) {
    std::fprintf(stderr, "make-sparse-file: %s\n", error.what());
    return 1;
  }
  return 0;
}
