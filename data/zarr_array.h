// One Zarr v3 array of a store on the local file system, read a range of rows at a time.
//
// Opening reads only the array's zarr.json (with nlohmann-json): extents, data type, regular chunk
// grid, chunk key encoding (default or v2, '/' or '.'), fill value and codecs. Reading rows
// decodes only the chunks those rows touch, through a ChunkCache shared by the store's arrays:
//   - codecs: bytes (little or big endian), then any of zstd, gzip, crc32c; or sharding_indexed
//     with such a chain inside and an index of bytes (+ crc32c) at the start or the end of each
//     shard, whose inner chunks are then the unit of reading;
//   - chunks may split any axis (Zarr's default chunking splits the trailing ones too), chunks past
//     the extents are full-sized, and a chunk that was never written reads as the fill value.
// This is what nvalchemi-toolkit's AtomicDataZarrWriter writes, with or without sharding.
//
// Every problem is a core::Error naming the store, the array and, for data, the chunk file: a
// missing or malformed zarr.json, Zarr v2 metadata, an unsupported data type, chunk grid or codec
// (named), a chunk that is truncated, corrupt or decodes to the wrong size, a shard whose index
// does not match its bytes.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "mpigrad/data/chunk_cache.h"
#include "mpigrad/data/stored_array.h"
#include "mpigrad/data/zarr_codecs.h"

namespace mpigrad::data {

// What a Zarr path holds, from its zarr.json: a group's attributes (as JSON text) or an array.
enum class ZarrNode { Missing, Group, Array };
// The kind of node at `path` (a folder); Missing when it has no zarr.json. Throws for Zarr v2
// metadata (.zarray, .zgroup) and for a zarr.json that is not Zarr v3.
ZarrNode zarr_node_kind(const std::string& path);
// A group's "attributes" object as JSON text ("{}" when it has none).
std::string zarr_group_attributes(const std::string& path);

class ZarrArray final : public StoredArray {
 public:
  // Opens `store`/`name` (name as "core/positions"); decoded chunks go to `cache`.
  ZarrArray(std::string store, std::string name, std::shared_ptr<ChunkCache> cache);

  void read_rows(int64_t begin, int64_t count, void* out) const override;

  const std::vector<int64_t>& chunk_shape() const { return chunk_shape_; }  // storage objects
  // The unit a read decodes: the inner chunks of a sharded array, else the chunks.
  const std::vector<int64_t>& read_shape() const { return read_shape_; }
  bool sharded() const { return sharded_; }

 private:
  // One link of a codec chain: the bytes-to-bytes codecs after the array-to-bytes codec.
  struct Chain {
    bool big_endian = false;
    std::vector<zarr::BytesCodec> codecs;
  };

  std::string what() const;                                     // "Zarr store S: array core/x"
  std::string key_of(const std::vector<int64_t>& chunk) const;  // "c/0/1"
  ChunkCache::Block unit(const std::vector<int64_t>& coords) const;
  ChunkCache::Block decode(std::vector<char> encoded, const Chain& chain,
                           const std::string& where) const;
  ChunkCache::Block fill_block() const;
  std::vector<zarr::ShardEntry> shard_index(const std::string& path, uint64_t shard_bytes) const;

  std::string store_;
  std::string directory_;
  std::shared_ptr<ChunkCache> cache_;
  size_t stored_size_ = 0;  // bytes per stored element
  int stored_kind_ = 0;     // how to widen stored elements to dtype_ (zarr_array.cpp)
  std::vector<char> fill_;  // one element of dtype_
  std::vector<int64_t> chunk_shape_;
  std::vector<int64_t> read_shape_;
  char separator_ = '/';
  bool v2_keys_ = false;
  Chain chain_;  // the array's (a sharded array's inner chunks use inner_)
  bool sharded_ = false;
  Chain inner_;
  bool index_at_end_ = true;
  bool index_big_endian_ = false;
  bool index_checksum_ = false;
  int64_t unit_bytes_ = 0;    // decoded bytes of one read unit, as dtype_
  int64_t stored_bytes_ = 0;  // encoded-side bytes of one read unit before the bytes codec
  mutable std::shared_ptr<const std::vector<char>> fill_block_;
  mutable std::mutex fill_mutex_;
};

}  // namespace mpigrad::data
