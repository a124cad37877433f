#include "mpigrad/core/rng.h"

#include "mpigrad/core/backend.h"
#include "mpigrad/core/ops/op_support.h"
#include "mpigrad/kernels/random.h"

namespace mpigrad::core {

namespace {

// Random values go into a dense buffer, so a non-contiguous target is filled through a copy.
template <typename Fill>
Tensor& fill_random(Tensor& tensor, const char* op, Fill fill) {
  MPIGRAD_CHECK(tensor.defined(), op, ": undefined tensor");
  check_inplace(tensor, op);
  NoGradGuard no_grad;
  if (tensor.is_contiguous()) {
    fill(tensor);
  } else {
    Tensor dense = detail::empty_on(tensor.shape(), tensor.dtype(), tensor.device());
    fill(dense);
    tensor.copy_(dense);
  }
  tensor.storage()->bump_version();
  return tensor;
}

}  // namespace

Tensor& uniform_(Tensor& tensor, double lo, double hi, Generator& generator) {
  detail::check_floating("uniform_", tensor);
  return fill_random(tensor, "uniform_", [&](Tensor& dense) {
    uint64_t offset = generator.reserve(uint64_t(dense.numel()) * kernels::kWordsPerUniform);
    backend_for(dense.device())
        .uniform(dense.dtype(), dense.numel(), dense.data_ptr(), generator.seed(), offset, lo, hi);
  });
}

Tensor& normal_(Tensor& tensor, double mean, double std, Generator& generator) {
  detail::check_floating("normal_", tensor);
  MPIGRAD_CHECK(std >= 0, "normal_: std must be non-negative, got ", std);
  return fill_random(tensor, "normal_", [&](Tensor& dense) {
    uint64_t offset = generator.reserve(uint64_t(dense.numel()) * kernels::kWordsPerNormal);
    backend_for(dense.device())
        .normal(dense.dtype(), dense.numel(), dense.data_ptr(), generator.seed(), offset, mean,
                std);
  });
}

Tensor rand(const Shape& shape, Generator& generator, TensorOptions options) {
  Tensor tensor = Tensor::empty(shape, options.requires_grad(false));
  uniform_(tensor, 0.0, 1.0, generator);
  if (options.requires_grad_) tensor.set_requires_grad(true);
  return tensor;
}

Tensor randn(const Shape& shape, Generator& generator, TensorOptions options) {
  Tensor tensor = Tensor::empty(shape, options.requires_grad(false));
  normal_(tensor, 0.0, 1.0, generator);
  if (options.requires_grad_) tensor.set_requires_grad(true);
  return tensor;
}

Tensor bernoulli(const Shape& shape, double p, Generator& generator, TensorOptions options) {
  MPIGRAD_CHECK(p >= 0.0 && p <= 1.0, "bernoulli: p must be in [0, 1], got ", p);
  Tensor tensor = Tensor::empty(shape, options.requires_grad(false));
  uint64_t offset = generator.reserve(uint64_t(tensor.numel()) * kernels::kWordsPerUniform);
  backend_for(tensor.device())
      .bernoulli(tensor.dtype(), tensor.numel(), tensor.data_ptr(), generator.seed(), offset, p);
  return tensor;
}

}  // namespace mpigrad::core
