// Fused multi-tensor optimizer updates on CUDA: SGD (momentum, dampening, nesterov, weight
// decay), Adam and AdamW, many parameter tensors per kernel launch.
//
// Layout: the host list of slots is turned into device slots (pointers, element count and the
// per-tensor constants, computed in double on the host exactly as the CPU kernels compute them)
// and copied into the caller's device array with one cudaMemcpyAsync; the kernel reads them
// from there, so the launch's parameters do not grow with the number of tensors.
// Thread mapping: blockIdx.y picks the tensor; blockIdx.x and threadIdx.x stride over its
// elements (a grid-stride loop sized for the largest tensor, so a block of a small tensor
// exits at once). Up to 65535 tensors (the grid's y limit) go in one launch; longer lists take
// one launch per 65535.
// Every element is updated in place in its storage type, as on the CPU; the gradient is read.
#include <algorithm>
#include <cmath>
#include <vector>

#include "mpigrad/kernels/cuda/common.cuh"
#include "mpigrad/kernels/optimizer.h"

namespace mpigrad::kernels::cuda {
namespace {

using detail::as_stream;

constexpr int64_t kMaxTensorsPerLaunch = 65535;
constexpr int64_t kMaxBlocksPerTensor = 1024;

struct SgdDeviceSlot {
  void* param;
  const void* grad;
  void* buffer;
  int64_t numel;
  double lr, momentum, blend, weight_decay;
  bool nesterov, first_step;
};

struct AdamDeviceSlot {
  void* param;
  const void* grad;
  void* exp_avg;
  void* exp_avg_sq;
  int64_t numel;
  double step_size, sqrt_correction2, beta1, beta2, eps, weight_decay, decay;
  bool decoupled;
};

template <typename T>
__global__ void sgd_multi_kernel(const SgdDeviceSlot* slots) {
  const SgdDeviceSlot s = slots[blockIdx.y];
  T* param = static_cast<T*>(s.param);
  const T* grad = static_cast<const T*>(s.grad);
  T* buffer = static_cast<T*>(s.buffer);
  const T lr = T(s.lr), momentum = T(s.momentum), wd = T(s.weight_decay), blend = T(s.blend);
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < s.numel; i += stride) {
    T d = grad[i];
    if (s.weight_decay != 0) d += wd * param[i];
    if (s.momentum != 0) {
      const T b = s.first_step ? d : momentum * buffer[i] + blend * d;
      buffer[i] = b;
      d = s.nesterov ? d + momentum * b : b;
    }
    param[i] -= lr * d;
  }
}

template <typename T>
__global__ void adam_multi_kernel(const AdamDeviceSlot* slots) {
  const AdamDeviceSlot s = slots[blockIdx.y];
  T* param = static_cast<T*>(s.param);
  const T* grad = static_cast<const T*>(s.grad);
  T* exp_avg = static_cast<T*>(s.exp_avg);
  T* exp_avg_sq = static_cast<T*>(s.exp_avg_sq);
  const T step_size = T(s.step_size), sqrt_correction2 = T(s.sqrt_correction2);
  const T beta1 = T(s.beta1), beta2 = T(s.beta2), eps = T(s.eps), wd = T(s.weight_decay);
  const T decay = T(s.decay);
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < s.numel; i += stride) {
    T g = grad[i];
    T p = param[i];
    if (s.decoupled) {
      p *= decay;
    } else if (s.weight_decay != 0) {
      g += wd * p;
    }
    const T m = beta1 * exp_avg[i] + (T(1) - beta1) * g;
    const T v = beta2 * exp_avg_sq[i] + (T(1) - beta2) * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    param[i] = p - step_size * m / (detail::m_sqrt(v) / sqrt_correction2 + eps);
  }
}

