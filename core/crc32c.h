// CRC-32C (Castagnoli), the checksum of TensorBoard's TFRecord frames and of checkpoints' content.
// One function for both. It runs the CPU's crc32 instruction where there is one (x86-64 with
// SSE4.2, ARMv8 with the CRC extension; decided once, at run time), three streams side by side
// and joined, and Boost.CRC's byte table elsewhere (kept out of this header so that users of
// mpigrad need no Boost). Both give the same bits.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mpigrad::core {

// The CRC-32C of `size` bytes at `data`, continuing from `crc`, the CRC of what came before (0
// to start): crc32c(b, crc32c(a)) is the CRC of a followed by b. crc32c("123456789", 9) is
// 0xE3069283, the standard check value.
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);

namespace detail {
// The table version alone, and whether crc32c uses the instruction: for tests and benchmarks.
uint32_t crc32c_portable(const void* data, size_t size, uint32_t crc = 0);
bool crc32c_in_hardware();
}  // namespace detail

}  // namespace mpigrad::core
