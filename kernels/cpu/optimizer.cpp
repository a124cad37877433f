// CPU optimizer updates: SGD (momentum, dampening, nesterov, weight decay), Adam and AdamW.
//
// Layout: dense buffers of n elements, updated in place (param, momentum buffer, moments).
// Threading: elements are split over threads; each element is independent.
// Precision: hyperparameters and bias corrections are computed in double once, then every
// element is updated in its storage type (as PyTorch does for float32 parameters).
#include "mpigrad/kernels/optimizer.h"

#include <cmath>

#include "mpigrad/kernels/cpu/parallel.h"
#include "mpigrad/kernels/cpu/scalar.h"

namespace mpigrad::kernels::cpu {
namespace {

template <typename T>
void sgd_typed(int64_t n, const SgdHyper& h, T* param, const T* grad, T* buffer) {
  const T lr = T(h.lr), momentum = T(h.momentum), wd = T(h.weight_decay);
  const T blend = T(1.0 - h.dampening);
  parallel_for(0, n, kElementwiseGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      T d = grad[i];
      if (h.weight_decay != 0) d += wd * param[i];
      if (h.momentum != 0) {
        const T b = h.first_step ? d : momentum * buffer[i] + blend * d;
        buffer[i] = b;
        d = h.nesterov ? d + momentum * b : b;
      }
      param[i] -= lr * d;
    }
  });
}

template <typename T>
void adam_typed(int64_t n, const AdamHyper& h, T* param, const T* grad, T* exp_avg, T* exp_avg_sq) {
  const double correction1 = 1.0 - std::pow(h.beta1, double(h.step));
  const double correction2 = 1.0 - std::pow(h.beta2, double(h.step));
  const T step_size = T(h.lr / correction1);
  const T sqrt_correction2 = T(std::sqrt(correction2));
  const T beta1 = T(h.beta1), beta2 = T(h.beta2), eps = T(h.eps), wd = T(h.weight_decay);
  const T decay = T(1.0 - h.lr * h.weight_decay);
  parallel_for(0, n, kElementwiseGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      T g = grad[i];
      T p = param[i];
      if (h.decoupled_weight_decay) {
        p *= decay;
      } else if (h.weight_decay != 0) {
        g += wd * p;
      }
      const T m = beta1 * exp_avg[i] + (T(1) - beta1) * g;
      const T v = beta2 * exp_avg_sq[i] + (T(1) - beta2) * g * g;
      exp_avg[i] = m;
      exp_avg_sq[i] = v;
      param[i] = p - step_size * m / (std::sqrt(v) / sqrt_correction2 + eps);
    }
  });
}

}  // namespace

void sgd_step(DType dtype, int64_t n, const SgdHyper& hyper, void* param, const void* grad,
              void* momentum_buffer) {
  switch (dtype) {
    case DType::Float32:
      return sgd_typed(n, hyper, static_cast<float*>(param), static_cast<const float*>(grad),
                       static_cast<float*>(momentum_buffer));
    case DType::Float64:
      return sgd_typed(n, hyper, static_cast<double*>(param), static_cast<const double*>(grad),
                       static_cast<double*>(momentum_buffer));
    default:
      throw_unsupported("sgd_step", "", dtype);
  }
}

void adam_step(DType dtype, int64_t n, const AdamHyper& hyper, void* param, const void* grad,
               void* exp_avg, void* exp_avg_sq) {
  switch (dtype) {
    case DType::Float32:
      return adam_typed(n, hyper, static_cast<float*>(param), static_cast<const float*>(grad),
                        static_cast<float*>(exp_avg), static_cast<float*>(exp_avg_sq));
    case DType::Float64:
      return adam_typed(n, hyper, static_cast<double*>(param), static_cast<const double*>(grad),
                        static_cast<double*>(exp_avg), static_cast<double*>(exp_avg_sq));
    default:
      throw_unsupported("adam_step", "", dtype);
  }
}

}  // namespace mpigrad::kernels::cpu
