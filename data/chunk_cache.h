// A bounded, thread-safe cache of decoded chunks, shared by the arrays of one atomic store
// (data/atomic_store.h). A loader reads a structure's atoms as a few rows of each field; the rows
// of neighbouring structures share a chunk, which is read and decompressed once and then served
// from here while the loader walks through it. Least recently used blocks go first once the
// decoded bytes pass the capacity. Blocks are shared pointers: one in use survives its eviction.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace mpigrad::data {

class ChunkCache {
 public:
  using Block = std::shared_ptr<const std::vector<char>>;
  // Which block: an owner (an array) and a number it gives its blocks (a chunk, a shard index).
  struct Key {
    const void* owner = nullptr;
    int64_t number = 0;
    friend bool operator==(const Key& a, const Key& b) {
      return a.owner == b.owner && a.number == b.number;
    }
  };

  explicit ChunkCache(int64_t capacity_bytes) : capacity_(capacity_bytes) {}

  Block find(const Key& key);                // null when absent; marks the block recently used
  void insert(const Key& key, Block block);  // keeps nothing when capacity is 0

  int64_t capacity() const { return capacity_; }
  int64_t bytes() const;  // decoded bytes held now
  int64_t hits() const;
  int64_t misses() const;

 private:
  struct KeyHash {
    size_t operator()(const Key& key) const {
      return std::hash<const void*>()(key.owner) ^ (std::hash<int64_t>()(key.number) * 31);
    }
  };
  struct Entry {
    Key key;
    Block block;
  };
  const int64_t capacity_;
  mutable std::mutex mutex_;
  std::list<Entry> order_;  // most recently used first
  std::unordered_map<Key, std::list<Entry>::iterator, KeyHash> entries_;
  int64_t bytes_ = 0;
  int64_t hits_ = 0, misses_ = 0;
};

}  // namespace mpigrad::data
