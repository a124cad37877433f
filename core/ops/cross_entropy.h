// The fused classification loss over rows: logits [rows, C] and Int64 targets [rows], with one
// kernel computing every row's loss and gradient (kernels/cross_entropy.h) instead of
// log_softmax, a gather and their backward. nn::cross_entropy uses it for every device.
// Targets equal to ignore_index count for nothing (and not in the mean's count). A target
// outside [0, C) is the core::Error of bad_target_message (core/target_check.h) naming `check`: at
// once on the CPU; on a GPU the kernel checks the targets without the host waiting for them, and
// the error comes at a later synchronization (core/device_checks.h), so a training step on the
// GPU never copies its labels back. The mean's count of counted rows is computed on the device
// too. Gradients flow to the logits only; the loss has the logits' dtype.
#pragma once

#include <cstdint>

#include "mpigrad/core/target_check.h"
#include "mpigrad/core/tensor.h"

namespace mpigrad::core {

enum class RowLossReduction { Mean, Sum, None };

Tensor cross_entropy_rows(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                          RowLossReduction reduction, const TargetCheck& check = {});

}  // namespace mpigrad::core
