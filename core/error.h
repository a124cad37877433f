// Errors: one exception type for everything mpigrad reports, and the checks that raise it.
//
// Every message says what was wrong and where (the op, the shapes, the file or the field), so a
// user reading one line of a 64-rank job log knows what to fix. The launch layer prefixes the
// rank when it reports an exception; code below it does not know ranks.
#pragma once

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>

namespace mpigrad::core {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An allocation that failed, with the bytes asked for. Tensor::empty raises it in place of a
// bare std::bad_alloc; callers that know what the memory was for (a batch of a file's field, a
// model's layer) catch it and raise an Error that names that too.
class AllocationError : public Error {
 public:
  AllocationError(const std::string& message, int64_t bytes) : Error(message), bytes_(bytes) {}
  int64_t bytes() const { return bytes_; }

 private:
  int64_t bytes_;
};

namespace detail {
template <typename... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}
}  // namespace detail

// Throws Error with the parts streamed together: fail("matmul: ", a.shape(), " vs ", b.shape()).
template <typename... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  throw Error(detail::concat(parts...));
}

}  // namespace mpigrad::core

// Checks a condition that depends on user input; on failure throws core::Error with the message.
#define MPIGRAD_CHECK(condition, ...)     \
  do {                                    \
    if (!(condition)) [[unlikely]]        \
      ::mpigrad::core::fail(__VA_ARGS__); \
  } while (0)
