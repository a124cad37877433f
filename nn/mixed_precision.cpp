#include "mpigrad/nn/mixed_precision.h"

#include "mpigrad/core/autocast.h"

namespace mpigrad::nn {

std::optional<core::DType> autocast_dtype_of(Precision precision) {
  switch (precision) {
    case Precision::BFloat16:
      return core::kBFloat16;
    case Precision::Float16:
      return core::kFloat16;
    case Precision::Float32:
      break;
  }
  return std::nullopt;
}

std::string describe_precision(Precision precision, core::Device device) {
  const std::optional<core::DType> dtype = autocast_dtype_of(precision);
  if (!dtype) return "fp32 (no autocast)";
  return std::string(core::enum_name(precision, kPrecisionNames)) +
         ": matmul, linear and conv2d in " + core::dtype_name(*dtype) + " with fp32 sums (" +
         core::autocast_kernels(*dtype, device) +
         "); normalization, losses and the optimizer in float32, float32 master weights";
}

}  // namespace mpigrad::nn
