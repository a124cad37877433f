// Random numbers come from an explicitly seeded, counter-based Philox 4x32-10 stream
// (kernels/philox.h). A Generator is just (seed, offset): every call consumes a known number of
// stream words and advances the offset, so a run can be reproduced or resumed from those two
// integers, and the CPU and CUDA kernels produce bit-identical values for the same state.
// There is no hidden global generator: pass one explicitly.
#pragma once

#include <cstdint>

#include "mpigrad/core/tensor.h"

namespace mpigrad::core {

class Generator {
 public:
  explicit Generator(uint64_t seed = 0, uint64_t offset = 0) : seed_(seed), offset_(offset) {}

  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }
  void set_state(uint64_t seed, uint64_t offset) {
    seed_ = seed;
    offset_ = offset;
  }
  // Returns the current offset and advances it by `words`.
  uint64_t reserve(uint64_t words) {
    uint64_t start = offset_;
    offset_ += words;
    return start;
  }

 private:
  uint64_t seed_;
  uint64_t offset_;
};

// Uniform on [0, 1).
Tensor rand(const Shape& shape, Generator& generator, TensorOptions options = {});
// Standard normal.
Tensor randn(const Shape& shape, Generator& generator, TensorOptions options = {});
// Fill in place (no autograd), like torch.nn.init.
Tensor& uniform_(Tensor& tensor, double lo, double hi, Generator& generator);
Tensor& normal_(Tensor& tensor, double mean, double std, Generator& generator);
// 1 with probability p, else 0, in options.dtype.
Tensor bernoulli(const Shape& shape, double p, Generator& generator, TensorOptions options = {});

}  // namespace mpigrad::core
