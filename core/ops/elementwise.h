// Elementwise ops with NumPy broadcasting over tensors of any strides. Binary ops compute in the
// promoted dtype of their operands (a Python-style scalar takes the tensor's dtype). Gradients
// that flow into a broadcast operand are summed back to its shape.
#pragma once

#include "mpigrad/core/tensor.h"

namespace mpigrad::core {

Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);  // gradient goes to the larger (ties split)
Tensor minimum(const Tensor& a, const Tensor& b);

Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor sign(const Tensor& x);
Tensor relu(const Tensor& x);
enum class GeluApproximation { None, Tanh };  // torch's approximate="none" | "tanh"
Tensor gelu(const Tensor& x, GeluApproximation approximation = GeluApproximation::None);
Tensor silu(const Tensor& x);
Tensor sigmoid(const Tensor& x);
// log(1 + e^x), in one kernel; its derivative is sigmoid(x).
Tensor softplus(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor erf(const Tensor& x);
Tensor sin(const Tensor& x);
Tensor cos(const Tensor& x);
Tensor pow(const Tensor& x, double exponent);
// x ** exponent elementwise (broadcast); the exponent's gradient is out * log(x).
Tensor pow(const Tensor& x, const Tensor& exponent);
Tensor clamp(const Tensor& x, double lo, double hi);  // gradient 0 where clamped

// cond (Bool) ? a : b, all three broadcast together.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);

// Comparisons give Bool tensors and are not differentiable.
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);

// A 0-d tensor holding `value` in the dtype and device of `like`, for tensor-scalar ops.
Tensor scalar_like(double value, const Tensor& like);

// Sums a gradient of a broadcast result back down to `shape` (the operand's shape).
Tensor sum_to(const Tensor& gradient, const Shape& shape);

inline Tensor operator+(const Tensor& a, const Tensor& b) {
  return add(a, b);
}
inline Tensor operator-(const Tensor& a, const Tensor& b) {
  return sub(a, b);
}
inline Tensor operator*(const Tensor& a, const Tensor& b) {
  return mul(a, b);
}
inline Tensor operator/(const Tensor& a, const Tensor& b) {
  return div(a, b);
}
inline Tensor operator-(const Tensor& x) {
  return neg(x);
}
inline Tensor operator+(const Tensor& a, double b) {
  return add(a, scalar_like(b, a));
}
inline Tensor operator-(const Tensor& a, double b) {
  return sub(a, scalar_like(b, a));
}
inline Tensor operator*(const Tensor& a, double b) {
  return mul(a, scalar_like(b, a));
}
inline Tensor operator/(const Tensor& a, double b) {
  return div(a, scalar_like(b, a));
}
inline Tensor operator+(double a, const Tensor& b) {
  return add(scalar_like(a, b), b);
}
inline Tensor operator-(double a, const Tensor& b) {
  return sub(scalar_like(a, b), b);
}
inline Tensor operator*(double a, const Tensor& b) {
  return mul(scalar_like(a, b), b);
}
inline Tensor operator/(double a, const Tensor& b) {
  return div(scalar_like(a, b), b);
}

}  // namespace mpigrad::core
