// Mixed precision for training: the [train] precision a run asks for, and what it means.
//
// fp32 trains as before. bf16 and fp16 turn on core's autocast (core/autocast.h) around every
// forward: matmul, Linear and conv2d read their operands in 16 bits and sum in fp32, everything
// else stays float32, and the parameters (the master weights), their gradients and the optimizer
// state stay float32. fp16's narrow range needs loss scaling (nn/optim/grad_scaler.h); bf16 has
// fp32's range and does not.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "mpigrad/core/device.h"
#include "mpigrad/core/dtype.h"
#include "mpigrad/core/enum_names.h"

namespace mpigrad::nn {

enum class Precision : uint8_t { Float32, BFloat16, Float16 };
inline constexpr core::EnumName<Precision> kPrecisionNames[] = {
    {Precision::Float32, "fp32"}, {Precision::BFloat16, "bf16"}, {Precision::Float16, "fp16"}};

// The dtype autocast computes in under `precision`: nullopt for fp32 (autocast off).
std::optional<core::DType> autocast_dtype_of(Precision precision);

// One line for the run's log: the precision, and the kernels the 16-bit products run on for
// `device` ("bf16: matmul and conv2d in bfloat16 through oneDNN matmul, AVX512-BF16; ...").
std::string describe_precision(Precision precision, core::Device device);

}  // namespace mpigrad::nn
