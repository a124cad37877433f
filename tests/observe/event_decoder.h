// Decodes tensorflow.Event messages for the tests, independently of the library's encoder: a
// protobuf wire-format reader that knows Event { wall_time = 1 (double), step = 2 (int64),
// file_version = 3 (string), summary = 5 } and Summary { value = 1 } and Value { tag = 1,
// simple_value = 2 (float) }, skips any other field by its wire type, and throws
// std::runtime_error on malformed input.
#pragma once

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace mpigrad::test {

struct DecodedEvent {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;
  std::vector<std::pair<std::string, float>> values;  // (tag, simple_value)
};

class WireReader {
 public:
  explicit WireReader(std::string_view bytes) : bytes_(bytes) {}
  bool done() const { return at_ >= bytes_.size(); }

  uint64_t varint() {
    uint64_t value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (done()) throw std::runtime_error("protobuf: truncated varint");
      const uint8_t byte = uint8_t(bytes_[at_++]);
      value |= uint64_t(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) return value;
    }
    throw std::runtime_error("protobuf: varint longer than ten bytes");
  }
  uint64_t fixed(int count) {
    if (bytes_.size() - at_ < size_t(count)) throw std::runtime_error("protobuf: truncated fixed");
    uint64_t value = 0;
    for (int i = 0; i < count; ++i) value |= uint64_t(uint8_t(bytes_[at_++])) << (8 * i);
    return value;
  }
  std::string_view bytes() {
    const uint64_t length = varint();
    if (bytes_.size() - at_ < length) throw std::runtime_error("protobuf: truncated bytes");
    std::string_view out = bytes_.substr(at_, length);
    at_ += length;
    return out;
  }
  void skip(uint32_t wire_type) {
    switch (wire_type) {
      case 0:
        varint();
        break;
      case 1:
        fixed(8);
        break;
      case 2:
        bytes();
        break;
      case 5:
        fixed(4);
        break;
      default:
        throw std::runtime_error("protobuf: unknown wire type " + std::to_string(wire_type));
    }
  }

 private:
  std::string_view bytes_;
  size_t at_ = 0;
};

inline DecodedEvent decode_event(std::string_view payload) {
  DecodedEvent event;
  WireReader event_reader(payload);
  while (!event_reader.done()) {
    const uint64_t tag = event_reader.varint();
    const uint32_t field = uint32_t(tag >> 3), wire = uint32_t(tag & 7);
    if (field == 1 && wire == 1) {
      const uint64_t bits = event_reader.fixed(8);
      std::memcpy(&event.wall_time, &bits, 8);
    } else if (field == 2 && wire == 0) {
      event.step = static_cast<int64_t>(event_reader.varint());
    } else if (field == 3 && wire == 2) {
      event.file_version = std::string(event_reader.bytes());
    } else if (field == 5 && wire == 2) {
      WireReader summary(event_reader.bytes());
      while (!summary.done()) {
        const uint64_t summary_tag = summary.varint();
        if (summary_tag != ((1u << 3) | 2u)) {
          summary.skip(uint32_t(summary_tag & 7));
          continue;
        }
        WireReader value(summary.bytes());
        std::string name;
        float simple = 0;
        while (!value.done()) {
          const uint64_t value_tag = value.varint();
          if (value_tag == ((1u << 3) | 2u)) {
            name = std::string(value.bytes());
          } else if (value_tag == ((2u << 3) | 5u)) {
            const uint32_t bits = uint32_t(value.fixed(4));
            std::memcpy(&simple, &bits, 4);
          } else {
            value.skip(uint32_t(value_tag & 7));
          }
        }
        event.values.emplace_back(std::move(name), simple);
      }
    } else {
      event_reader.skip(wire);
    }
  }
  return event;
}

}  // namespace mpigrad::test
