// Autocast: the one table of which ops run in 16 bits under mixed precision, the thread's
// autocast state, and the cache of 16-bit parameter copies.
//
// Like torch.autocast's op lists, kAutocastPolicy is the single place the policy lives. The ops it
// marks LowPrecision (matmul, and so Linear; conv2d) consult autocast_dtype_for() themselves, so
// every caller - layers, the ONNX importer's graphs - follows it without knowing about it. Such an
// op reads its float32 operands as BFloat16 or Float16, multiplies on the backend's 16-bit path
// (oneDNN's AVX512-BF16 kernels, cuBLAS and cuDNN on the tensor cores) summing in fp32, and returns
// float32; its backward does the same for both products. Everything else (normalization, softmax,
// losses, reductions, the optimizer) therefore sees float32 and stays float32. Master weights stay
// float32: autocast_operand() caches the 16-bit copy of a parameter per version of its storage,
// and since an optimizer step bumps that version, a parameter is cast once per step however
// many times (micro-batches, shared layers) it is used.
// The state is per thread, as torch's is; backward does not need it (the nodes remember).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "mpigrad/core/device.h"
#include "mpigrad/core/dtype.h"
#include "mpigrad/core/tensor.h"

namespace mpigrad::core {

enum class AutocastRule : uint8_t {
  LowPrecision,  // 16-bit operands, fp32 accumulation, float32 result
  Float32,       // float32 in and out
};

struct AutocastPolicy {
  std::string_view op;
  AutocastRule rule;
};

// The policy table; ops not listed run in their inputs' dtype.
std::span<const AutocastPolicy> autocast_policy();

// The thread's autocast dtype (BFloat16 or Float16), or nullopt when autocast is off.
std::optional<DType> autocast_dtype();

// Turns autocast on in `dtype` (BFloat16 or Float16; Float32 or nullopt turn it off) for the
// guard's lifetime, restoring the previous state after.
class AutocastGuard {
 public:
  explicit AutocastGuard(std::optional<DType> dtype);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  std::optional<DType> previous_;
};

// The 16-bit dtype op `op` should read float32 `inputs` in: the thread's autocast dtype when it
// is on, the table marks `op` LowPrecision and every input is float32; otherwise nullopt.
std::optional<DType> autocast_dtype_for(std::string_view op,
                                        std::initializer_list<const Tensor*> inputs);

// `t` (float32) as a dense `dtype` tensor, without autograd. Tensors that require grad (the
// parameters, and views of them such as W.t()) are cast once per version of their storage and
// the copy kept; others are cast every time.
Tensor autocast_operand(const Tensor& t, DType dtype);

// The cached 16-bit copy of `t` that an in-place update of `t` may rewrite alongside it (the
// optimizers' steps do, kernels/optimizer.h), so the next forward finds it current and casts
// nothing. There is one only where the copy has t's shape and strides, is current for t's
// version, and nobody but the cache holds it (a graph kept with retain_graph still reads the old
// values). The caller writes the updated values into `data`, then calls autocast_copy_updated.
struct AutocastCopy {
  void* data = nullptr;
  DType dtype = kBFloat16;
};
std::optional<AutocastCopy> autocast_copy_for_update(const Tensor& t);
// After the update of `t` (its version bumped) wrote the copy autocast_copy_for_update gave: the
// copy is current for t's new version. A copy given out and not confirmed stays stale.
void autocast_copy_updated(const Tensor& t);

// Which kernels run the 16-bit products in `dtype` on `device`, for the run's log: the device's
// backend says (Backend::mixed_precision_kernels). The CPU says whether it found AVX512-BF16;
// CUDA with cuDNN tries a small convolution in `dtype` once and says whether cuDNN ran it or the
// convolutions will be widened to float32. Throws, as backend_for does, for a device not visible.
std::string autocast_kernels(DType dtype, Device device);

// Casts made and cache hits since the last reset, for tests and logs.
struct AutocastCacheStats {
  int64_t casts = 0;
  int64_t hits = 0;
};
AutocastCacheStats autocast_cache_stats();
// Drops the thread's cached copies and zeroes the counters.
void clear_autocast_cache();

}  // namespace mpigrad::core
