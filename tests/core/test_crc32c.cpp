// core::crc32c: the standard check value, and continuing a CRC over pieces.
#include <doctest/doctest.h>

#include <string>

#include "mpigrad/core/crc32c.h"

using mpigrad::core::crc32c;

TEST_CASE("crc32c gives the standard check value and continues over pieces") {
  const std::string text = "123456789";
  CHECK(crc32c(text.data(), text.size()) == 0xE3069283u);
  CHECK(crc32c(text.data(), 0) == 0u);
  const std::string zeros(32, '\0');
  CHECK(crc32c(zeros.data(), zeros.size()) == 0x8A9136AAu);
  const uint32_t first = crc32c(text.data(), 4);
  CHECK(crc32c(text.data() + 4, text.size() - 4, first) == 0xE3069283u);
}
