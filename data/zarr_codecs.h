// The Zarr v3 codecs the store reader decodes (data/zarr_array.h), on plain byte buffers:
//   bytes-to-bytes  zstd (Debian's libzstd), gzip (zlib), crc32c (a 4-byte little-endian
//                   CRC-32C after the data, checked);
//   array-to-bytes  bytes (raw elements, little or big endian), and sharding_indexed, whose shard
//                   index (offset, size per inner chunk) is decoded here.
// Decoding never trusts a size found in the data: every output is bounded by what the array's
// metadata says a chunk holds, so a corrupt or hostile chunk ends in a core::Error naming `what`
// (the store, the array and the chunk), never in a huge allocation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace mpigrad::data::zarr {

enum class BytesCodec { Zstd, Gzip, Crc32c };

// Undoes `codecs` (listed in encoding order, so they are undone last to first). The result of the
// whole chain must be exactly `decoded_bytes` long; each intermediate result is refused past
// `decoded_bytes` + 64 KiB (only a compressor's output may be larger than its input, and a chain
// of compressors still ends at the chunk's size).
std::vector<char> decode_bytes(std::vector<char> encoded, const std::vector<BytesCodec>& codecs,
                               size_t decoded_bytes, const std::string& what);

// Reverses the byte order of each `element_size`-byte element in place (big-endian chunks).
void swap_bytes(char* data, size_t count, size_t element_size);

// One entry of a shard's index: where an inner chunk's encoded bytes lie in the shard.
struct ShardEntry {
  uint64_t offset = 0;
  uint64_t size = 0;
  bool empty() const { return offset == ~uint64_t(0) && size == ~uint64_t(0); }
};

// The index of a shard with `chunks` inner chunks: `chunks` pairs of uint64 (offset, size) in
// `big_endian` or little-endian order, followed by a CRC-32C when `checksum`. Checks the CRC and
// that every non-empty entry lies inside a shard of `shard_bytes` bytes.
std::vector<ShardEntry> decode_shard_index(std::span<const char> index, int64_t chunks,
                                           bool big_endian, bool checksum, uint64_t shard_bytes,
                                           const std::string& what);
// Bytes the index of a shard of `chunks` inner chunks occupies.
inline int64_t shard_index_bytes(int64_t chunks, bool checksum) {
  return chunks * 16 + (checksum ? 4 : 0);
}

}  // namespace mpigrad::data::zarr
