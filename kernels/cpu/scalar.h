// Internal to kernels/cpu: what every CPU kernel family shares beyond kernels/scalar.h (the
// conversions, wrapping arithmetic and NaN tests the CUDA kernels share too): the
// std::invalid_argument every kernel throws for a dtype it does not support or an argument it
// cannot take, named "mpigrad::kernels::cpu::<kernel>".
#pragma once

#include <string>

#include "mpigrad/kernels/dtype.h"
#include "mpigrad/kernels/scalar.h"
#include "mpigrad/kernels/unsupported.h"

namespace mpigrad::kernels::cpu {

[[noreturn]] inline void throw_unsupported(const char* kernel, const std::string& what,
                                           DType dtype) {
  kernels::throw_unsupported("cpu", kernel, what, dtype);
}

[[noreturn]] inline void throw_invalid(const char* kernel, const std::string& what) {
  kernels::throw_invalid("cpu", kernel, what);
}

}  // namespace mpigrad::kernels::cpu
