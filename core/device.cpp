#include "mpigrad/core/device.h"

#include <charconv>

#include "mpigrad/core/error.h"

namespace mpigrad::core {

Device Device::parse(std::string_view text) {
  if (text == "cpu") return kCPU;
  if (text == "cuda") return cuda(0);
  if (text.starts_with("cuda:")) {
    std::string_view digits = text.substr(5);
    int index = -1;
    auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
    if (error == std::errc() && end == digits.data() + digits.size() && index >= 0) {
      return cuda(index);
    }
  }
  fail("unknown device '", text, "': expected cpu, cuda or cuda:<index>");
}

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
}

std::ostream& operator<<(std::ostream& out, Device device) {
  return out << device.str();
}

}  // namespace mpigrad::core
