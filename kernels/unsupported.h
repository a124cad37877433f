// The one error the kernels raise themselves: a dtype or option a kernel does not implement.
// core/ checks its inputs first, so this is a backstop; it names the backend and the kernel.
#pragma once

#include <stdexcept>
#include <string>

#include "mpigrad/kernels/dtype.h"

namespace mpigrad::kernels {

// Throws std::invalid_argument "mpigrad::kernels::<backend>::<kernel>: <what> is not supported
// for dtype X", or "...: dtype X is not supported" when `what` is empty.
[[noreturn]] inline void throw_unsupported(const char* backend, const char* kernel,
                                           const std::string& what, DType dtype) {
  std::string message = std::string("mpigrad::kernels::") + backend + "::" + kernel + ": ";
  if (what.empty()) {
    message += "dtype " + std::string(dtype_name(dtype)) + " is not supported";
  } else {
    message += what + " is not supported for dtype " + std::string(dtype_name(dtype));
  }
  throw std::invalid_argument(message);
}

}  // namespace mpigrad::kernels