// Copies the device slots in and launches `kernel` once per kMaxTensorsPerLaunch tensors.
template <typename Slot, typename Kernel>
void launch_multi(const char* name, const std::vector<Slot>& host, void* device_slots,
                  Kernel kernel, void* stream) {
  if (host.empty()) return;
  // Pageable host memory: the call returns once the source has been staged, so `host` may go.
  detail::check_cuda(cudaMemcpyAsync(device_slots, host.data(), host.size() * sizeof(Slot),
                                     cudaMemcpyHostToDevice, as_stream(stream)),
                     "cudaMemcpyAsync (slots)", name);
  const Slot* slots = static_cast<const Slot*>(device_slots);
  for (size_t first = 0; first < host.size(); first += size_t(kMaxTensorsPerLaunch)) {
    const size_t count = std::min(host.size() - first, size_t(kMaxTensorsPerLaunch));
    int64_t largest = 0;
    for (size_t k = first; k < first + count; ++k) largest = std::max(largest, host[k].numel);
    const int64_t blocks = std::clamp<int64_t>((largest + detail::kThreads - 1) / detail::kThreads,
                                               1, kMaxBlocksPerTensor);
    kernel<<<dim3(unsigned(blocks), unsigned(count)), detail::kThreads, 0, as_stream(stream)>>>(
        slots + first);
  }
  detail::check_launch(name, stream);
}

void check_dtype(const char* name, DType dtype) {
  if (dtype != DType::Float32 && dtype != DType::Float64)
    detail::throw_unsupported(name, "", dtype);
}

}  // namespace

size_t sgd_slots_bytes(int64_t count) {
  return size_t(count) * sizeof(SgdDeviceSlot);
}
size_t adam_slots_bytes(int64_t count) {
  return size_t(count) * sizeof(AdamDeviceSlot);
}

void sgd_step_multi(DType dtype, int64_t count, const SgdSlot* slots, void* device_slots,
                    void* stream) {
  check_dtype("sgd_step_multi", dtype);
  std::vector<SgdDeviceSlot> host;
  host.reserve(size_t(count));
  for (int64_t k = 0; k < count; ++k) {
    const SgdSlot& s = slots[k];
    if (s.numel <= 0) continue;
    if (s.hyper.momentum != 0 && s.momentum_buffer == nullptr) {
      detail::throw_invalid("sgd_step_multi", "a momentum buffer is needed when momentum != 0");
    }
    host.push_back(SgdDeviceSlot{s.param, s.grad, s.momentum_buffer, s.numel, s.hyper.lr,
                                 s.hyper.momentum, 1.0 - s.hyper.dampening, s.hyper.weight_decay,
                                 s.hyper.nesterov, s.hyper.first_step});
  }
  if (dtype == DType::Float32) {
    launch_multi("sgd_step_multi", host, device_slots, sgd_multi_kernel<float>, stream);
  } else {
    launch_multi("sgd_step_multi", host, device_slots, sgd_multi_kernel<double>, stream);
  }
}

void adam_step_multi(DType dtype, int64_t count, const AdamSlot* slots, void* device_slots,
                     void* stream) {
  check_dtype("adam_step_multi", dtype);
  std::vector<AdamDeviceSlot> host;
  host.reserve(size_t(count));
  for (int64_t k = 0; k < count; ++k) {
    const AdamSlot& s = slots[k];
    if (s.numel <= 0) continue;
    const AdamHyper& h = s.hyper;
    // The same double-precision constants as kernels/cpu/optimizer.cpp.
    const double correction1 = 1.0 - std::pow(h.beta1, double(h.step));
    const double correction2 = 1.0 - std::pow(h.beta2, double(h.step));
    host.push_back(AdamDeviceSlot{s.param, s.grad, s.exp_avg, s.exp_avg_sq, s.numel,
                                  h.lr / correction1, std::sqrt(correction2), h.beta1, h.beta2,
                                  h.eps, h.weight_decay, 1.0 - h.lr * h.weight_decay,
                                  h.decoupled_weight_decay});
  }
  if (dtype == DType::Float32) {
    launch_multi("adam_step_multi", host, device_slots, adam_multi_kernel<float>, stream);
  } else {
    launch_multi("adam_step_multi", host, device_slots, adam_multi_kernel<double>, stream);
  }
}

}  // namespace mpigrad::kernels::cuda
