// Reader for the IDX format of MNIST and Fashion-MNIST (gzipped or not): a magic number giving the
// element type and rank, big-endian int32 extents, then big-endian elements.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mpigrad/core/dtype.h"

namespace mpigrad::data {

struct IdxArray {
  core::DType dtype = core::kUInt8;  // uint8, int32, float32 or float64
  std::vector<int64_t> dims;
  std::vector<uint8_t> bytes;  // elements in host byte order, row-major
};

// Reads a .idx file, or a gzipped one (detected by its content, not its name). A missing,
// truncated or malformed file, or an element type mpigrad does not hold (int8, int16), is a
// core::Error naming the file.
IdxArray read_idx(const std::string& path);

}  // namespace mpigrad::data
