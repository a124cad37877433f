// Where a tensor's storage lives: the host, or one CUDA device by index.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>

namespace mpigrad::core {

enum class DeviceType : uint8_t { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;  // which GPU; always 0 for the CPU

  constexpr Device() = default;
  constexpr Device(DeviceType type_, int index_ = 0) : type(type_), index(index_) {}  // NOLINT
  // Parses "cpu", "cuda", "cuda:1"; throws core::Error on anything else.
  static Device parse(std::string_view text);

  constexpr bool is_cpu() const { return type == DeviceType::CPU; }
  constexpr bool is_cuda() const { return type == DeviceType::CUDA; }
  std::string str() const;  // "cpu" or "cuda:1"

  friend constexpr bool operator==(Device a, Device b) {
    return a.type == b.type && a.index == b.index;
  }
};

inline constexpr Device kCPU{DeviceType::CPU, 0};
constexpr Device cuda(int index = 0) {
  return Device{DeviceType::CUDA, index};
}

std::ostream& operator<<(std::ostream& out, Device device);

}  // namespace mpigrad::core
