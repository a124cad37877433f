#include "mpigrad/core/crc32c.h"

#include <boost/crc.hpp>

namespace mpigrad::core {

namespace {

uint32_t reflect(uint32_t value) {
  uint32_t reflected = 0;
  for (int bit = 0; bit < 32; ++bit) {
    if ((value >> bit) & 1u) reflected |= 1u << (31 - bit);
  }
  return reflected;
}

}  // namespace

uint32_t crc32c(const void* data, size_t size, uint32_t crc) {
  // Castagnoli polynomial, reflected in and out. A CRC continues from an earlier one by starting
  // the register where that one ended: the earlier CRC without its final xor (all ones), given
  // in the unreflected form Boost takes an initial remainder in.
  boost::crc_optimal<32, 0x1EDC6F41, 0, 0, true, true> raw(reflect(~crc));
  raw.process_bytes(data, size);
  return ~raw.checksum();
}

}  // namespace mpigrad::core
