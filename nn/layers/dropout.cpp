#include "mpigrad/nn/layers/dropout.h"

#include <sstream>

#include "mpigrad/nn/functional/dropout.h"

namespace mpigrad::nn {

Dropout::Dropout(double p, std::shared_ptr<core::Generator> generator, uint64_t seed)
    : p_(p),
      generator_(generator ? std::move(generator) : std::make_shared<core::Generator>(seed)) {
  MPIGRAD_CHECK(p >= 0.0 && p <= 1.0, "Dropout: probability must be in [0, 1], got ", p);
  register_generator("generator", generator_);
}

Tensor Dropout::forward(const Tensor& input) {
  return functional::dropout(input, p_, is_training(), *generator_);
}

std::string Dropout::extra_repr() const {
  std::ostringstream out;
  out << "p=" << p_ << ", inplace=False";
  return out.str();
}

}  // namespace mpigrad::nn
