#include "mpigrad/data/zarr_codecs.h"

#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>

#include "mpigrad/core/crc32c.h"
#include "mpigrad/core/error.h"

namespace mpigrad::data::zarr {

namespace {

constexpr size_t kSlack = 64 * 1024;

uint32_t load_u32_le(const char* bytes) {
  uint32_t value = 0;
  for (int i = 3; i >= 0; --i) value = (value << 8) | uint8_t(bytes[i]);
  return value;
}

uint64_t load_u64(const char* bytes, bool big_endian) {
  uint64_t value = 0;
  for (int i = 0; i < 8; ++i) value = (value << 8) | uint8_t(bytes[big_endian ? i : 7 - i]);
  return value;
}

struct ZstdStreamFree {
  void operator()(ZSTD_DStream* stream) const { ZSTD_freeDStream(stream); }
};

// A zstd stream (one frame or several in a row), refusing output past `limit` bytes. Streaming
// rather than ZSTD_getFrameContentSize: frames need not record their size.
std::vector<char> zstd_decode(const std::vector<char>& input, size_t limit,
                              const std::string& what) {
  std::unique_ptr<ZSTD_DStream, ZstdStreamFree> stream(ZSTD_createDStream());
  MPIGRAD_CHECK(stream != nullptr, what, ": cannot create a zstd decoder (out of memory?)");
  std::vector<char> output(std::min(limit, std::max<size_t>(input.size() * 4, 4096)));
  ZSTD_inBuffer in{input.data(), input.size(), 0};
  ZSTD_outBuffer out{output.data(), output.size(), 0};
  size_t remaining = 1;
  while (in.pos < in.size || remaining != 0) {
    if (out.pos == out.size) {
      MPIGRAD_CHECK(out.size < limit, what, ": zstd data decodes to more than the ", limit,
                    " bytes the chunk can hold (corrupt chunk)");
      output.resize(std::min(limit, out.size * 2));
      out.dst = output.data();
      out.size = output.size();
    }
    const size_t before_in = in.pos, before_out = out.pos;
    remaining = ZSTD_decompressStream(stream.get(), &out, &in);
    MPIGRAD_CHECK(!ZSTD_isError(remaining), what, ": zstd: ", ZSTD_getErrorName(remaining),
                  " (corrupt chunk)");
    if (in.pos == in.size && remaining != 0 && out.pos < out.size && in.pos == before_in &&
        out.pos == before_out) {
      core::fail(what, ": zstd data ends inside a frame (truncated chunk)");
    }
  }
  output.resize(out.pos);
  return output;
}

struct InflateEnd {
  void operator()(z_stream* stream) const { inflateEnd(stream); }
};

// A gzip (or zlib) stream, members one after another, refusing output past `limit` bytes.
std::vector<char> gzip_decode(const std::vector<char>& input, size_t limit,
                              const std::string& what) {
  z_stream stream{};
  MPIGRAD_CHECK(inflateInit2(&stream, 15 + 32) == Z_OK, what, ": cannot start zlib's inflate");
  std::unique_ptr<z_stream, InflateEnd> guard(&stream);
  std::vector<char> output(std::min(limit, std::max<size_t>(input.size() * 4, 4096)));
  stream.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(input.data()));
  stream.avail_in = uInt(input.size());
  MPIGRAD_CHECK(input.size() <= std::numeric_limits<uInt>::max(), what, ": gzip chunk of ",
                input.size(), " bytes is too large");
  size_t produced = 0;
  while (true) {
    if (produced == output.size()) {
      MPIGRAD_CHECK(output.size() < limit, what, ": gzip data decodes to more than the ", limit,
                    " bytes the chunk can hold (corrupt chunk)");
      output.resize(std::min(limit, output.size() * 2));
    }
    stream.next_out = reinterpret_cast<Bytef*>(output.data() + produced);
    stream.avail_out = uInt(output.size() - produced);
    const int status = inflate(&stream, Z_NO_FLUSH);
    produced = output.size() - stream.avail_out;
    if (status == Z_STREAM_END) {
      if (stream.avail_in == 0) break;
      MPIGRAD_CHECK(inflateReset(&stream) == Z_OK, what, ": zlib inflateReset failed");
      continue;
    }
    MPIGRAD_CHECK(status == Z_OK || (status == Z_BUF_ERROR && stream.avail_out == 0), what,
                  ": gzip: ", stream.msg != nullptr ? stream.msg : "data ends early",
                  " (corrupt or truncated chunk)");
  }
  output.resize(produced);
  return output;
}

}  // namespace

