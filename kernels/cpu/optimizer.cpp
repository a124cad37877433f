// CPU optimizer updates: SGD (momentum, dampening, nesterov, weight decay), Adam and AdamW,
// multi-tensor: one call steps every tensor of a list (a parameter group, or all groups of one
// dtype), each with its own hyperparameters.
//
// Layout: dense buffers of numel elements per tensor, updated in place (param, momentum buffer,
// moments); the gradient is only read. One pass per element over all of its buffers.
// Threading: the tensors are laid end to end in one index space of all their elements, and that
// space is cut into pieces the threads take in turn as they finish the last
// (parallel_for_balanced), so a step is one OpenMP region however many tensors it has, and the
// threads share the work whether the list is one 38M-element embedding or 60 BatchNorm vectors,
// and whether or not they run at the same pace (the pass runs at memory speed, where a thread
// whose core is busy elsewhere falls behind). A piece that crosses tensors walks them in order.
// Every element is independent, so the result depends neither on the thread count nor on which
// thread took which piece.
// Precision: hyperparameters and bias corrections are computed in double once per tensor, before
// the parallel region, then rounded to the storage type; every element is updated in its storage
// type (as PyTorch does for float32 parameters). The vector loops (SSE2, the x86-64 baseline)
// do exactly the scalar loop's operations in the same order, and none of them is fused into an
// FMA, so every lane is bitwise the scalar result (tests/nn/test_optim_multi_tensor.cpp).
// Why Adam has explicit vectors and SGD does not: GCC will not vectorize std::sqrt while it may
// set errno (-fmath-errno, the default), and the flag is the whole library's; SGD's loop
// vectorizes as written.
#include "mpigrad/kernels/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "mpigrad/kernels/cpu/parallel.h"
#include "mpigrad/kernels/cpu/scalar.h"
#include "mpigrad/kernels/elementwise.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace mpigrad::kernels::cpu {
namespace {

// Element offsets of the tensors laid end to end: tensor k holds [offsets[k], offsets[k + 1]).
template <typename Slot>
std::vector<int64_t> end_to_end_offsets(int64_t count, const Slot* slots) {
  std::vector<int64_t> offsets(size_t(count) + 1, 0);
  for (int64_t k = 0; k < count; ++k) offsets[size_t(k) + 1] = offsets[size_t(k)] + slots[k].numel;
  return offsets;
}

// Calls run(k, begin, end) for every piece of tensor k in [begin, end) (its own indices), over
// all elements of all tensors, in one parallel region.
template <typename Run>
void for_each_piece(const std::vector<int64_t>& offsets, Run run) {
  parallel_for_balanced(
      0, offsets.back(), kElementwiseGrain, kBalancedPiece, [&](int64_t begin, int64_t end) {
        // The last tensor that starts at or before `begin` (empty tensors share its offset).
        size_t k =
            size_t(std::upper_bound(offsets.begin(), offsets.end(), begin) - offsets.begin()) - 1;
        for (; begin < end; ++k) {
          const int64_t stop = std::min(end, offsets[k + 1]);
          if (stop > begin) run(k, begin - offsets[k], stop - offsets[k]);
          begin = stop;
        }
      });
}

// A slot's 16-bit copy of the range just updated (SgdSlot::low_copy), written while the range is
// still in cache: bit for bit the cast autocast would make of it (convert_dense).
template <typename T>
void write_low_copy(const T* param, void* low_copy, DType low_dtype, int64_t begin, int64_t end) {
  if constexpr (std::is_same_v<T, float>) {
    if (low_copy != nullptr) {
      convert_dense(low_dtype, DType::Float32, end - begin,
                    static_cast<uint16_t*>(low_copy) + begin, param + begin);
    }
  }
}

// ---- SGD ----------------------------------------------------------------------------------------

enum class MomentumMode { None, First, Blend };

// One tensor's SGD update with its constants rounded to T.
template <typename T>
struct SgdTensor {
  T* param;
  const T* grad;
  T* buffer;
  void* low_copy;
  DType low_dtype;
  T lr, momentum, weight_decay, blend;
  bool decay, nesterov;
  MomentumMode mode;
};

template <typename T>
SgdTensor<T> sgd_tensor(const SgdSlot& s) {
  const SgdHyper& h = s.hyper;
  SgdTensor<T> t{};
  t.param = static_cast<T*>(s.param);
  t.grad = static_cast<const T*>(s.grad);
  t.buffer = static_cast<T*>(s.momentum_buffer);
  t.low_copy = s.low_copy;
  t.low_dtype = s.low_dtype;
  t.lr = T(h.lr);
  t.momentum = T(h.momentum);
  t.weight_decay = T(h.weight_decay);
  t.blend = T(1.0 - h.dampening);
  t.decay = h.weight_decay != 0;
  t.nesterov = h.nesterov;
  t.mode = h.momentum == 0 ? MomentumMode::None
                           : (h.first_step ? MomentumMode::First : MomentumMode::Blend);
  return t;
}

// d = g + wd*p; buf = first ? d : momentum*buf + blend*d; d = nesterov ? d + momentum*buf : buf;
// p -= lr*d. The options are template arguments so each loop has no branch and vectorizes.
template <typename T, bool kDecay, MomentumMode kMode, bool kNesterov>
void sgd_range(const SgdTensor<T>& t, int64_t begin, int64_t end) {
  T* __restrict param = t.param;
  const T* __restrict grad = t.grad;
  T* __restrict buffer = t.buffer;
  const T lr = t.lr, momentum = t.momentum, wd = t.weight_decay, blend = t.blend;
  for (int64_t i = begin; i < end; ++i) {
    T d = grad[i];
    if constexpr (kDecay) d += wd * param[i];
    if constexpr (kMode != MomentumMode::None) {
      const T b = kMode == MomentumMode::First ? d : momentum * buffer[i] + blend * d;
      buffer[i] = b;
      d = kNesterov ? d + momentum * b : b;
    }
    param[i] -= lr * d;
  }
}

template <typename T, bool kDecay>
void sgd_range_with(const SgdTensor<T>& t, int64_t begin, int64_t end) {
  switch (t.mode) {
    case MomentumMode::None:
      return sgd_range<T, kDecay, MomentumMode::None, false>(t, begin, end);
    case MomentumMode::First:
      return t.nesterov ? sgd_range<T, kDecay, MomentumMode::First, true>(t, begin, end)
                        : sgd_range<T, kDecay, MomentumMode::First, false>(t, begin, end);
    case MomentumMode::Blend:
      return t.nesterov ? sgd_range<T, kDecay, MomentumMode::Blend, true>(t, begin, end)
                        : sgd_range<T, kDecay, MomentumMode::Blend, false>(t, begin, end);
  }
}

template <typename T>
void sgd_multi(int64_t count, const SgdSlot* slots) {
  std::vector<SgdTensor<T>> tensors;
  tensors.reserve(size_t(count));
  for (int64_t k = 0; k < count; ++k) tensors.push_back(sgd_tensor<T>(slots[k]));
  for_each_piece(end_to_end_offsets(count, slots), [&](size_t k, int64_t begin, int64_t end) {
    const SgdTensor<T>& t = tensors[k];
    t.decay ? sgd_range_with<T, true>(t, begin, end) : sgd_range_with<T, false>(t, begin, end);
    write_low_copy(t.param, t.low_copy, t.low_dtype, begin, end);
  });
}

// ---- Adam and AdamW -----------------------------------------------------------------------------

enum class DecayMode { None, L2, Decoupled };

// One tensor's Adam update with its constants (bias corrections included) rounded to T.
template <typename T>
struct AdamTensor {
  T* param;
  const T* grad;
  T* exp_avg;
  T* exp_avg_sq;
  void* low_copy;
  DType low_dtype;
  T step_size, sqrt_correction2, beta1, beta2, one_minus_beta1, one_minus_beta2, eps;
  T weight_decay, decay;
  DecayMode mode;
};

template <typename T>
AdamTensor<T> adam_tensor(const AdamSlot& s) {
  const AdamHyper& h = s.hyper;
  AdamTensor<T> t{};
  t.param = static_cast<T*>(s.param);
  t.grad = static_cast<const T*>(s.grad);
  t.exp_avg = static_cast<T*>(s.exp_avg);
  t.exp_avg_sq = static_cast<T*>(s.exp_avg_sq);
  t.low_copy = s.low_copy;
  t.low_dtype = s.low_dtype;
  const double correction1 = 1.0 - std::pow(h.beta1, double(h.step));
  const double correction2 = 1.0 - std::pow(h.beta2, double(h.step));
  t.step_size = T(h.lr / correction1);
  t.sqrt_correction2 = T(std::sqrt(correction2));
  t.beta1 = T(h.beta1);
  t.beta2 = T(h.beta2);
  // 1 - beta in T, as the formula reads (T(1) - beta1), not 1 - beta rounded from double.
  t.one_minus_beta1 = T(1) - t.beta1;
  t.one_minus_beta2 = T(1) - t.beta2;
  t.eps = T(h.eps);
  t.weight_decay = T(h.weight_decay);
  t.decay = T(1.0 - h.lr * h.weight_decay);
  t.mode = h.decoupled_weight_decay ? DecayMode::Decoupled
                                    : (h.weight_decay != 0 ? DecayMode::L2 : DecayMode::None);
  return t;
}

// p' = decoupled ? p*decay : p; g' = L2 ? g + wd*p : g; m = beta1*m + (1-beta1)*g';
// v = beta2*v + (1-beta2)*g'*g'; p = p' - step_size*m / (sqrt(v)/sqrt(correction2) + eps).
template <typename T, DecayMode kMode>
inline void adam_element(const AdamTensor<T>& t, int64_t i) {
  T g = t.grad[i];
  T p = t.param[i];
  if constexpr (kMode == DecayMode::Decoupled) p *= t.decay;
  if constexpr (kMode == DecayMode::L2) g += t.weight_decay * p;
  const T m = t.beta1 * t.exp_avg[i] + t.one_minus_beta1 * g;
  const T v = t.beta2 * t.exp_avg_sq[i] + t.one_minus_beta2 * g * g;
  t.exp_avg[i] = m;
  t.exp_avg_sq[i] = v;
  t.param[i] = p - t.step_size * m / (std::sqrt(v) / t.sqrt_correction2 + t.eps);
}

#if defined(__SSE2__)
// The SSE2 registers of T, with the operations adam_element uses.
template <typename T>
struct Sse;
template <>
struct Sse<float> {
  using V = __m128;
  static constexpr int kLanes = 4;
  static V set1(float x) { return _mm_set1_ps(x); }
  static V load(const float* p) { return _mm_loadu_ps(p); }
  static void store(float* p, V x) { _mm_storeu_ps(p, x); }
  static V add(V a, V b) { return _mm_add_ps(a, b); }
  static V sub(V a, V b) { return _mm_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm_mul_ps(a, b); }
  static V div(V a, V b) { return _mm_div_ps(a, b); }
  static V sqrt(V a) { return _mm_sqrt_ps(a); }
};
template <>
struct Sse<double> {
  using V = __m128d;
  static constexpr int kLanes = 2;
  static V set1(double x) { return _mm_set1_pd(x); }
  static V load(const double* p) { return _mm_loadu_pd(p); }
  static void store(double* p, V x) { _mm_storeu_pd(p, x); }
  static V add(V a, V b) { return _mm_add_pd(a, b); }
  static V sub(V a, V b) { return _mm_sub_pd(a, b); }
  static V mul(V a, V b) { return _mm_mul_pd(a, b); }
  static V div(V a, V b) { return _mm_div_pd(a, b); }
  static V sqrt(V a) { return _mm_sqrt_pd(a); }
};
#endif

template <typename T, DecayMode kMode>
void adam_range(const AdamTensor<T>& t, int64_t begin, int64_t end) {
  int64_t i = begin;
#if defined(__SSE2__)
  // adam_element, lane by lane: the same operations in the same order.
  using S = Sse<T>;
  using V = typename S::V;
  const V beta1 = S::set1(t.beta1), beta2 = S::set1(t.beta2);
  const V one_minus_beta1 = S::set1(t.one_minus_beta1),
          one_minus_beta2 = S::set1(t.one_minus_beta2);
  const V step_size = S::set1(t.step_size), sqrt_correction2 = S::set1(t.sqrt_correction2);
  const V eps = S::set1(t.eps), weight_decay = S::set1(t.weight_decay), decay = S::set1(t.decay);
  for (; i + S::kLanes <= end; i += S::kLanes) {
    V g = S::load(t.grad + i);
    V p = S::load(t.param + i);
    if constexpr (kMode == DecayMode::Decoupled) p = S::mul(p, decay);
    if constexpr (kMode == DecayMode::L2) g = S::add(g, S::mul(weight_decay, p));
    const V m = S::add(S::mul(beta1, S::load(t.exp_avg + i)), S::mul(one_minus_beta1, g));
    const V v =
        S::add(S::mul(beta2, S::load(t.exp_avg_sq + i)), S::mul(S::mul(one_minus_beta2, g), g));
    S::store(t.exp_avg + i, m);
    S::store(t.exp_avg_sq + i, v);
    const V denominator = S::add(S::div(S::sqrt(v), sqrt_correction2), eps);
    S::store(t.param + i, S::sub(p, S::div(S::mul(step_size, m), denominator)));
  }
#endif
  for (; i < end; ++i) adam_element<T, kMode>(t, i);
}

template <typename T>
void adam_multi(int64_t count, const AdamSlot* slots) {
  std::vector<AdamTensor<T>> tensors;
  tensors.reserve(size_t(count));
  for (int64_t k = 0; k < count; ++k) tensors.push_back(adam_tensor<T>(slots[k]));
  for_each_piece(end_to_end_offsets(count, slots), [&](size_t k, int64_t begin, int64_t end) {
    const AdamTensor<T>& t = tensors[k];
    switch (t.mode) {
      case DecayMode::None:
        adam_range<T, DecayMode::None>(t, begin, end);
        break;
      case DecayMode::L2:
        adam_range<T, DecayMode::L2>(t, begin, end);
        break;
      case DecayMode::Decoupled:
        adam_range<T, DecayMode::Decoupled>(t, begin, end);
        break;
    }
    write_low_copy(t.param, t.low_copy, t.low_dtype, begin, end);
  });
}

// Validation happens before the parallel region: nothing may throw inside it.
template <typename Slot>
void check_slots(const char* kernel, DType dtype, int64_t count, const Slot* slots) {
  if (count < 0) throw_invalid(kernel, "negative tensor count " + std::to_string(count));
  if (count > 0 && slots == nullptr) throw_invalid(kernel, "null slot list");
  for (int64_t k = 0; k < count; ++k) {
    const Slot& s = slots[k];
    if (s.numel < 0) throw_invalid(kernel, "negative numel in slot " + std::to_string(k));
    if (s.low_copy != nullptr && (dtype != DType::Float32 || (s.low_dtype != DType::BFloat16 &&
                                                              s.low_dtype != DType::Float16))) {
      throw_invalid(kernel, "slot " + std::to_string(k) +
                                " has a 16-bit copy, which needs float32 parameters and a bfloat16 "
                                "or float16 copy");
    }
  }
}

}  // namespace

void sgd_step_multi(DType dtype, int64_t count, const SgdSlot* slots) {
  check_slots("sgd_step_multi", dtype, count, slots);
  for (int64_t k = 0; k < count; ++k) {
    const SgdSlot& s = slots[k];
    if (s.hyper.momentum != 0 && s.momentum_buffer == nullptr && s.numel > 0) {
      throw_invalid("sgd_step_multi",
                    "slot " + std::to_string(k) + " has momentum but no momentum buffer");
    }
  }
  switch (dtype) {
    case DType::Float32:
      return sgd_multi<float>(count, slots);
    case DType::Float64:
      return sgd_multi<double>(count, slots);
    default:
      throw_unsupported("sgd_step_multi", "", dtype);
  }
}

void adam_step_multi(DType dtype, int64_t count, const AdamSlot* slots) {
  check_slots("adam_step_multi", dtype, count, slots);
  switch (dtype) {
    case DType::Float32:
      return adam_multi<float>(count, slots);
    case DType::Float64:
      return adam_multi<double>(count, slots);
    default:
      throw_unsupported("adam_step_multi", "", dtype);
  }
}

}  // namespace mpigrad::kernels::cpu
