// The pinned host allocator and the asynchronous copies of core/pinned.h.
//
// Pinned blocks are cudaHostAlloc'd (portable: usable by every device's streams) at the device
// allocator's size classes and cached when freed. An asynchronous copy records an event in the
// block; a freed block whose events have not all completed stays out of reuse until they have.
#include "mpigrad/core/pinned.h"

#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "mpigrad/core/autograd.h"
#include "mpigrad/core/cuda.h"
#include "mpigrad/core/cuda/caching_allocator.cuh"
#include "mpigrad/core/cuda/cuda_backend.cuh"
#include "mpigrad/core/cuda/cuda_check.cuh"

namespace mpigrad::core {

namespace cuda_detail {

namespace {

class PinnedHostAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    const size_t size = CudaCachingAllocator::round_size(nbytes);
    std::lock_guard<std::mutex> lock(mutex_);
    auto bin = free_.find(size);
    if (bin != free_.end()) {
      for (size_t i = 0; i < bin->second.size(); ++i) {
        void* ptr = bin->second[i];
        if (!uses_finished(blocks_[ptr])) continue;
        bin->second[i] = bin->second.back();
        bin->second.pop_back();
        blocks_[ptr].live = true;
        return ptr;
      }
    }
    MPIGRAD_CHECK(cuda_device_count() > 0, "pinned memory: no CUDA device is visible");
    // cudaHostAlloc works in the current device's context: the home device's, not cuda:0's.
    MPIGRAD_CUDA_CHECK(make_home_device_current(-1));
    void* ptr = nullptr;
    MPIGRAD_CUDA_CHECK(cudaHostAlloc(&ptr, size, cudaHostAllocPortable));
    blocks_[ptr] = Block{size, true, {}};
    return ptr;
  }

  void deallocate(void* ptr, size_t) override {
    if (ptr == nullptr) return;
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = blocks_.find(ptr);
    if (it == blocks_.end() || !it->second.live) return;
    it->second.live = false;
    free_[it->second.size].push_back(ptr);
  }

  bool contains(const void* ptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    return find_block(ptr) != nullptr;
  }

  void record_use(const void* ptr, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    Block* block = find_block(ptr);
    if (block == nullptr) return;
    cudaEvent_t event = nullptr;
    MPIGRAD_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    block->uses.push_back(event);
    MPIGRAD_CUDA_CHECK(cudaEventRecord(event, stream));
  }

 private:
  struct Block {
    size_t size = 0;
    bool live = false;
    std::vector<cudaEvent_t> uses;  // copies that read or write the block
  };

  // Drops the finished events; true when none is pending.
  static bool uses_finished(Block& block) {
    for (size_t i = 0; i < block.uses.size();) {
      const cudaError_t status = cudaEventQuery(block.uses[i]);
      if (status == cudaErrorNotReady) return false;
      MPIGRAD_CUDA_CHECK(status);
      (void)cudaEventDestroy(block.uses[i]);
      block.uses[i] = block.uses.back();
      block.uses.pop_back();
    }
    return true;
  }

  // The live block that contains ptr (a tensor may start inside its block).
  Block* find_block(const void* ptr) {
    auto it = blocks_.upper_bound(const_cast<void*>(ptr));
    if (it == blocks_.begin()) return nullptr;
    --it;
    const auto* base = static_cast<const char*>(it->first);
    const auto* p = static_cast<const char*>(ptr);
    if (!it->second.live || p >= base + it->second.size) return nullptr;
    return &it->second;
  }

  std::mutex mutex_;
  std::map<void*, Block> blocks_;  // every block ever allocated, ordered for find_block
  std::unordered_map<size_t, std::vector<void*>> free_;
};

// Never destroyed: pinned tensors in static objects may be freed after static destructors ran.
PinnedHostAllocator& pinned() {
  static auto* allocator = new PinnedHostAllocator();
  return *allocator;
}

}  // namespace

bool pinned_contains(const void* ptr) {
  return pinned().contains(ptr);
}
void pinned_record_use(const void* ptr, cudaStream_t stream) {
  pinned().record_use(ptr, stream);
}

}  // namespace cuda_detail

Allocator& pinned_host_allocator() {
  return cuda_detail::pinned();
}

Tensor empty_pinned(const Shape& shape, DType dtype) {
  for (int64_t extent : shape) {
    MPIGRAD_CHECK(extent >= 0, "empty_pinned: negative extent in shape ", shape);
  }
  const size_t nbytes = size_t(shape.numel() * element_size(dtype));
  auto storage = std::make_shared<Storage>(nbytes, kCPU, pinned_host_allocator());
  return Tensor(
      std::make_shared<TensorImpl>(std::move(storage), shape, contiguous_strides(shape), 0, dtype));
}

bool is_pinned(const Tensor& tensor) {
  return tensor.defined() && tensor.device().is_cpu() && tensor.numel() > 0 &&
         cuda_detail::pinned_contains(tensor.data_ptr());
}

Tensor pin_memory(const Tensor& tensor) {
  MPIGRAD_CHECK(tensor.defined() && tensor.device().is_cpu(), "pin_memory: expected a CPU tensor");
  Tensor out = empty_pinned(tensor.shape(), tensor.dtype());
  NoGradGuard no_grad;
  out.copy_(tensor);
  return out;
}

Tensor to_async(const Tensor& tensor, Device device) {
  MPIGRAD_CHECK(tensor.defined(), "to_async: undefined tensor");
  MPIGRAD_CHECK(tensor.device().is_cpu() != device.is_cpu(),
                "to_async: copies between the host "
                "and a CUDA device only, got ",
                tensor.device(), " -> ", device);
  NoGradGuard no_grad;
  Tensor source = tensor.contiguous();
  if (device.is_cuda()) {
    Tensor out = Tensor::empty(source.shape(), TensorOptions(source.dtype()).device(device));
    cuda_detail::cuda_backend(device.index)
        .copy_from_host_async(out.data_ptr(), source.data_ptr(), source.nbytes());
    return out;
  }
  Tensor out = empty_pinned(source.shape(), source.dtype());
  cuda_detail::cuda_backend(source.device().index)
      .copy_to_host_async(out.data_ptr(), source.data_ptr(), source.nbytes());
  return out;
}

}  // namespace mpigrad::core
