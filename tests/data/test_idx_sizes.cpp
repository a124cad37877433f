// IDX headers that lie about the size: extents whose product overflows int64, and a header that
// declares far more data than the file holds. Each is one core::Error naming the file, found
// before anything of the declared size is allocated.
#include <doctest/doctest.h>

#include <fstream>

#include "data_test_util.h"
#include "mpigrad/core/error.h"
#include "mpigrad/data/idx.h"

using namespace mpigrad;
using namespace mpigrad::data;

namespace {
std::string write_idx(const test::TempDir& dir, const std::string& name, uint8_t type,
                      std::vector<uint32_t> dims, const std::string& elements) {
  std::string bytes = {0, 0, char(type), char(dims.size())};
  for (uint32_t extent : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) bytes += char((extent >> shift) & 0xff);
  }
  bytes += elements;
  const std::string path = dir.file(name);
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}
}  // namespace

TEST_CASE("idx: extents whose product overflows are an error, not a wrapped size") {
  test::TempDir dir;
  // 65536^4 = 2^64: wraps to 0 elements in int64 arithmetic.
  const std::string path = write_idx(dir, "wrap.idx", 0x08, {65536, 65536, 65536, 65536}, "");
  CHECK_THROWS_WITH_AS(read_idx(path), doctest::Contains("wrap.idx"), core::Error);
  const std::string huge =
      write_idx(dir, "huge.idx", 0x0E, {0xffffffffu, 0xffffffffu, 0xffffffffu}, "");
  CHECK_THROWS_WITH_AS(read_idx(huge), doctest::Contains("huge.idx"), core::Error);
}

TEST_CASE("idx: a header declaring more data than the file holds is 'truncated', allocation-free") {
  test::TempDir dir;
  // 2^36 float64 elements (512 GiB) declared, 16 bytes present.
  const std::string path =
      write_idx(dir, "liar.idx", 0x0E, {16, 65536, 65536}, std::string(16, '\0'));
  CHECK_THROWS_WITH_AS(read_idx(path), doctest::Contains("truncated"), core::Error);
}
