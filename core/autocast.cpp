#include "mpigrad/core/autocast.h"

#include <map>
#include <memory>
#include <tuple>

#include "mpigrad/core/backend.h"
#include "mpigrad/core/error.h"
#include "mpigrad/core/ops/op_support.h"

namespace mpigrad::core {
namespace {

constexpr AutocastPolicy kAutocastPolicy[] = {
    // The GEMM-bound ops, where 16-bit operands double the arithmetic rate.
    {"matmul", AutocastRule::LowPrecision},
    {"conv2d", AutocastRule::LowPrecision},
    // Sums over many elements, exponentials and running statistics lose too much in 16 bits.
    {"batch_norm", AutocastRule::Float32},
    {"layer_norm", AutocastRule::Float32},
    {"softmax", AutocastRule::Float32},
    {"log_softmax", AutocastRule::Float32},
    {"cross_entropy", AutocastRule::Float32},
    {"mse_loss", AutocastRule::Float32},
    {"supcon_loss", AutocastRule::Float32},
    {"sum", AutocastRule::Float32},
    {"mean", AutocastRule::Float32},
    {"norm", AutocastRule::Float32},
    {"optimizer_step", AutocastRule::Float32},
};

// Read by every op: initial-exec, as grad mode (core/autograd.cpp) is.
[[gnu::tls_model("initial-exec")]] thread_local std::optional<DType> current_dtype;

struct CacheEntry {
  std::weak_ptr<Storage> storage;
  uint32_t version = 0;
  Shape shape, strides;
  Tensor copy;
  bool given_for_update = false;  // autocast_copy_for_update handed it out, unconfirmed
};

// Keyed by storage address, element offset and target dtype; the entry's weak pointer and
// version say whether it still describes that memory.
using CacheKey = std::tuple<const Storage*, int64_t, DType>;
struct Cache {
  std::map<CacheKey, CacheEntry> entries;
  AutocastCacheStats stats;
};
thread_local Cache cache;

void drop_dead_entries() {
  for (auto it = cache.entries.begin(); it != cache.entries.end();) {
    it = it->second.storage.expired() ? cache.entries.erase(it) : std::next(it);
  }
}

}  // namespace

std::span<const AutocastPolicy> autocast_policy() {
  return kAutocastPolicy;
}

std::optional<DType> autocast_dtype() {
  return current_dtype;
}

AutocastGuard::AutocastGuard(std::optional<DType> dtype) : previous_(current_dtype) {
  MPIGRAD_CHECK(!dtype || *dtype == kFloat32 || *dtype == kBFloat16 || *dtype == kFloat16,
                "autocast: the dtype must be float32, bfloat16 or float16, got ", *dtype);
  current_dtype = dtype && *dtype != kFloat32 ? dtype : std::nullopt;
}

AutocastGuard::~AutocastGuard() {
  current_dtype = previous_;
}

std::optional<DType> autocast_dtype_for(std::string_view op,
                                        std::initializer_list<const Tensor*> inputs) {
  if (!current_dtype) return std::nullopt;
  bool low = false;
  for (const AutocastPolicy& entry : kAutocastPolicy) {
    if (entry.op == op) low = entry.rule == AutocastRule::LowPrecision;
  }
  if (!low) return std::nullopt;
  for (const Tensor* t : inputs) {
    if (t->defined() && t->dtype() != kFloat32) return std::nullopt;
  }
  return current_dtype;
}

Tensor autocast_operand(const Tensor& t, DType dtype) {
  if (!t.requires_grad()) {
    ++cache.stats.casts;
    return detail::copy_as(t.detach(), dtype);
  }
  const CacheKey key{t.storage().get(), t.offset(), dtype};
  auto found = cache.entries.find(key);
  if (found != cache.entries.end()) {
    const CacheEntry& entry = found->second;
    if (entry.storage.lock() == t.storage() && entry.version == t.version() &&
        entry.shape == t.shape() && entry.strides == t.strides()) {
      ++cache.stats.hits;
      return entry.copy;
    }
  } else {
    drop_dead_entries();
  }
  ++cache.stats.casts;
  Tensor copy = detail::copy_as(t.detach(), dtype);
  cache.entries[key] = CacheEntry{t.storage(), t.version(), t.shape(), t.strides(), copy};
  return copy;
}

std::optional<AutocastCopy> autocast_copy_for_update(const Tensor& t) {
  // The update writes numel elements from data_ptr(): the copy's order only where t is dense.
  if (t.dtype() != kFloat32 || !t.is_contiguous()) return std::nullopt;
  for (DType dtype : {kBFloat16, kFloat16}) {
    auto found = cache.entries.find(CacheKey{t.storage().get(), t.offset(), dtype});
    if (found == cache.entries.end()) continue;
    CacheEntry& entry = found->second;
    const bool sole_holder =
        entry.copy.impl_shared().use_count() == 1 && entry.copy.storage().use_count() == 1;
    if (entry.storage.lock() == t.storage() && entry.version == t.version() &&
        entry.shape == t.shape() && entry.strides == t.strides() && sole_holder) {
      entry.given_for_update = true;
      return AutocastCopy{entry.copy.data_ptr(), dtype};
    }
  }
  return std::nullopt;
}

void autocast_copy_updated(const Tensor& t) {
  for (DType dtype : {kBFloat16, kFloat16}) {
    auto found = cache.entries.find(CacheKey{t.storage().get(), t.offset(), dtype});
    if (found == cache.entries.end() || !found->second.given_for_update) continue;
    found->second.given_for_update = false;
    found->second.version = t.version();
  }
}

std::string autocast_kernels(DType dtype, Device device) {
  return backend_for(device).mixed_precision_kernels(dtype);
}

AutocastCacheStats autocast_cache_stats() {
  return cache.stats;
}

void clear_autocast_cache() {
  cache = Cache{};
}

}  // namespace mpigrad::core
