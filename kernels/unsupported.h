// The errors the kernels raise themselves: a dtype or option a kernel does not implement, and an
// argument it cannot take (a negative size, a leading dimension too small). core/ checks its
// inputs first, so these are backstops; each names the backend and the kernel.
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

// Throws std::invalid_argument "mpigrad::kernels::<backend>::<kernel>: <what>".
[[noreturn]] inline void throw_invalid(const char* backend, const char* kernel,
                                       const std::string& what) {
  throw std::invalid_argument(std::string("mpigrad::kernels::") + backend + "::" + kernel + ": " +
                              what);
}

}  // namespace mpigrad::kernels
