// CRC-32C (Castagnoli), the checksum of TensorBoard's TFRecord frames and of checkpoints' content.
// One implementation for both, Boost.CRC's (header-only; Debian packages no CRC32C library),
// kept out of this header so that users of mpigrad need no Boost.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mpigrad::core {

// The CRC-32C of `size` bytes at `data`, continuing from `crc`, the CRC of what came before (0
// to start): crc32c(b, crc32c(a)) is the CRC of a followed by b. crc32c("123456789", 9) is
// 0xE3069283, the standard check value.
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);

}  // namespace mpigrad::core
