// core::crc32c: the standard check value, and continuing a CRC over pieces.
#include <doctest/doctest.h>

#include <string>
#include <vector>

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

TEST_CASE("crc32c in hardware gives the table's bits at every length, offset and continuation") {
  using mpigrad::core::detail::crc32c_portable;
  INFO("hardware: ", mpigrad::core::detail::crc32c_in_hardware());
  // Long enough for several rounds of three 8 KiB streams, and tails of every length.
  std::vector<unsigned char> data(3 * 3 * 8192 + 123);
  uint64_t state = 12345;
  for (auto& byte : data) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    byte = static_cast<unsigned char>(state >> 56);
  }
  for (size_t offset : {0, 1, 3, 7}) {
    for (size_t length :
         {size_t(0), size_t(1), size_t(7), size_t(8), size_t(9), size_t(63), size_t(4096),
          size_t(3 * 8192 - 1), size_t(3 * 8192), size_t(3 * 8192 + 5), data.size() - offset}) {
      if (offset + length > data.size()) continue;
      INFO("offset ", offset, ", length ", length);
      CHECK(crc32c(data.data() + offset, length) == crc32c_portable(data.data() + offset, length));
      // Continuing from a CRC joins the pieces, whatever the split.
      const size_t split = length / 3;
      const uint32_t head = crc32c(data.data() + offset, split, 77u);
      CHECK(crc32c(data.data() + offset + split, length - split, head) ==
            crc32c_portable(data.data() + offset, length, 77u));
    }
  }
}