std::vector<char> decode_bytes(std::vector<char> encoded, const std::vector<BytesCodec>& codecs,
                               size_t decoded_bytes, const std::string& what) {
  const size_t limit = decoded_bytes + kSlack;
  for (auto codec = codecs.rbegin(); codec != codecs.rend(); ++codec) {
    switch (*codec) {
      case BytesCodec::Crc32c: {
        MPIGRAD_CHECK(encoded.size() >= 4, what, ": ", encoded.size(),
                      " bytes cannot hold the crc32c codec's 4-byte checksum (truncated chunk)");
        const size_t data = encoded.size() - 4;
        const uint32_t stored = load_u32_le(encoded.data() + data);
        const uint32_t computed = core::crc32c(encoded.data(), data);
        MPIGRAD_CHECK(stored == computed, what, ": crc32c checksum mismatch (stored ", stored,
                      ", computed ", computed, "): the chunk is corrupt");
        encoded.resize(data);
        break;
      }
      case BytesCodec::Zstd:
        encoded = zstd_decode(encoded, limit, what);
        break;
      case BytesCodec::Gzip:
        encoded = gzip_decode(encoded, limit, what);
        break;
    }
  }
  MPIGRAD_CHECK(encoded.size() == decoded_bytes, what, ": decodes to ", encoded.size(),
                " bytes, but a chunk holds ", decoded_bytes, " (corrupt or truncated chunk)");
  return encoded;
}

void swap_bytes(char* data, size_t count, size_t element_size) {
  if (element_size <= 1) return;
  for (size_t i = 0; i < count; ++i)
    std::reverse(data + i * element_size, data + (i + 1) * element_size);
}

std::vector<ShardEntry> decode_shard_index(std::span<const char> index, int64_t chunks,
                                           bool big_endian, bool checksum, uint64_t shard_bytes,
                                           const std::string& what) {
  MPIGRAD_CHECK(int64_t(index.size()) == shard_index_bytes(chunks, checksum), what,
                ": shard index of ", index.size(), " bytes, expected ",
                shard_index_bytes(chunks, checksum), " (truncated shard)");
  if (checksum) {
    const size_t data = index.size() - 4;
    const uint32_t stored = load_u32_le(index.data() + data);
    const uint32_t computed = core::crc32c(index.data(), data);
    MPIGRAD_CHECK(stored == computed, what, ": the shard index's crc32c checksum does not match (",
                  stored, " stored, ", computed, " computed): the shard is corrupt");
  }
  std::vector<ShardEntry> entries(static_cast<size_t>(chunks));
  for (int64_t i = 0; i < chunks; ++i) {
    ShardEntry& entry = entries[size_t(i)];
    entry.offset = load_u64(index.data() + i * 16, big_endian);
    entry.size = load_u64(index.data() + i * 16 + 8, big_endian);
    if (entry.empty()) continue;
    MPIGRAD_CHECK(entry.offset <= shard_bytes && entry.size <= shard_bytes - entry.offset, what,
                  ": the shard index places inner chunk ", i, " at bytes [", entry.offset, ", +",
                  entry.size, ") of a ", shard_bytes, "-byte shard (truncated or corrupt shard)");
  }
  return entries;
}

}  // namespace mpigrad::data::zarr
