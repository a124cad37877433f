#include "mpigrad/data/chunk_cache.h"

namespace mpigrad::data {

ChunkCache::Block ChunkCache::find(const Key& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = entries_.find(key);
  if (found == entries_.end()) {
    ++misses_;
    return nullptr;
  }
  ++hits_;
  order_.splice(order_.begin(), order_, found->second);
  return found->second->block;
}

void ChunkCache::insert(const Key& key, Block block) {
  const int64_t size = int64_t(block->size());
  std::lock_guard<std::mutex> lock(mutex_);
  if (size > capacity_) return;
  auto found = entries_.find(key);
  if (found != entries_.end()) {  // another thread decoded it meanwhile
    order_.splice(order_.begin(), order_, found->second);
    return;
  }
  order_.push_front(Entry{key, std::move(block)});
  entries_.emplace(key, order_.begin());
  bytes_ += size;
  while (bytes_ > capacity_) {
    const Entry& oldest = order_.back();
    bytes_ -= int64_t(oldest.block->size());
    entries_.erase(oldest.key);
    order_.pop_back();
  }
}

int64_t ChunkCache::bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_;
}

int64_t ChunkCache::hits() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return hits_;
}

int64_t ChunkCache::misses() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return misses_;
}

}  // namespace mpigrad::data
