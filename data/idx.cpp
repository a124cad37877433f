#include "mpigrad/data/idx.h"

#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <memory>

#include "mpigrad/core/error.h"
#include "mpigrad/core/shape.h"

namespace mpigrad::data {

namespace {

struct GzCloser {
  void operator()(gzFile file) const { gzclose(file); }
};
using GzFile = std::unique_ptr<gzFile_s, GzCloser>;

// Reads exactly n bytes or throws naming what was being read.
void read_exact(gzFile file, void* out, size_t n, const std::string& path, const char* what) {
  auto* bytes = static_cast<unsigned char*>(out);
  while (n > 0) {
    unsigned chunk = unsigned(std::min<size_t>(n, size_t(1) << 30));
    int got = gzread(file, bytes, chunk);
    if (got < 0) {
      int code = 0;
      const char* message = gzerror(file, &code);
      core::fail("IDX file ", path, ": reading the ", what,
                 " failed: ", message ? message : "zlib error", " (corrupt gzip stream?)");
    }
    MPIGRAD_CHECK(got > 0, "IDX file ", path, ": truncated while reading the ", what);
    bytes += got;
    n -= size_t(got);
  }
}

}  // namespace

IdxArray read_idx(const std::string& path) {
  std::error_code error;
  MPIGRAD_CHECK(std::filesystem::is_regular_file(path, error), "IDX file ", path, ": no such file");
  GzFile file(gzopen(path.c_str(), "rb"));  // reads plain files transparently
  MPIGRAD_CHECK(file != nullptr, "IDX file ", path, ": cannot open");
  gzbuffer(file.get(), 1 << 20);

  unsigned char magic[4];
  read_exact(file.get(), magic, 4, path, "magic number");
  MPIGRAD_CHECK(magic[0] == 0 && magic[1] == 0, "IDX file ", path,
                ": bad magic number (not an IDX file)");
  IdxArray array;
  int element_bytes = 0;
  switch (magic[2]) {
    case 0x08:
      array.dtype = core::kUInt8;
      element_bytes = 1;
      break;
    case 0x0C:
      array.dtype = core::kInt32;
      element_bytes = 4;
      break;
    case 0x0D:
      array.dtype = core::kFloat32;
      element_bytes = 4;
      break;
    case 0x0E:
      array.dtype = core::kFloat64;
      element_bytes = 8;
      break;
    case 0x09:
      core::fail("IDX file ", path, ": element type int8 is not supported");
    case 0x0B:
      core::fail("IDX file ", path, ": element type int16 is not supported");
    default:
      core::fail("IDX file ", path, ": unknown element type code ", int(magic[2]));
  }
  const int rank = magic[3];
  MPIGRAD_CHECK(rank >= 1 && rank <= 8, "IDX file ", path, ": rank ", rank, " outside 1..8");
  constexpr int64_t kMaxElements = int64_t(1) << 36;
  int64_t count = 1;
  for (int d = 0; d < rank; ++d) {
    unsigned char be[4];
    read_exact(file.get(), be, 4, path, "dimensions");
    int64_t extent =
        (int64_t(be[0]) << 24) | (int64_t(be[1]) << 16) | (int64_t(be[2]) << 8) | int64_t(be[3]);
    array.dims.push_back(extent);
    // Checked before multiplying: a few extents near 2^32 overflow int64.
    MPIGRAD_CHECK(extent == 0 || count <= kMaxElements / extent, "IDX file ", path,
                  ": implausible size: extents ", core::Shape(array.dims),
                  " so far exceed 2^36 elements");
    count *= extent;
  }
  // The data is read in pieces, the buffer growing as they arrive: a header that declares more
  // than the file holds ends in "truncated" after what is there, not in a huge allocation.
  const size_t total = size_t(count * element_bytes);
  constexpr size_t kPiece = size_t(64) << 20;
  for (size_t done = 0; done < total;) {
    const size_t piece = std::min(kPiece, total - done);
    array.bytes.resize(done + piece);
    read_exact(file.get(), array.bytes.data() + done, piece, path, "data");
    done += piece;
  }
  // Trailing bytes mean the header lied about the size.
  unsigned char extra;
  MPIGRAD_CHECK(gzread(file.get(), &extra, 1) == 0, "IDX file ", path,
                ": more data than its header declares");
  if (element_bytes > 1) {
    for (size_t i = 0; i < array.bytes.size(); i += size_t(element_bytes)) {
      std::reverse(array.bytes.begin() + std::ptrdiff_t(i),
                   array.bytes.begin() + std::ptrdiff_t(i + size_t(element_bytes)));
    }
  }
  return array;
}

}  // namespace mpigrad::data
